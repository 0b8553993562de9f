"""Command line of the reference engine.

The engine prints marks on stderr that the harness parses for the cold start parts::

    perfkit-mark process_start t=<epoch s>
    perfkit-mark models_loaded t=<epoch s>
    perfkit-mark warmup_done t=<epoch s>
    perfkit-mark listening port=<port>
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger("perfkit.refengine")


#: ``--offload`` choices (refengine.placement.OFFLOAD_MODES; torch is imported later).
OFFLOAD_CHOICES = ("none", "model", "group-block", "group-leaf")


def mark(name: str, **fields) -> None:
    """Print a ``perfkit-mark`` line on stderr (flushed)."""
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"perfkit-mark {name} {extra}".rstrip(), file=sys.stderr, flush=True)


def _resolution(text: str) -> tuple[int, int]:
    try:
        h, w = text.lower().split("x")
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH, got {text!r}") from None


#: Values sglang reads as true for its boolean environment variables.
_TRUTHY = ("1", "true", "yes", "y", "t", "on")


def sglang_perf_log_dir(environ=None) -> str | None:
    """sglang's perf env: ``SGLANG_PERF_LOG_DIR`` when ``SGLANG_DIFFUSION_STAGE_LOGGING`` is true
    (``1``/``true``/``yes``/``on``, any case), else None."""
    env = os.environ if environ is None else environ
    if str(env.get("SGLANG_DIFFUSION_STAGE_LOGGING", "")).strip().lower() not in _TRUTHY:
        return None
    return env.get("SGLANG_PERF_LOG_DIR") or None


def _stage_delay(text: str) -> tuple[str, float]:
    """``STAGE=PCT`` (``DenoisingStage=30%`` or ``DenoisingStage=30``) -> (stage, percent)."""
    name, sep, pct = text.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        value = float(pct.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected STAGE=PCT (e.g. DenoisingStage=30%), got {text!r}"
        ) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"PCT must be >= 0, got {text!r}")
    return name.strip(), value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perfkit engine serve",
        description="perfkit reference engine: LTX-Video (diffusers) over HTTP "
        "(also: python -m perfkit.refengine)",
        epilog="Example: perfkit engine serve --preset tiny --port 8000. Exit codes: 0 stopped "
        "cleanly, 2 bad arguments or a refused configuration (unknown preset, an accelerator "
        "offload mode on a CPU device), other non-zero: the engine failed.",
    )
    p.add_argument("--preset", default="tiny", help="model preset: tiny | ltx-2b (default tiny)")
    p.add_argument("--model-path", default=None, help="local diffusers-format checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed as a mark)")
    p.add_argument(
        "--perf-log-dir",
        default=None,
        help="append performance.log here (default: $SGLANG_PERF_LOG_DIR when "
        "$SGLANG_DIFFUSION_STAGE_LOGGING is true, as sglang's server does)",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument(
        "--compile",
        "--enable-torch-compile",
        action="store_true",
        help="torch.compile the transformer (dynamic=False)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend: inductor | aot_eager | eager | cudagraphs",
    )
    p.add_argument("--compile-vae", action="store_true", help="also compile the VAE decoder")
    p.add_argument("--recompile-limit", type=int, default=None, help="torch._dynamo recompile limit")
    p.add_argument("--two-stage", action="store_true", help="half-res pass + UpsampleStage + RefinementStage")
    p.add_argument(
        "--refine-steps", type=int, default=2, help="RefinementStage steps of the two-stage pipeline"
    )
    p.add_argument(
        "--warmup-frames",
        "--warmup-num-frames",
        type=int,
        default=17,
        help="startup warmup frames (0 disables)",
    )
    p.add_argument(
        "--warmup-mode",
        choices=["off", "server"],
        default=None,
        help="sglang's flag: off disables the startup warmup, server keeps it",
    )
    p.add_argument(
        "--warmup-steps", type=int, default=2, help="denoising steps of the startup warmup (sglang: 2)"
    )
    p.add_argument("--warmup-resolution", type=_resolution, default=None, help="HEIGHTxWIDTH")
    p.add_argument("--height", type=int, default=None, help="serving default height (px)")
    p.add_argument("--width", type=int, default=None, help="serving default width (px)")
    p.add_argument("--steps", type=int, default=None, help="serving default num_inference_steps")
    p.add_argument(
        "--max-frames", type=int, default=257, help="requests with more frames get a 400 (default 257)"
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=1,
        help="N > 1: CFG parallel over N ranks with torch.distributed (NCCL on cuda:0..N-1, gloo "
        "on the CPU); rank 0 serves HTTP and spawns the others (see refengine.dist)",
    )
    p.add_argument(
        "--multi-gpu-warmup-frames",
        type=int,
        default=None,
        help="startup warmup frames for --two-stage with --num-gpus > 1 instead of --warmup-frames "
        "(sglang uses 25 there: a 24-frame request aligns to 25 = 4 latent frames, a 17-frame "
        "warmup covers 3); default: --warmup-frames",
    )
    p.add_argument(
        "--dist-init",
        default=None,
        help="tcp://HOST:PORT of rank 0's rendezvous store (default: 127.0.0.1, a free port)",
    )
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # set by rank 0 for the others
    p.add_argument("--world-size", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--placement",
        default=None,
        choices=["device", "group_offload"],
        help="force a placement instead of deciding from the cap (older flag; ignored on a CPU "
        "device; see --offload)",
    )
    p.add_argument(
        "--offload",
        default=None,
        choices=OFFLOAD_CHOICES,
        help="offload mode of every component: none (resident), model (whole component moved in "
        "and out, accelerate's cpu_offload_with_hook), group-block / group-leaf (diffusers' "
        "apply_group_offloading at block / leaf level, CUDA stream prefetch). Default: none, "
        "unless the device cap forces group-leaf offload: the text encoder first, then the "
        "transformer, until the resident rest fits. "
        "Modes other than none need an accelerator: on a CPU device the engine exits with code 2",
    )
    for comp in ("transformer", "text-encoder", "vae"):
        p.add_argument(
            f"--offload-{comp}",
            default=None,
            choices=OFFLOAD_CHOICES,
            help=f"offload mode of the {comp.replace('-', ' ')} (overrides --offload for it"
            + ("; the two-stage upsampler follows it)" if comp == "vae" else ")"),
        )
    p.add_argument("--keep-outputs", action="store_true", help="save generated frames as .npy")
    p.add_argument("--debug-leak-mib", type=int, default=0, help="TEST ONLY: leak this many MiB per request")
    p.add_argument(
        "--memory-snapshot-after",
        default="",
        metavar="I,J",
        help="CUDA: record allocation history and dump an allocator snapshot after these 0-based "
        "measured requests (0: the cold request), into --memory-snapshot-dir; on CPU the records "
        "say 'not available on cpu'",
    )
    p.add_argument(
        "--memory-snapshot-entries",
        type=int,
        default=20000,
        help="trace entries the allocation history keeps (bounds each snapshot's size)",
    )
    p.add_argument(
        "--memory-snapshot-dir",
        default=None,
        help="where request-<index>.pickle snapshots go (default: <perf-log-dir>/memory_snapshots)",
    )
    p.add_argument(
        "--debug-stage-delay",
        action="append",
        type=_stage_delay,
        default=[],
        metavar="STAGE=PCT",
        help="TEST ONLY: slow STAGE down by PCT %% of its own work (e.g. DenoisingStage=30%%): busy "
        "compute on the device inside the stage's span (per denoising step for DenoisingStage and "
        "RefinementStage), on measured requests only, never the startup warmup; repeatable",
    )
    p.add_argument(
        "--debug-stage-delay-from",
        type=int,
        default=0,
        metavar="N",
        help="TEST ONLY: apply --debug-stage-delay from the N-th measured request on (0-based; "
        "0: every request, 1: warm requests only)",
    )
    p.add_argument("--log-level", default="INFO", help="logging level: DEBUG | INFO | WARNING | ERROR")
    return p


def main(argv: list[str] | None = None, t0: float | None = None) -> int:
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    rank = args.rank or 0  # > 0: a CFG-parallel rank spawned by rank 0 (no HTTP, no marks)
    if args.perf_log_dir is None:
        args.perf_log_dir = sglang_perf_log_dir()
    if args.warmup_mode == "off":
        args.warmup_frames = 0
    if rank == 0:
        mark("process_start", t=f"{t0 or time.time():.6f}")
    who = f"[rank{rank}] " if args.num_gpus > 1 else ""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s",
    )
    if args.num_gpus < 1:
        print(f"error: --num-gpus must be >= 1, got {args.num_gpus}", file=sys.stderr)
        return 2
    if args.rank is not None and not (
        0 <= args.rank < args.num_gpus and args.world_size == args.num_gpus and args.dist_init
    ):
        print(
            "error: --rank needs 0 <= rank < --num-gpus, --world-size == --num-gpus and --dist-init",
            file=sys.stderr,
        )
        return 2
    for name in ("warmup_frames", "max_frames", "debug_leak_mib", "debug_stage_delay_from"):
        if getattr(args, name) < 0:
            print(f"error: --{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    from perfkit.refengine.memhistory import parse_indices

    try:
        snapshot_after = parse_indices(args.memory_snapshot_after)
    except ValueError as exc:
        print(f"error: --memory-snapshot-after: {exc}", file=sys.stderr)
        return 2
    if args.memory_snapshot_entries < 1:
        print("error: --memory-snapshot-entries must be >= 1", file=sys.stderr)
        return 2

    import torch
    import uvicorn

    from perfkit.common.provenance import git_commit
    from perfkit.refengine import models, placement
    from perfkit.refengine.compile_watch import CompileWatch
    from perfkit.refengine.pipeline import GenRequest, StagedPipeline
    from perfkit.refengine.server import Engine, create_app

    if args.preset not in models.PRESETS and not args.model_path:
        print(f"error: unknown --preset {args.preset!r}; known: {', '.join(models.PRESETS)}", file=sys.stderr)
        return 2
    dev_name = args.device
    if dev_name == "auto":
        dev_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev_name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    from perfkit.refengine.memhistory import SnapshotRecorder

    # started before the models load, so the weights' blocks carry their allocation stacks too
    recorder = SnapshotRecorder(
        device,
        snapshot_after if rank == 0 else [],
        Path(args.memory_snapshot_dir or f"{args.perf_log_dir or '.'}/memory_snapshots"),
        args.memory_snapshot_entries,
    )
    recorder.start()
    if args.num_gpus > 1:
        from perfkit.refengine import dist

        try:
            device = dist.rank_device(device, rank, args.num_gpus)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if device.type == "cpu" and not os.environ.get("PERFKIT_TORCH_THREADS"):
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.num_gpus))  # ranks share the cores
        if device.type == "cuda":
            # before building: the seeded init draws on the current device (not GPU 0 on every rank)
            torch.cuda.set_device(device)
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # read at NCCL communicator init
    per_component = {
        "transformer": args.offload_transformer,
        "text_encoder": args.offload_text_encoder,
        "vae": args.offload_vae,
    }
    asked = args.offload is not None or any(v is not None for v in per_component.values())
    if asked and args.placement is not None:
        print("error: give either --placement or --offload/--offload-<component>, not both", file=sys.stderr)
        return 2
    legacy = args.placement if device.type == "cuda" else None  # the older flag: ignored on the CPU
    requested = placement.requested_modes(args.offload, per_component, legacy=legacy)
    try:
        placement.check_applicable(requested, device)
    except placement.OffloadNotApplicable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    preset = models.PRESETS.get(args.preset, models.PRESETS["tiny"])
    if args.dtype == "auto":
        dtype = getattr(torch, preset.dtype) if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, args.dtype)
    if args.recompile_limit is not None:
        import torch._dynamo

        # this override is thread-local (a ContextVar in torch >= 2.13) and requests run on the
        # worker thread, so the pipeline also passes the limit to torch.compile itself
        torch._dynamo.config.recompile_limit = args.recompile_limit

    # bind first so an occupied port fails before minutes of loading
    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: an answer's header and body segments go out at once
        # (with Nagle every poll waited for the client's delayed ACK: 40 ms a GET)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            print(f"error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 2
        port = sock.getsockname()[1]
        mark("listening", port=port)
    runner = None  # rank 0 of a multi-rank engine: spawns the other ranks now, they load in parallel
    if args.num_gpus > 1:
        if rank == 0:
            import atexit

            store, init_url = dist.make_master_store(args.dist_init, args.num_gpus)
            runner = dist.Rank0Runner(dist.spawn_ranks(raw_argv, args.num_gpus, init_url))
            atexit.register(runner.shutdown)
        else:
            store = dist.client_store(args.dist_init, args.num_gpus)

    try:
        cap = placement.apply_device_cap(device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if args.model_path:
        comps = models.load_checkpoint(args.model_path, dtype, two_stage=args.two_stage, preset=args.preset)
    else:
        # build straight on the GPU when everything will be resident (seconds instead of a host
        # round trip of every tensor); on the host when the placement may offload
        build_dev = torch.device("cpu")
        if device.type == "cuda" and all(m in (None, "none") for m in requested.values()):
            need = models.estimate_param_bytes(args.preset, dtype, args.two_stage)
            if cap is None or need <= placement.WEIGHTS_SHARE_OF_CAP * cap * placement.GIB:
                build_dev = device
        comps = models.build_preset(
            args.preset, dtype, seed=args.seed, two_stage=args.two_stage, device=build_dev
        )
    placed = placement.place_components(comps, device, cap, requested)
    where = placed.name
    do_compile, compile_off_reason = args.compile, None
    recompile_limit = args.recompile_limit
    t_mode = placed.offload.get("transformer", "none")
    if do_compile and t_mode not in placement.COMPILE_COMPATIBLE:
        compile_off_reason = (
            f"the transformer is offloaded ({t_mode}); torch.compile is kept only under "
            f"{' or '.join(placement.COMPILE_COMPATIBLE)}"
        )
        log.warning("torch.compile disabled: %s", compile_off_reason)
        do_compile = False
    if do_compile and t_mode == "group-block" and recompile_limit is None:
        # one graph per offloaded block, all of the same code: dynamo's default limit (8) would
        # leave most blocks eager (diffusers PR #11605, test_compile_with_group_offloading)
        recompile_limit = placement.GROUP_COMPILE_RECOMPILE_LIMIT
        import torch._dynamo

        torch._dynamo.config.recompile_limit = recompile_limit
        log.info("block-level offloaded transformer compiled: recompile limit %d", recompile_limit)
    if do_compile:
        compile_off_reason = _compile_unusable(args.compile_backend, device)
        if compile_off_reason:
            log.warning("torch.compile disabled: %s", compile_off_reason)
            do_compile = False
    compile_vae = args.compile_vae and do_compile
    if compile_vae and placed.offload.get("vae", "none") != "none":
        log.warning("VAE torch.compile disabled: the VAE is offloaded (%s)", placed.offload["vae"])
        compile_vae = False
    stage_delay = {name: pct / 100.0 for name, pct in args.debug_stage_delay}
    if stage_delay:
        log.warning(
            "TEST ONLY: injected slowdown %s from measured request %d on",
            ", ".join(f"{k}=+{v:.0%}" for k, v in stage_delay.items()),
            args.debug_stage_delay_from,
        )
    watch = CompileWatch()
    par = dist.init(rank, args.num_gpus, store, device) if args.num_gpus > 1 else None
    pipe = StagedPipeline(
        comps,
        device,
        dtype,
        two_stage=args.two_stage,
        refine_steps=args.refine_steps,
        compile=do_compile,
        compile_backend=args.compile_backend,
        compile_vae=compile_vae,
        compile_watch=watch,
        recompile_limit=recompile_limit,
        cfg_parallel=par,
    )
    pipe.stage_delay = stage_delay
    if stage_delay:
        pipe._busy(0.2)  # first calls of the busy kernel pay one-off setup: not in a measured stage
    # the startup warmup; multi-GPU two-stage may use its own frame count (seed case 003)
    warmup_frames, warmup_rule = args.warmup_frames, "generic"
    if (
        args.two_stage
        and args.num_gpus > 1
        and args.multi_gpu_warmup_frames is not None
        and args.warmup_frames > 0
    ):
        warmup_frames, warmup_rule = args.multi_gpu_warmup_frames, "multi_gpu_two_stage"
    if rank > 0:
        from perfkit.refengine.memory import snapshot

        log.info("rank %d loaded (%s, %s); serving rank 0's requests", rank, device, where)
        return dist.worker_loop(
            pipe, par, warmup_first=warmup_frames > 0, snapshots={"load_peak": snapshot(device)}
        )
    if runner is not None:
        runner.attach(pipe, par)
    defaults = {
        "height": args.height or preset.height,
        "width": args.width or preset.width,
        "steps": args.steps or preset.steps,
        "num_frames": preset.num_frames,
    }
    info = {
        "device": str(device),
        **placed.info(device),  # placement (summary), placement_by_component, offload, ...
        "preset": args.preset,
        "model_source": comps.source,
        "dtype": str(dtype).replace("torch.", ""),
        # the effective config, as this engine runs it (perfkit records and gates it)
        "compile": do_compile,
        "compile_requested": bool(args.compile),
        "compile_active": do_compile,
        "compile_disabled_reason": compile_off_reason,
        "compile_backend": args.compile_backend if do_compile else None,
        "recompile_limit": (
            (recompile_limit if recompile_limit is not None else _recompile_limit()) if do_compile else None
        ),
        "attention_backend": _attention_backend(),
        "two_stage": args.two_stage,
        "warmup_frames": warmup_frames,
        "warmup_frames_rule": warmup_rule,
        "multi_gpu_warmup_frames": args.multi_gpu_warmup_frames,
        "device_cap_gib": cap,
        "param_mib": {k: round(v / 2**20, 1) for k, v in comps.param_bytes.items()},
        # frames: 8k+1 for every N (CFG parallel keeps the whole latent on each rank)
        "num_gpus": args.num_gpus,
        "parallelism": "cfg" if args.num_gpus > 1 else None,
        "frame_rule": "8k+1",
    }
    if stage_delay:
        info["debug_stage_delay_pct"] = {k: round(v * 100.0, 3) for k, v in stage_delay.items()}
        info["debug_stage_delay_from"] = args.debug_stage_delay_from
    engine = Engine(
        runner or pipe,
        defaults,
        args.max_frames,
        args.perf_log_dir,
        info,
        keep_outputs_dir=(f"{args.perf_log_dir or '.'}/outputs" if args.keep_outputs else None),
        debug_leak_mib=args.debug_leak_mib,
        commit_hash=git_commit(),
        debug_stage_delay_from=args.debug_stage_delay_from,
        snapshots=recorder,
    )
    from perfkit.refengine.memory import snapshot

    engine.snapshots["load_peak"] = snapshot(device)
    mark("models_loaded", t=f"{time.time():.6f}", placement=where)
    log.info("models loaded (%s, %s, %s)", comps.source, device, where)

    if warmup_frames > 0:
        wh, ww = args.warmup_resolution or (defaults["height"], defaults["width"])
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        job = engine.run_sync(
            GenRequest(
                prompt="warmup",
                num_frames=warmup_frames,
                height=wh,
                width=ww,
                num_inference_steps=args.warmup_steps,
            ),
            tag="warmup",
        )
        if job.status != "completed":
            print(f"error: startup warmup failed: {job.error}", file=sys.stderr)
            return 3
        engine.snapshots["warmup_peak"] = snapshot(device)
    mark("warmup_done", t=f"{time.time():.6f}")
    engine.ready = True
    if runner is not None:
        runner.ready = True

    app = create_app(engine, model_name=comps.source)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    engine.queue.put(None)
    if runner is not None:
        runner.shutdown()
    return 0


def _recompile_limit() -> int | None:
    """torch._dynamo's recompile limit in force (``recompile_limit``, formerly ``cache_size_limit``)."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            return int(getattr(cfg, name))
    return None


def _attention_backend() -> str:
    """diffusers' active attention backend (``DIFFUSERS_ATTN_BACKEND``; "native" is torch SDPA)."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        backend, _ = _AttentionBackendRegistry.get_active_backend()
        return str(getattr(backend, "value", backend))
    except (ImportError, AttributeError):
        return "not reported (diffusers has no attention dispatch)"


def _compile_unusable(backend: str, device) -> str | None:
    """Why torch.compile cannot run here, or None. inductor on a CPU device needs a working C++
    compiler (torch's ``cpp_builder.get_cpp_compiler``, honouring ``CXX``): without one the
    first request would fail, so the engine serves eagerly and says so."""
    if backend != "inductor" or device.type != "cpu":
        return None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - torch raises InvalidCxxCompiler and others
        return f"inductor on CPU needs a C++ compiler: {exc}"
    return None

"""Command line of the reference engine: :func:`main` checks the options, builds the engine and
serves (marks, sglang's log lines and exit codes: docs/refengine.md)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from perfkit.common.frames import PRESET_NAMES
from perfkit.refengine.flags import (
    COMPONENTS,
    build_parser,
    parse_indices,
    server_args_line,
    sglang_perf_log_dir,
)

log = logging.getLogger("perfkit.refengine")


class _Refused(Exception):
    """Bad arguments or a refused configuration: printed as ``error: <message>``, exit 2."""


def mark(name: str, **fields) -> None:
    """Print a ``perfkit-mark`` line on stderr (flushed)."""
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"perfkit-mark {name} {extra}".rstrip(), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None, t0: float | None = None) -> int:
    """Run the reference engine; returns 0 (stopped cleanly), 2 (refused: ``error: ...`` on stderr)
    or 3 (the startup warmup failed). ``t0``: the process start (epoch s) for the first mark."""
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
    try:
        return _serve(args, raw_argv, rank)
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace, raw_argv: list[str], rank: int) -> int:
    snapshot_after = _checked(args)
    _refuse_before_torch(args)

    import torch
    import uvicorn  # noqa: F401 - before the models load, as it always was (cold start parts)

    from perfkit.common.provenance import git_commit
    from perfkit.refengine import dist, models
    from perfkit.refengine.pipeline import StagedPipeline
    from perfkit.refengine.profiling import CompileWatch, SnapshotRecorder, snapshot
    from perfkit.refengine.server import Engine, serve_http

    device = _device(args, rank)
    # before the models load, so the weights' blocks carry their allocation stacks too
    recorder = SnapshotRecorder(
        device,
        snapshot_after if rank == 0 else [],
        Path(args.memory_snapshot_dir or f"{args.perf_log_dir or '.'}/memory_snapshots"),
        args.memory_snapshot_entries,
    )
    recorder.start()
    if args.cpu_threads is not None:  # after the ranks' default
        torch.set_num_threads(args.cpu_threads)
    requested = _requested_offload(args, device.type)
    preset = models.PRESETS.get(args.preset, models.PRESETS["tiny"])
    auto_dtype = preset.dtype if device.type == "cuda" else "float32"
    dtype = getattr(torch, auto_dtype if args.dtype == "auto" else args.dtype)

    # bind first so an occupied port fails before minutes of loading
    sock = _bind(args) if rank == 0 else None
    runner, store = _start_ranks(args, raw_argv, rank) if args.num_gpus > 1 else (None, None)

    try:
        cap = models.apply_device_cap(device)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    comps = _components(args, device, dtype, cap, requested)
    placed = models.place_components(comps, device, cap, requested)
    where = placed["placement"]
    compiled = _compile_settings(args, placed, device, comps)
    stage_delay = _injected_delay(args)
    par = dist.init(rank, args.num_gpus, store, device) if args.num_gpus > 1 else None
    pipe = StagedPipeline(
        comps,
        device,
        dtype,
        two_stage=args.two_stage,
        refine_steps=args.refine_steps,
        compile_watch=CompileWatch(),
        cfg_parallel=par,
    )
    pipe.stage_delay = stage_delay
    if stage_delay:
        pipe._busy(0.2)  # first calls of the busy kernel pay one-off setup: not in a measured stage
    warmup_frames = _warmup_frames(args)[0]
    if rank > 0:
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
    info = _engine_info(args, device, dtype, placed, comps, cap, compiled, stage_delay)
    log.info("%s", server_args_line(args, info, warmup_frames))
    engine = Engine(
        pipe,
        defaults,
        args.max_frames,
        args.perf_log_dir,
        info,
        keep_outputs_dir=(f"{args.perf_log_dir or '.'}/outputs" if args.keep_outputs else None),
        debug_leak_mib=args.debug_leak_mib,
        commit_hash=git_commit(),
        debug_stage_delay_from=args.debug_stage_delay_from,
        snapshot_recorder=recorder,
        runner=runner,
    )
    engine.snapshots["load_peak"] = snapshot(device)
    mark("models_loaded", t=f"{time.time():.6f}", placement=where)
    log.info("models loaded (%s, %s, %s)", comps.source, device, where)
    log.info("[server-load] workers_ready_monotonic_ns=%d", time.monotonic_ns())

    def warm() -> bool:  # on a thread once HTTP serves
        if warmup_frames > 0 and not _startup_warmup(engine, args, defaults, warmup_frames, device):
            return False
        mark("warmup_done", t=f"{time.time():.6f}")
        return True

    return serve_http(engine, comps.source, sock, warm)


def _injected_delay(args: argparse.Namespace) -> dict[str, float]:
    """TEST ONLY ``--debug-stage-delay``: stage -> fraction of its own work to add."""
    stage_delay = {name: pct / 100.0 for name, pct in args.debug_stage_delay}
    if stage_delay:
        log.warning(
            "TEST ONLY: injected slowdown %s from measured request %d on",
            ", ".join(f"{k}=+{v:.0%}" for k, v in stage_delay.items()),
            args.debug_stage_delay_from,
        )
    return stage_delay


def _warmup_frames(args: argparse.Namespace) -> tuple[int, str]:
    """(startup warmup frames, the rule that chose them)."""
    mg = args.multi_gpu_warmup_frames
    if args.two_stage and args.num_gpus > 1 and args.warmup_frames > 0 and mg is not None:
        return mg, "multi_gpu_two_stage"
    return args.warmup_frames, "generic"


def _engine_info(args, device, dtype, placed, comps, cap, compiled, stage_delay) -> dict[str, Any]:
    """The engine's effective config as it runs (the server's ``info``, in every record); ``compiled``:
    (compile, why not)."""
    import torch
    import torch._dynamo

    do_compile, compile_off_reason = compiled
    warmup_frames, warmup_rule = _warmup_frames(args)
    info = {
        "device": str(device),
        **placed,
        "preset": args.preset,
        "model_source": comps.source,
        "dtype": str(dtype).replace("torch.", ""),
        "compile": do_compile,
        "compile_requested": bool(args.compile),
        "compile_active": do_compile,
        "compile_disabled_reason": compile_off_reason,
        "compile_backend": args.compile_backend if do_compile else None,
        "recompile_limit": torch._dynamo.config.recompile_limit if do_compile else None,
        "attention_backend": _attention_backend(),
        "torch_threads": torch.get_num_threads(),
        "cpu_threads_requested": args.cpu_threads,
        "two_stage": args.two_stage,
        "warmup_frames": warmup_frames,
        "warmup_frames_rule": warmup_rule,
        "multi_gpu_warmup_frames": args.multi_gpu_warmup_frames,
        "device_cap_gib": cap,
        "param_mib": {k: round(v / 2**20, 1) for k, v in comps.param_bytes.items()},
        "num_gpus": args.num_gpus,
        "parallelism": "cfg" if args.num_gpus > 1 else None,
        "frame_rule": "8k+1",
    }
    if stage_delay:
        info["debug_stage_delay_pct"] = {k: round(v * 100.0, 3) for k, v in stage_delay.items()}
        info["debug_stage_delay_from"] = args.debug_stage_delay_from
    return info


def _checked(args: argparse.Namespace) -> list[int]:
    """Check the numeric options; the indices of ``--memory-snapshot-after``."""
    at_least = dict.fromkeys(("warmup_frames", "max_frames", "debug_leak_mib", "debug_stage_delay_from"), 0)
    at_least_1 = (
        "num_gpus",
        "cpu_threads",
        "memory_snapshot_entries",
        "steps",
        "warmup_steps",
        "height",
        "width",
    )
    for name, low in {**dict.fromkeys(at_least_1, 1), **at_least}.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise _Refused(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    for name, high in {
        "steps": 10_000,
        "warmup_steps": 10_000,
        "height": 16_384,
        "width": 16_384,
        "num_gpus": 1_024,
    }.items():
        value = getattr(args, name)
        if value is not None and value > high:  # else a hang or a torch crash after loading
            raise _Refused(f"--{name.replace('_', '-')} must be <= {high}, got {value}")
    if args.rank is not None and not (
        0 <= args.rank < args.num_gpus and args.world_size == args.num_gpus and args.dist_init
    ):
        raise _Refused("--rank needs 0 <= rank < --num-gpus, --world-size == --num-gpus and --dist-init")
    cores = os.cpu_count()
    if args.cpu_threads is not None and cores is not None and args.cpu_threads > cores:
        # else libgomp dies allocating the pool, or torch raises past a C long long
        raise _Refused(f"--cpu-threads must be <= this host's {cores} logical CPUs, got {args.cpu_threads}")
    try:
        return parse_indices(args.memory_snapshot_after)
    except ValueError as exc:
        raise _Refused(f"--memory-snapshot-after: {exc}") from None


def _device(args: argparse.Namespace, rank: int) -> Any:
    """The device ``--device`` names (bare ``cuda``: the current one), or this rank's."""
    import torch

    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.num_gpus == 1:
        return device
    if device.type == "cpu" and not os.environ.get("PERFKIT_TORCH_THREADS"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.num_gpus))  # ranks share the cores
    if device.type == "cuda":  # rank r on cuda:(base + r)
        base, n, have = device.index, args.num_gpus, torch.cuda.device_count()
        if base + n > have:
            raise _Refused(f"--num-gpus {n} from cuda:{base} needs {base + n} CUDA devices, {have} visible")
        device = torch.device("cuda", base + rank)
        torch.cuda.set_device(device)  # the seeded init draws on the current device
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # read at NCCL communicator init
    return device


def _refuse_before_torch(args: argparse.Namespace) -> None:
    """Refuse an unknown preset, and an offload mode on a device named ``cpu``, before torch."""
    if args.preset not in PRESET_NAMES and not args.model_path:
        raise _Refused(f"unknown --preset {args.preset!r}; known: {', '.join(PRESET_NAMES)}")
    if args.device == "cpu" or (args.device.startswith("cpu:") and args.device[4:].isdigit()):
        _requested_offload(args, "cpu")


#: the older ``--placement`` values as offload modes (``device``: all resident)
_PLACEMENTS = {
    "device": dict.fromkeys(COMPONENTS, "none"),
    "group_offload": {"text_encoder": "group-leaf", "transformer": "group-leaf", "vae": "none"},
}


def _requested_offload(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """Component -> the offload mode asked for (None: automatic) on a device of type ``kind``."""
    per_component = {c: getattr(args, f"offload_{c}") for c in COMPONENTS}
    asked = args.offload is not None or any(v is not None for v in per_component.values())
    if asked and args.placement is not None:
        raise _Refused("give either --placement or --offload/--offload-<component>, not both")
    legacy = args.placement if kind == "cuda" else None
    requested = dict(_PLACEMENTS.get(legacy) or dict.fromkeys(COMPONENTS))
    if args.offload is not None:
        requested = dict.fromkeys(COMPONENTS, args.offload)
    requested.update({c: m for c, m in per_component.items() if m is not None})
    bad = {c: m for c, m in requested.items() if m not in (None, "none")}
    if kind == "cpu" and bad:
        comps, mode = ", ".join(f"{c}={m}" for c, m in bad.items()), next(iter(bad.values()))
        raise _Refused(f"offload mode {mode!r} needs an accelerator; device is cpu ({comps})")
    return requested


def _bind(args: argparse.Namespace) -> socket.socket:
    """The listening socket; ``args.port`` becomes the port served."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # inherited by accepted connections: with Nagle a poll waits for the delayed ACK (40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        raise _Refused(f"cannot bind {args.host}:{args.port}: {exc}") from None
    args.port = sock.getsockname()[1]
    mark("listening", port=args.port)
    return sock


def _start_ranks(args: argparse.Namespace, raw_argv: list[str], rank: int) -> tuple[Any, Any]:
    """(rank 0's runner or None, the rendezvous store); rank 0 spawns the other ranks now."""
    from perfkit.refengine import dist

    if rank == 0:
        import atexit

        store, init_url = dist.make_store(args.dist_init, args.num_gpus, master=True)
        runner = dist.Rank0Runner(dist.spawn_ranks(raw_argv, args.num_gpus, init_url))
        atexit.register(runner.shutdown)
        return runner, store
    return None, dist.make_store(args.dist_init, args.num_gpus, master=False)[0]


def _components(args: argparse.Namespace, device, dtype, cap, requested: dict[str, Any]) -> Any:
    """The model components, from ``--model-path`` or built from the preset."""
    import torch

    from perfkit.refengine import models

    if args.model_path:
        return models.load_checkpoint(args.model_path, dtype, two_stage=args.two_stage, preset=args.preset)
    build_dev = torch.device("cpu")
    if device.type == "cuda" and all(m in (None, "none") for m in requested.values()):
        need = models.estimate_param_bytes(args.preset, dtype, args.two_stage)
        if cap is None or need <= models.WEIGHTS_SHARE_OF_CAP * cap * models.GIB:
            build_dev = device
    return models.build_preset(args.preset, dtype, seed=args.seed, two_stage=args.two_stage, device=build_dev)


def _compile_settings(args: argparse.Namespace, placed, device, comps) -> tuple[bool, str | None]:
    """(compile, why not when asked); sets dynamo's recompile limit and compiles what placement allows."""
    import torch._dynamo

    from perfkit.refengine import models

    do_compile, compile_off_reason = args.compile, None
    recompile_limit = args.recompile_limit
    t_mode = placed["offload"].get("transformer", "none")
    if do_compile and t_mode not in models.COMPILE_COMPATIBLE:
        compile_off_reason = (
            f"the transformer is offloaded ({t_mode}); torch.compile is kept only under "
            f"{' or '.join(models.COMPILE_COMPATIBLE)}"
        )
    elif do_compile:  # only a CPU device may lack one: no offload there
        compile_off_reason = _compile_unusable(args.compile_backend, device)
    if compile_off_reason:
        log.warning("torch.compile disabled: %s", compile_off_reason)
        do_compile = False
    if do_compile and t_mode == "group-block" and recompile_limit is None:
        # one graph per offloaded block: dynamo's default limit (8) leaves most blocks eager
        recompile_limit = models.GROUP_COMPILE_RECOMPILE_LIMIT
        log.info("block-level offloaded transformer compiled: recompile limit %d", recompile_limit)
    compile_vae = args.compile_vae and do_compile
    if compile_vae and placed["offload"].get("vae", "none") != "none":
        log.warning("VAE torch.compile disabled: the VAE is offloaded (%s)", placed["offload"]["vae"])
        compile_vae = False
    if recompile_limit is not None:
        # thread-local in torch >= 2.13: also passed to torch.compile where it takes it
        torch._dynamo.config.recompile_limit = recompile_limit
    if do_compile:
        kw = compile_kwargs(args.compile_backend, recompile_limit)
        comps.transformer.compile(**kw)
        if compile_vae:
            comps.vae.decoder.compile(**kw)
    return do_compile, compile_off_reason


def compile_kwargs(backend: str, recompile_limit: int | None, compile_fn: Any = None) -> dict[str, Any]:
    """``torch.compile`` kwargs, with ``recompile_limit`` only where ``compile_fn`` (default
    ``torch.compile``) takes it (torch 2.13 on; 2.11 raises TypeError). ValueError: ``backend``
    empty or not a string, ``recompile_limit`` not a positive int."""
    import inspect

    import torch

    if not isinstance(backend, str) or not backend:
        raise ValueError(f"compile backend must be a non-empty name, got {backend!r}")
    if recompile_limit is not None and (
        isinstance(recompile_limit, bool) or not isinstance(recompile_limit, int) or recompile_limit < 1
    ):
        raise ValueError(f"recompile_limit must be a positive integer, got {recompile_limit!r}")
    kw: dict[str, Any] = {"dynamic": False, "backend": backend}
    takes = "recompile_limit" in inspect.signature(compile_fn or torch.compile).parameters
    if recompile_limit is not None and takes:
        kw["recompile_limit"] = recompile_limit
    elif recompile_limit is not None:
        log.info("torch.compile takes no recompile_limit here: dynamo's process-wide limit applies")
    return kw


def _startup_warmup(engine, args: argparse.Namespace, defaults: dict, warmup_frames: int, device) -> bool:
    """Run the startup warmup request; False (``error: ...`` on stderr) when it failed."""
    from perfkit.refengine.jobs import GenRequest
    from perfkit.refengine.profiling import snapshot

    wh, ww = args.warmup_resolution or (defaults["height"], defaults["width"])
    job = engine.submit(GenRequest("warmup", warmup_frames, wh, ww, args.warmup_steps), tag="warmup")
    job.done.wait()
    if job.status != "completed":
        print(f"error: startup warmup failed: {job.error}", file=sys.stderr)
        return False
    engine.snapshots["warmup_peak"] = snapshot(device)
    return True


def _attention_backend() -> str:
    """diffusers' active attention backend ("native" is torch SDPA)."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        backend, _ = _AttentionBackendRegistry.get_active_backend()
        return str(getattr(backend, "value", backend))
    except (ImportError, AttributeError):
        return "not reported (diffusers has no attention dispatch)"


def _compile_unusable(backend: str, device) -> str | None:
    """Why torch.compile cannot run here (inductor on CPU without a C++ compiler), or None."""
    if backend != "inductor" or device.type != "cpu":
        return None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - torch raises InvalidCxxCompiler and others
        return f"inductor on CPU needs a C++ compiler: {exc}"
    return None

"""The reference engine's command line options (:func:`build_parser`, following ``sglang serve``
where it has them), sglang's perf log environment and its ``server_args`` line."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

OFFLOAD_MODES = ("none", "model", "group-block", "group-leaf")
#: Components with their own offload flag (the upsampler follows ``vae``).
COMPONENTS = ("text_encoder", "transformer", "vae")


def _resolution(text: str) -> tuple[int, int]:
    try:
        h, w = text.lower().split("x")
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH, got {text!r}") from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


#: Values sglang reads as true for its boolean environment variables.
_TRUTHY = ("1", "true", "yes", "y", "t", "on")


def sglang_perf_log_dir(environ=None) -> str | None:
    """``SGLANG_PERF_LOG_DIR`` when ``SGLANG_DIFFUSION_STAGE_LOGGING`` is true (as sglang reads it)."""
    env = os.environ if environ is None else environ
    if str(env.get("SGLANG_DIFFUSION_STAGE_LOGGING", "")).strip().lower() not in _TRUTHY:
        return None
    return env.get("SGLANG_PERF_LOG_DIR") or None


def server_args_line(args: argparse.Namespace, info: dict[str, Any], warmup_frames: int) -> str:
    """``server_args: {JSON}`` as sglang 0.5.23 logs its adjusted ServerArgs, with sglang's names
    for what this engine runs (docs/refengine.md, "Command line and startup")."""
    offload = info.get("offload") or {}
    transformer = str(offload.get("transformer", "none"))
    res = args.warmup_resolution
    sglang_args = {
        "model_path": args.model_path or f"perfkit-preset:{args.preset}",
        "attention_backend": info.get("attention_backend"),
        "enable_torch_compile": bool(info.get("compile_active")),
        "dit_cpu_offload": transformer != "none",
        "dit_layerwise_offload": transformer.startswith("group"),
        "text_encoder_cpu_offload": str(offload.get("text_encoder", "none")) != "none",
        "vae_cpu_offload": str(offload.get("vae", "none")) != "none",
        "num_gpus": args.num_gpus,
        "host": args.host,
        "port": args.port,
        "warmup_mode": "server" if warmup_frames > 0 else "off",
        "warmup_resolutions": [f"{res[1]}x{res[0]}"] if res else None,
        "warmup_num_frames": warmup_frames or None,
        "warmup_steps": args.warmup_steps,
    }
    return "server_args: " + json.dumps(sglang_args)


def _stage_delay(text: str) -> tuple[str, float]:
    """``STAGE=PCT`` (``DenoisingStage=30%``) -> (stage, percent)."""
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


def parse_indices(text: str) -> list[int]:
    """``"0,3"`` -> ``[0, 3]`` (measured request indices); ValueError: an entry not an integer >= 0."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    for part in parts:
        if not part.isdigit():
            raise ValueError(f"expected request indices like 0,3 (integers >= 0), got {part!r}")
    return sorted({int(p) for p in parts})


def _o(*flags: str, **kwargs: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return flags, kwargs


_UNUSED = "accepted as sglang's command line has it; unused (no such port)"

_OPTIONS = [
    _o("--preset", default="tiny", help="model preset: tiny | ltx-2b (default tiny)"),
    _o("--model-path", help="local diffusers-format checkpoint directory"),
    _o("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"),
    _o("--port", type=int, default=0, help="0 picks a free port (printed as a mark)"),
    _o(
        "--perf-log-dir",
        help="append performance.log here (default: $SGLANG_PERF_LOG_DIR when "
        "$SGLANG_DIFFUSION_STAGE_LOGGING is true, as sglang's server does)",
    ),
    _o("--device", default="auto", help="auto | cpu | cuda | cuda:N"),
    _o("--dtype", default="auto", help="auto | float32 | bfloat16 | float16"),
    _o("--seed", type=int, default=0, help="weight seed"),
    _o(
        "--compile",
        "--enable-torch-compile",
        action="store_true",
        help="torch.compile the transformer (dynamic=False)",
    ),
    _o(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend: inductor | aot_eager | eager | cudagraphs",
    ),
    _o("--compile-vae", action="store_true", help="also compile the VAE decoder"),
    _o("--recompile-limit", type=_positive_int, help="torch._dynamo recompile limit"),
    _o("--two-stage", action="store_true", help="half-res pass + UpsampleStage + RefinementStage"),
    _o("--refine-steps", type=int, default=2, help="RefinementStage steps of the two-stage pipeline"),
    _o(
        "--warmup-frames",
        "--warmup-num-frames",
        type=int,
        default=17,
        help="startup warmup frames (0 disables)",
    ),
    _o(
        "--warmup-mode",
        choices=["off", "server"],
        help="sglang's flag: off disables the startup warmup, server keeps it",
    ),
    _o("--warmup-steps", type=int, default=2, help="denoising steps of the startup warmup (sglang: 2)"),
    _o("--warmup-resolution", type=_resolution, help="HEIGHTxWIDTH"),
    _o("--height", type=int, help="serving default height (px)"),
    _o("--width", type=int, help="serving default width (px)"),
    _o("--steps", type=int, help="serving default num_inference_steps"),
    _o("--max-frames", type=int, default=257, help="requests with more frames get a 400 (default 257)"),
    _o(
        "--num-gpus",
        type=int,
        default=1,
        help="N > 1: CFG parallel over N ranks with torch.distributed (NCCL on cuda:0..N-1, gloo "
        "on the CPU); rank 0 serves HTTP and spawns the others (see refengine.dist)",
    ),
    _o("--master-port", type=int, help=_UNUSED),
    _o("--scheduler-port", type=int, help=_UNUSED),
    _o(
        "--output-path",
        help="accepted as sglang's command line has it; --keep-outputs writes under perf-log-dir",
    ),
    _o(
        "--cpu-threads",
        type=int,
        help="torch intra-op threads (torch.set_num_threads) of every rank, 1 to the host's "
        "logical CPUs (more exits 2); default: torch's own "
        "(OMP_NUM_THREADS, else the cores), or the cores shared between the ranks of a CPU engine "
        "with --num-gpus > 1. Recorded as torch_threads",
    ),
    _o(
        "--multi-gpu-warmup-frames",
        type=int,
        help="startup warmup frames for --two-stage with --num-gpus > 1 instead of --warmup-frames "
        "(sglang uses 25 there: a 24-frame request aligns to 25 = 4 latent frames, a 17-frame "
        "warmup covers 3); default: --warmup-frames",
    ),
    _o("--dist-init", help="tcp://HOST:PORT of rank 0's rendezvous store (default: 127.0.0.1, a free port)"),
    _o("--rank", type=int, help=argparse.SUPPRESS),
    _o("--world-size", type=int, help=argparse.SUPPRESS),
    _o(
        "--placement",
        choices=["device", "group_offload"],
        help="force a placement instead of deciding from the cap (older flag; ignored on a CPU "
        "device; see --offload)",
    ),
    _o(
        "--offload",
        choices=OFFLOAD_MODES,
        help="offload mode of every component: none (resident), model (whole component moved in "
        "and out, accelerate's cpu_offload_with_hook), group-block / group-leaf (diffusers' "
        "apply_group_offloading at block / leaf level, CUDA stream prefetch). Default: none, "
        "unless the device cap forces group-leaf offload: the text encoder first, then the "
        "transformer, until the resident rest fits. "
        "Modes other than none need an accelerator: on a CPU device the engine exits with code 2",
    ),
    *(
        _o(
            f"--offload-{comp.replace(' ', '-')}",
            choices=OFFLOAD_MODES,
            help=f"offload mode of the {comp} (overrides --offload for it{tail}",
        )
        for comp, tail in (
            ("transformer", ")"),
            ("text encoder", ")"),
            ("vae", "; the two-stage upsampler follows it)"),
        )
    ),
    _o("--keep-outputs", action="store_true", help="save generated frames as .npy"),
    _o("--debug-leak-mib", type=int, default=0, help="TEST ONLY: leak this many MiB per request"),
    _o(
        "--memory-snapshot-after",
        default="",
        metavar="I,J",
        help="CUDA: record allocation history and dump an allocator snapshot after these 0-based "
        "measured requests (0: the cold request), into --memory-snapshot-dir; on CPU the records "
        "say 'not available on cpu'",
    ),
    _o(
        "--memory-snapshot-entries",
        type=int,
        default=20000,
        help="trace entries the allocation history keeps (bounds each snapshot's size)",
    ),
    _o(
        "--memory-snapshot-dir",
        help="where request-<index>.pickle snapshots go (default: <perf-log-dir>/memory_snapshots)",
    ),
    _o(
        "--debug-stage-delay",
        action="append",
        type=_stage_delay,
        default=[],
        metavar="STAGE=PCT",
        help="TEST ONLY: slow STAGE down by PCT %% of its own work (e.g. DenoisingStage=30%%): busy "
        "compute on the device inside the stage's span (per denoising step for DenoisingStage and "
        "RefinementStage), on measured requests only, never the startup warmup; repeatable",
    ),
    _o(
        "--debug-stage-delay-from",
        type=int,
        default=0,
        metavar="N",
        help="TEST ONLY: apply --debug-stage-delay from the N-th measured request on (0-based; "
        "0: every request, 1: warm requests only)",
    ),
    _o("--log-level", default="INFO", help="logging level: DEBUG | INFO | WARNING | ERROR"),
]


def build_parser() -> argparse.ArgumentParser:
    """The engine's argument parser."""
    p = argparse.ArgumentParser(
        prog="perfkit engine serve",
        description="perfkit reference engine: LTX-Video (diffusers) over HTTP "
        "(also: python -m perfkit.refengine)",
        epilog="Example: perfkit engine serve --preset tiny --port 8000 (@FILE: more options from FILE,"
        " one a line). Exit codes: 0 stopped "
        "cleanly, 2 bad arguments or a refused configuration (unknown preset, an accelerator "
        "offload mode on a CPU device), other non-zero: the engine failed.",
        fromfile_prefix_chars="@",
    )
    for flags, kwargs in _OPTIONS:
        p.add_argument(*flags, **kwargs)
    return p

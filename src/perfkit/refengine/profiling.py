"""Per-request torch.profiler traces as sglang 0.5.23 takes them (docs/below-the-stage.md),
torch.compile compilations per request (docs/refengine.md, "Compilations"), and device memory
snapshots (MiB) and allocator snapshot files (CUDA only)."""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

import torch

log = logging.getLogger(__name__)

#: sglang's default number of profiled denoising steps (after one warm-up step)
DEFAULT_PROFILED_STEPS = 5
#: the most ``num_profiled_timesteps`` a request may ask for (sglang takes any int)
MAX_PROFILED_STEPS = 1000
#: the warm-up steps sglang's schedule discards, added to the active (recorded) steps
WARMUP_STEPS = 1
#: stage -> the name sglang 0.5.23 registers it under (others: the class name)
REGISTERED_NAMES = {"DenoisingStage": "denoising_stage", "DecodingStage": "decoding_stage"}
#: directory variables, in the order sglang reads them; then ``./logs``
DIR_VARIABLES = ("SGLANG_DIFFUSION_TORCH_PROFILER_DIR", "SGLANG_TORCH_PROFILER_DIR")
INJECTED_RANGE = "perfkit::debug_stage_delay"


def trace_dir(environ: dict[str, str] | None = None) -> Path:
    """Where traces go: the first of :data:`DIR_VARIABLES` set and not empty, else ``./logs``."""
    env = os.environ if environ is None else environ
    return Path(next((env[name] for name in DIR_VARIABLES if env.get(name)), "./logs"))


def profile_mode(all_stages: bool, num_profiled_timesteps: int | None, num_inference_steps: int) -> str:
    """sglang's mode id: ``full_stages`` or ``{N}_steps`` (:func:`profiled_steps`)."""
    if all_stages:
        return "full_stages"
    return f"{profiled_steps(num_profiled_timesteps, num_inference_steps)}_steps"


def profiled_steps(num_profiled_timesteps: int | None, num_inference_steps: int) -> int:
    """Steps to record: ``num_profiled_timesteps`` (None: 5; -1: every step). ValueError naming
    the field: 0, below -1 or above :data:`MAX_PROFILED_STEPS`."""
    n = DEFAULT_PROFILED_STEPS if num_profiled_timesteps is None else num_profiled_timesteps
    if n == -1:
        return num_inference_steps
    if n < 1 or n > MAX_PROFILED_STEPS:
        raise ValueError(
            f"num_profiled_timesteps: must be -1 (all steps) or between 1 and {MAX_PROFILED_STEPS}, got {n}"
        )
    return n


@dataclass
class TraceInfo:
    """What one profiled request left (``error``: why no trace was written)."""

    mode: str
    path: str | None
    size_bytes: int | None
    steps_recorded: int
    error: str | None = None


class RequestProfiler:
    """torch.profiler around one request, with sglang's modes and file name, into :func:`trace_dir`."""

    def __init__(
        self,
        request_id: str,
        all_stages: bool,
        num_profiled_timesteps: int | None,
        num_inference_steps: int,
    ):
        self.request_id = request_id
        self.all_stages = bool(all_stages)
        self.mode = profile_mode(self.all_stages, num_profiled_timesteps, num_inference_steps)
        self.directory = trace_dir()
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        kw: dict[str, Any] = {"activities": acts, "record_shapes": True, "with_stack": True}
        self._active = 0
        if not self.all_stages:
            self._active = profiled_steps(num_profiled_timesteps, num_inference_steps) + WARMUP_STEPS
            kw["schedule"] = torch.profiler.schedule(
                wait=0, warmup=WARMUP_STEPS, active=self._active, repeat=1, skip_first=0
            )
        self._active_left = self._active
        self._prof = torch.profiler.profile(**kw)
        self.steps_recorded = 0
        self._stopped = False
        self._prof.start()
        log.info("profiling request %s (%s) into %s", request_id, self.mode, self.directory)

    def denoising_step_done(self) -> None:
        """After one denoising step (sglang's ``step_denoising_step``): advance the schedule or stop."""
        if self.all_stages:
            self.steps_recorded += 1
            return
        if self._stopped:
            return
        if self._active_left >= 0:
            self._prof.step()
            self._active_left -= 1
            self.steps_recorded = min(self._active - self._active_left, self._active)
        else:
            self._stopped = True
            self._prof.stop()

    def finish(self) -> TraceInfo:
        """Stop and write the gzipped Chrome trace; never raises (a failure is :attr:`TraceInfo.error`)."""
        try:
            if not self._stopped:
                self._stopped = True
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self._prof.stop()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = (self.directory / f"{self.request_id}-{self.mode}-global-rank0.trace.json.gz").resolve()
            self._prof.export_chrome_trace(str(path))  # .gz: torch writes it gzipped
            size = path.stat().st_size
            log.info("saved profiler trace of %s to %s (%d bytes)", self.request_id, path, size)
            return TraceInfo(self.mode, str(path), size, self.steps_recorded)
        except Exception as exc:  # noqa: BLE001 - must not fail the request
            log.exception("could not write the profiler trace of %s", self.request_id)
            return TraceInfo(self.mode, None, None, self.steps_recorded, f"{type(exc).__name__}: {exc}")


def maybe_range(profiler: RequestProfiler | None, name: str) -> ContextManager[Any]:
    """``record_function(name)`` while a request is profiled, else nothing (no cost)."""
    return torch.profiler.record_function(name) if profiler is not None else nullcontext()


@dataclass
class CompileWindow:
    """What compiled inside one window (a request), also per stage; ``phases_ms``: torch's
    ``dynamo_timed`` name -> ms inside the window (names nest)."""

    compiles: int = 0
    compile_ms: float = 0.0
    reasons: list[str] = field(default_factory=list)
    limit_hit: bool = False
    limit_stage: str | None = None
    by_stage: dict[str, dict] = field(default_factory=dict)
    phases_ms: dict[str, float] | None = None

    def _stage_entry(self, stage: str | None) -> dict:
        return self.by_stage.setdefault(
            stage or "outside a stage", {"compiles": 0, "compile_ms": 0.0, "reasons": []}
        )


class _Handler(logging.Handler):
    def __init__(self, watch: "CompileWatch"):
        super().__init__(level=logging.DEBUG)
        self.watch = watch
        self._last: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # attached to a logger and its parent: a propagated record arrives twice
        if record is self._last:
            return
        self._last = record
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            return
        self.watch._on_log(record.name, msg)


class CompileWatch:
    """Process-wide observer of dynamo compilations; open a window per request."""

    def __init__(self) -> None:
        import torch._dynamo  # noqa: F401

        self._lock = threading.Lock()
        self._starts: dict[str, float] = {}
        self._current: CompileWindow | None = None
        self._phase_marks: dict[str, int] = {}  # len of each of torch's timers at the window's start
        self._seen_reasons: set[tuple[str, str]] = set()
        self.stage: str | None = None
        handler = torch._dynamo.callback.callback_handler
        handler.register_start_callback(self._on_start)
        handler.register_end_callback(self._on_end)
        torch._logging.set_logs(recompiles=True)
        h = _Handler(self)
        for name in ("torch._dynamo.guards", "torch._dynamo.convert_frame", "torch._dynamo"):
            logging.getLogger(name).addHandler(h)

    def _cid(self, args) -> str:
        return str(getattr(args[0], "compile_id", "?")) if args else "?"

    def _on_start(self, *args, **kwargs) -> None:
        with self._lock:
            self._starts[self._cid(args)] = time.perf_counter()
            if self._current is not None:
                self._current.compiles += 1
                self._current._stage_entry(self.stage)["compiles"] += 1

    def _on_end(self, *args, **kwargs) -> None:
        with self._lock:
            t0 = self._starts.pop(self._cid(args), None)
            if t0 is not None and self._current is not None:
                ms = (time.perf_counter() - t0) * 1000.0
                self._current.compile_ms += ms
                self._current._stage_entry(self.stage)["compile_ms"] += ms

    def _on_log(self, name: str, msg: str) -> None:
        with self._lock:
            w = self._current
            if w is None:
                return
            if "recompile_limit" in msg or "cache_size_limit" in msg:
                w.limit_hit = True
                w.limit_stage = w.limit_stage or self.stage
                reason = msg.strip().splitlines()[0]
            elif "Recompiling function" in msg and (name, msg) not in self._seen_reasons:
                self._seen_reasons.add((name, msg))
                lines = [ln.strip() for ln in msg.splitlines()]
                guards = [ln.lstrip("- ").strip() for ln in lines if ln.startswith("- ")]
                # only the newest guard failure is informative (older ones repeat)
                reason = guards[0] if guards else lines[0]
            else:
                return
            w.reasons.append(reason[:300])
            w._stage_entry(self.stage)["reasons"].append(reason[:300])

    def begin(self) -> CompileWindow:
        """Start a window; returns it."""
        with self._lock:
            self._seen_reasons.clear()
            self._current = CompileWindow()
            self._phase_marks = {k: len(v) for k, v in _time_metrics().items()}
            return self._current

    def end(self) -> CompileWindow:
        """Close the current window and return it."""
        with self._lock:
            w = self._current or CompileWindow()
            self._current = None
            marks = self._phase_marks
            w.phases_ms = {
                k: round(sum(v[marks.get(k, 0) :]) * 1000.0, 3)
                for k, v in _time_metrics().items()
                if len(v) > marks.get(k, 0)
            }
            return w


def _time_metrics() -> dict[str, list[float]]:
    """torch's compile timers: name -> seconds of each timed call."""
    from torch._dynamo.utils import compilation_time_metrics

    return compilation_time_metrics


MIB = 1024 * 1024


def snapshot(device: torch.device) -> dict[str, float] | None:
    """sglang's checkpoint fields (MiB) of ``device``; None off CUDA."""
    if device.type != "cuda":
        return None
    return {
        "allocated_mb": round(torch.cuda.memory_allocated(device) / MIB, 2),
        "reserved_mb": round(torch.cuda.memory_reserved(device) / MIB, 2),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated(device) / MIB, 2),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved(device) / MIB, 2),
    }


def max_snapshots(per_rank: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Checkpoint -> field -> max across ranks (as sglang reports memory)."""
    out: dict[str, dict[str, float]] = {}
    for snaps in per_rank:
        for ck, vals in (snaps or {}).items():
            cur = out.setdefault(ck, {}) if vals else {}
            for k, v in (vals or {}).items():
                if v is not None:
                    cur[k] = max(v, cur.get(k, v))
    return out


NOT_ON_CPU = "not available on cpu"


@dataclass
class SnapshotRecorder:
    """Dumps an allocator snapshot (``out_dir/request-<index>.pickle``, CUDA only) after the
    measured requests ``after`` (0: the cold request); ``max_entries`` bounds the file size."""

    device: torch.device
    after: list[int]
    out_dir: Path
    max_entries: int = 20000

    def start(self) -> None:
        """Start recording (CUDA; Python stacks: C++ symbolisation costs seconds per dump)."""
        if self.device.type != "cuda" or not self.after:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self.max_entries
        )
        log.info(
            "recording allocation history (%d entries) for snapshots after %s", self.max_entries, self.after
        )

    def after_request(self, index: int) -> dict[str, Any] | None:
        """The record's ``memory_snapshot`` for measured request ``index`` (None: not chosen):
        ``{request_index, error}`` or ``{request_index, path, bytes, max_entries, stacks}``."""
        if index not in self.after:
            return None
        if self.device.type != "cuda":
            return {"request_index": index, "error": NOT_ON_CPU}
        path = self.out_dir / f"request-{index:03d}.pickle"
        try:
            torch.cuda.synchronize(self.device)
            torch.cuda.memory._dump_snapshot(str(path))
        except Exception as exc:  # noqa: BLE001 - a snapshot must never fail the request
            log.exception("memory snapshot after request %d failed", index)
            return {"request_index": index, "error": f"{type(exc).__name__}: {exc}"}
        return {
            "request_index": index,
            "path": str(path.resolve()),
            "bytes": path.stat().st_size,
            "max_entries": self.max_entries,
            "stacks": "python",
        }

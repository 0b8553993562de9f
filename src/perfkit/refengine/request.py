"""A reference engine request and what running it produced: :class:`GenRequest` (sglang's
/v1/videos fields), :class:`StageResult`, :class:`RunResult`, and the record fields a run gives
(:func:`record_payload`, :func:`run_extras`, :func:`host_memory`). Sizes in pixels, times in ms,
memory in MiB.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from perfkit.refengine.compile_watch import CompileWindow


@dataclass
class GenRequest:
    """One video request (sglang's /v1/videos fields). Sizes in pixels, frames as requested."""

    prompt: str
    num_frames: int
    height: int
    width: int
    num_inference_steps: int
    seed: int = 0
    guidance_scale: float = 3.0
    negative_prompt: str = ""
    fps: int = 24
    #: stage timing: True / "events" (CUDA events at stage boundaries, resolved once after the
    #: request: no host sync while it runs), "sync" (synchronise the device at every stage
    #: boundary and read the host clock: the older method, kept to cross-check), False (off: one
    #: sync at the end only). On a CPU device "events" and "sync" are the same host clock.
    stage_timing: bool | str = True

    @property
    def timing_mode(self) -> str:
        """``events``, ``sync`` or ``off`` (see :attr:`stage_timing`)."""
        if self.stage_timing is False or self.stage_timing == "off":
            return "off"
        return "sync" if self.stage_timing == "sync" else "events"


@dataclass
class StageResult:
    name: str
    ms: float
    t_start: float
    t_end: float
    peak_allocated_mb: float | None = None
    peak_reserved_mb: float | None = None


@dataclass
class RunResult:
    """What one pipeline run produced: stage timings, steps (ms), compile window, memory."""

    stages: list[StageResult] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    refinement_steps: list[float] = field(default_factory=list)
    total_ms: float = 0.0
    t_start: float = 0.0
    t_end: float = 0.0
    effective_frames: int = 0
    latent_shape: list[int] = field(default_factory=list)
    compile: CompileWindow = field(default_factory=CompileWindow)
    video: np.ndarray | None = None
    #: multi-rank engines: every rank's report (rank order), filled on rank 0 (see refengine.dist)
    ranks: list[dict[str, Any]] | None = None
    #: CFG parallel: per denoising/refinement step, this rank's transformer time and its wait in
    #: the all_gather (ms, CUDA events; perf_counter on CPU), in call order
    cfg_compute_ms: list[float] = field(default_factory=list)
    cfg_gather_ms: list[float] = field(default_factory=list)
    #: test-only injected slowdown: stage -> [work, injected] in ms of the pipeline's clock
    #: (:meth:`StagedPipeline._clock`: thread CPU time on a CPU device, wall time on CUDA)
    injected: dict[str, list[float]] = field(default_factory=dict)
    #: CPU device: the injected busy pieces' wall time per stage (ms; the clock a profiler trace
    #: shows, which on a shared host exceeds the thread CPU time above by the time other
    #: processes got the core)
    injected_wall: dict[str, float] = field(default_factory=dict)


def record_payload(res: RunResult) -> dict[str, Any]:
    """The parts of a record that come from a run (stages, steps, perfkit extras)."""
    return {
        "stages": [{"name": s.name, "execution_time_ms": round(s.ms, 3)} for s in res.stages],
        "steps": [round(x, 3) for x in res.steps],
        "total_duration_ms": round(res.total_ms, 3),
    }


def run_extras(res: RunResult) -> dict[str, Any]:
    """perfkit's fields of a run that a record and a rank report share: refinement steps (ms),
    each stage's peak allocated (MiB), the compile window (count, ms, reasons, torch's phase ms)
    and the run's span (epoch s)."""
    c = res.compile
    return {
        "refinement_steps": [round(x, 3) for x in res.refinement_steps],
        "stage_peak_allocated_mb": {
            s.name: round(s.peak_allocated_mb, 2) for s in res.stages if s.peak_allocated_mb is not None
        },
        "compiles": c.compiles,
        "compile_ms": round(c.compile_ms, 3),
        "recompile_reasons": c.reasons,
        "compile_phases_ms": c.phases_ms,
        "t_start": res.t_start,
        "t_end": res.t_end,
    }


def host_memory() -> dict[str, float | None]:
    """This process's ``host_rss_mib`` and ``host_anon_mib`` (MiB; anonymous from
    /proc/self/status RssAnon, None where the kernel has none: "not reported")."""
    anon = None
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        anon = next((int(ln.split()[1]) / 1024.0 for ln in fh if ln.startswith("RssAnon:")), None)
    rss = psutil.Process().memory_info().rss / 2**20
    return {"host_rss_mib": round(rss, 2), "host_anon_mib": None if anon is None else round(anon, 2)}

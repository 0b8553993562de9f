"""A reference engine request and what running it produced (:class:`GenRequest`, sglang's
/v1/videos fields; :class:`StageResult`, :class:`RunResult`), and one request's job: its
bookkeeping (:class:`Job`, the job clock: docs/refengine.md), its ``performance.log`` record
and its ``/v1/videos`` answer. Sizes in pixels, times in ms, memory in MiB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from perfkit.refengine.profiling import CompileWindow, TraceInfo, max_snapshots

log = logging.getLogger(__name__)


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
    #: stage timing: True / "events", "sync", False / "off" (docs/refengine.md, "Pipeline and timing")
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
    #: test-only injected slowdown: stage -> [work, injected] ms (thread CPU time on a CPU device)
    injected: dict[str, list[float]] = field(default_factory=dict)
    #: CPU device: the injected pieces' wall time per stage (ms; the clock a profiler trace shows)
    injected_wall: dict[str, float] = field(default_factory=dict)


def run_fields(res: RunResult) -> dict[str, Any]:
    """The fields of a run that a record and a rank report share: sglang's stages, steps and
    total_duration_ms (ms), then perfkit's refinement steps (ms), each stage's peak allocated
    (MiB), the compile window (count, ms, reasons, torch's phase ms) and the run's span (epoch s)."""
    c = res.compile
    return {
        "stages": [{"name": s.name, "execution_time_ms": round(s.ms, 3)} for s in res.stages],
        "steps": [round(x, 3) for x in res.steps],
        "total_duration_ms": round(res.total_ms, 3),
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


@dataclass
class Job:
    """One request's job: what was asked, its status, and when it was created (submitted),
    started (the worker took it from the queue) and completed, epoch seconds (``time.time()``)."""

    id: str
    req: GenRequest
    tag: str = "request"
    status: str = "queued"
    error: str | None = None
    created: float = field(default_factory=time.time)
    #: when the worker took the job from the queue and began running it (None: still queued)
    started: float | None = None
    completed: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    #: frames the pipeline generates (num_frames aligned up to 8k+1)
    effective_frames: int | None = None
    #: sglang fields the request set that this engine does not implement
    ignored_fields: list[str] = field(default_factory=list)
    slowed: bool = False  # the test-only injected slowdown applied to this run
    #: None (not profiled) or {"all_stages": bool, "num_profiled_timesteps": int | None}
    profile: dict[str, Any] | None = None
    #: what the profiler wrote (mode, path, size), for the record
    trace: TraceInfo | None = None
    #: 0-based index among measured requests (0: the cold request); None for the warmup
    measured_index: int | None = None
    #: the allocator snapshot written after this request (:class:`.profiling.SnapshotRecorder`), if one was asked
    memory_snapshot: dict[str, Any] | None = None


def append_line(path: Path, obj: dict[str, Any]) -> None:
    """Append ``obj`` to ``path`` as one whole JSON line (one ``os.write`` of an O_APPEND fd)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(obj, default=_json_default) + "\n").encode())
    finally:
        os.close(fd)


def _json_default(o: Any) -> Any:
    return o.item() if isinstance(o, (np.floating, np.integer)) else str(o)


def job_record(
    job: Job,
    res: RunResult | None,
    peak: dict[str, float] | None,
    *,
    snapshots: dict[str, dict[str, float] | None],
    info: dict[str, Any],
    commit_hash: str | None,
) -> dict[str, Any]:
    """The ``performance.log`` object of one finished job: sglang's per-request layout
    (request_id, timestamp, commit_hash, tag, stages, steps, total_duration_ms,
    memory_snapshots in MiB) plus the ``perfkit`` object (shape, compiles, host memory in MiB,
    stage spans, and the job's ``t_submitted``/``t_started``/``t_completed`` in epoch seconds).
    ``snapshots``: the engine's load/warmup snapshots; ``peak``: this run's runtime peak."""
    snaps = {k: v for k, v in snapshots.items() if v is not None}
    if peak is not None:
        snaps["runtime_peak"] = peak
    rec: dict[str, Any] = {
        "request_id": job.id,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "commit_hash": commit_hash,
        "tag": job.tag,
        "stages": [],
        "steps": [],
        "total_duration_ms": None,
        "memory_snapshots": snaps,
    }
    pk: dict[str, Any] = {
        "status": job.status,
        "error": job.error,
        "num_frames_requested": job.req.num_frames,
        **{k: getattr(job.req, k) for k in ("height", "width", "num_inference_steps", "guidance_scale")},
        "stage_timing": job.req.timing_mode,
        "ignored_fields": job.ignored_fields,
        **host_memory(),
        **info,
    }
    if "debug_stage_delay_pct" in info:
        pk["debug_stage_delay_applied"] = job.slowed
        if res is not None and res.injected:  # stage -> [its own work, busy time added] (ms)
            pk["debug_stage_delay_ms"] = {k: [round(x, 3) for x in v] for k, v in res.injected.items()}
        if res is not None and res.injected_wall:
            pk["debug_stage_delay_wall_ms"] = {k: round(v, 3) for k, v in res.injected_wall.items()}
    pk.update({"t_submitted": job.created, "t_started": job.started, "t_completed": job.completed})
    if job.measured_index is not None:
        pk["request_index"] = job.measured_index
    if job.memory_snapshot is not None:
        pk["memory_snapshot"] = job.memory_snapshot
    if job.trace is not None:  # sglang's profile fields: what was profiled and where it went
        pk["profile"] = {**dataclasses.asdict(job.trace), "rank": 0}  # traced by the serving rank 0
    if res is not None:
        run = run_fields(res)
        rec.update({k: run.pop(k) for k in ("stages", "steps", "total_duration_ms")})  # sglang's
        pk.update(
            {
                "num_frames_effective": res.effective_frames,
                "latent_shape": res.latent_shape,
                "latent_frames": res.latent_shape[1] if res.latent_shape else None,
                **run,
                "recompile_limit_hit": res.compile.limit_hit,
                "recompile_limit_stage": res.compile.limit_stage,
                "compile_by_stage": {
                    k: {**v, "compile_ms": round(v["compile_ms"], 3)} for k, v in res.compile.by_stage.items()
                },
                "stage_peak_reserved_mb": {
                    s.name: round(s.peak_reserved_mb, 2) for s in res.stages if s.peak_reserved_mb is not None
                },
                "stage_spans": [{"name": s.name, "t_start": s.t_start, "t_end": s.t_end} for s in res.stages],
            }
        )
        if res.compile.limit_hit:
            log.warning(
                "request %s hit the recompile limit in %s: frames now run eagerly",
                job.id,
                res.compile.limit_stage or "a stage not known",
            )
        if res.ranks:
            # CFG parallel: stages/steps are rank 0's, memory the max across ranks (docs/refengine.md)
            res.ranks[0]["memory_snapshots"] = dict(snaps)
            rec["memory_snapshots"] = max_snapshots([r.get("memory_snapshots") or {} for r in res.ranks])
            pk["ranks"] = res.ranks
    rec["perfkit"] = pk
    return rec


def job_body(job: Job) -> dict[str, Any]:
    """The /v1/videos answer: sglang's video object plus ``started_at``, ``perfkit_times`` (the
    job's clock, epoch s) and the effective shape (``num_frames`` aligned, ``num_frames_requested``,
    ``alignment_note``: ``"num_frames 24 aligned up to 25 (LTX: 8k+1 frames)"``, else empty)."""
    body: dict[str, Any] = {"id": job.id, "object": "video", "status": job.status}
    body.update({"created_at": int(job.created), "error": job.error})
    if job.started is not None:
        body["started_at"] = int(job.started)
    if job.completed:
        body["completed_at"] = int(job.completed)
    r = job.req
    effective = job.effective_frames if job.effective_frames is not None else r.num_frames
    note = f"num_frames {r.num_frames} aligned up to {effective} (LTX: 8k+1 frames)"
    body.update(
        # sglang's *_at are whole seconds; the job's clock to the microsecond (sub-second queue waits)
        perfkit_times={"submitted": job.created, "started": job.started, "completed": job.completed},
        num_frames=effective,
        num_frames_requested=r.num_frames,
        alignment_note=note if effective != r.num_frames else "",
        height=r.height,
        width=r.width,
        size=f"{r.width}x{r.height}",
        num_inference_steps=r.num_inference_steps,
        ignored_fields=job.ignored_fields,
    )
    if job.result is not None:
        # no duration (failed before its stages ran): None, as sglang's failed jobs, never 0 s
        ms = job.result["total_duration_ms"]
        body["inference_time_s"] = None if ms is None else ms / 1000.0
    return body

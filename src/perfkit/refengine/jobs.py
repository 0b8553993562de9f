"""A reference engine request, what running it produced, and its job: bookkeeping, its
``performance.log`` record and ``/v1/videos`` answer (docs/refengine.md, "Serving and jobs").
Sizes in pixels, times in ms, memory in MiB."""

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
    """One video request (sglang's /v1/videos fields), frames as requested."""

    prompt: str
    num_frames: int
    height: int
    width: int
    num_inference_steps: int
    seed: int = 0
    guidance_scale: float = 3.0
    negative_prompt: str = ""
    fps: int = 24
    stage_timing: bool | str = True

    @property
    def timing_mode(self) -> str:
        """``events``, ``sync`` or ``off``."""
        return {False: "off", "off": "off", "sync": "sync"}.get(self.stage_timing, "events")


@dataclass
class StageResult:
    """One stage's time (ms), start and end (epoch s) and CUDA peaks (MiB; None: not CUDA)."""

    name: str
    ms: float
    t_start: float
    t_end: float
    peak_allocated_mb: float | None = None
    peak_reserved_mb: float | None = None


@dataclass
class RunResult:
    """What one pipeline run produced (ms, epoch s)."""

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
    #: multi-rank engines: every rank's report, filled on rank 0
    ranks: list[dict[str, Any]] | None = None
    #: CFG parallel, per step: this rank's transformer time and all_gather wait
    cfg_compute_ms: list[float] = field(default_factory=list)
    cfg_gather_ms: list[float] = field(default_factory=list)
    #: test-only injected slowdown: stage -> [work, injected] ms (thread CPU time on a CPU device)
    injected: dict[str, list[float]] = field(default_factory=dict)
    injected_wall: dict[str, float] = field(default_factory=dict)


def run_fields(res: RunResult) -> dict[str, Any]:
    """The fields of a run that a record and a rank report share: sglang's stages, steps and
    total_duration_ms, then perfkit's refinement steps, stage peaks, compile window and span."""
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
    """This process's ``host_rss_mib`` and ``host_anon_mib`` (RssAnon; None where the kernel has none)."""
    anon = None
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        anon = next((int(ln.split()[1]) / 1024.0 for ln in fh if ln.startswith("RssAnon:")), None)
    rss = psutil.Process().memory_info().rss / 2**20
    return {"host_rss_mib": round(rss, 2), "host_anon_mib": None if anon is None else round(anon, 2)}


@dataclass
class Job:
    """One request's job: what was asked, its status, and when it was created (submitted), started
    (taken from the queue) and completed, epoch s."""

    id: str
    req: GenRequest
    tag: str = "request"
    status: str = "queued"
    error: str | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    completed: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    #: num_frames aligned up to 8k+1
    effective_frames: int | None = None
    ignored_fields: list[str] = field(default_factory=list)
    slowed: bool = False  # the test-only injected slowdown applied
    profile: dict[str, Any] | None = None
    trace: TraceInfo | None = None
    #: 0-based index among measured requests (0: the cold request); None for the warmup
    measured_index: int | None = None
    memory_snapshot: dict[str, Any] | None = None


def append_line(path: Path, obj: dict[str, Any]) -> None:
    """Append ``obj`` to ``path`` as one whole JSON line (one ``os.write`` to an O_APPEND fd)."""
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
    """The ``performance.log`` object of one finished job: sglang's per-request layout plus the
    ``perfkit`` object. ``snapshots``: the engine's load/warmup snapshots; ``peak``: this run's."""
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
        if res is not None and res.injected:
            pk["debug_stage_delay_ms"] = {k: [round(x, 3) for x in v] for k, v in res.injected.items()}
        if res is not None and res.injected_wall:
            pk["debug_stage_delay_wall_ms"] = {k: round(v, 3) for k, v in res.injected_wall.items()}
    pk.update({"t_submitted": job.created, "t_started": job.started, "t_completed": job.completed})
    if job.measured_index is not None:
        pk["request_index"] = job.measured_index
    if job.memory_snapshot is not None:
        pk["memory_snapshot"] = job.memory_snapshot
    if job.trace is not None:  # traced by the serving rank 0
        pk["profile"] = {**dataclasses.asdict(job.trace), "rank": 0}
    if res is not None:
        run = run_fields(res)
        rec.update({k: run.pop(k) for k in ("stages", "steps", "total_duration_ms")})
        pk.update(
            num_frames_effective=res.effective_frames,
            latent_shape=res.latent_shape,
            latent_frames=res.latent_shape[1] if res.latent_shape else None,
            **run,
            recompile_limit_hit=res.compile.limit_hit,
            recompile_limit_stage=res.compile.limit_stage,
            compile_by_stage={
                k: {**v, "compile_ms": round(v["compile_ms"], 3)} for k, v in res.compile.by_stage.items()
            },
            stage_peak_reserved_mb={
                s.name: round(s.peak_reserved_mb, 2) for s in res.stages if s.peak_reserved_mb is not None
            },
            stage_spans=[{"name": s.name, "t_start": s.t_start, "t_end": s.t_end} for s in res.stages],
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
    job's clock, epoch s) and the effective shape."""
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
        # failed before its stages ran: None, as sglang's failed jobs, never 0 s
        ms = job.result["total_duration_ms"]
        body["inference_time_s"] = None if ms is None else ms / 1000.0
    return body

"""HTTP front of the reference engine (FastAPI), speaking sglang's /v1/videos protocol.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/videos`` (returns id and status),
``GET /v1/videos/{id}``. One pipeline run at a time: a single worker thread takes jobs from a
queue, so concurrent requests queue and are never interleaved. Every run (startup warmup included)
appends one whole JSON line to ``performance.log`` (sglang's per-request layout + ``perfkit``).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from perfkit.common.recordformat import PERF_LOG_NAME
from perfkit.refengine.memory import max_snapshots, snapshot
from perfkit.refengine.pipeline import GenRequest, RunResult, StagedPipeline, host_memory_mib, record_payload

log = logging.getLogger(__name__)
MIB = 2**20


class VideoRequest(BaseModel):
    """sglang's /v1/videos request fields (unknown fields are ignored, as a server would)."""

    model_config = ConfigDict(extra="ignore", strict=False)

    prompt: str = Field(min_length=1)
    num_frames: int | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    seed: int = 0
    guidance_scale: float = 3.0
    negative_prompt: str = ""
    fps: int = Field(default=24, ge=1)
    size: str | None = None
    #: perfkit extension: synchronise and time each stage (default on).
    perfkit_stage_timing: bool = True


@dataclass
class Job:
    id: str
    req: GenRequest
    tag: str = "request"
    status: str = "queued"
    error: str | None = None
    created: float = field(default_factory=time.time)
    completed: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    slowed: bool = False  # the test-only injected slowdown applied to this run


class PerfLogWriter:
    """Appends whole lines to DIR/performance.log (one ``os.write`` of an O_APPEND fd per line)."""

    def __init__(self, directory: str | Path | None):
        self.path = Path(directory) / PERF_LOG_NAME if directory else None
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, obj: dict[str, Any]) -> None:
        if not self.path:
            return
        data = (json.dumps(obj, default=_json_default) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


class Engine:
    """The serving state: pipeline, job table, worker thread, record writer.

    Args:
        pipeline: the staged pipeline.
        defaults: serving defaults {height, width, steps, num_frames}.
        max_frames: largest num_frames accepted (larger is a 400 naming the field).
        perf_log_dir: where performance.log goes (None: no records).
        info: engine facts copied into each record (device, placement, preset, ...).
        keep_outputs_dir: where generated frames are saved as .npy (None: discarded).
        debug_leak_mib: test-only: keep this many MiB alive per request (host, and device
            memory on CUDA) to exercise leak checks.
        debug_stage_delay_from: test-only: the pipeline's ``stage_delay`` applies to measured
            requests (tag ``request``, never the startup warmup) from this 0-based index on
            (0: all, 1: warm requests only).
    """

    def __init__(
        self,
        pipeline: StagedPipeline,
        defaults: dict[str, int],
        max_frames: int,
        perf_log_dir: str | None,
        info: dict[str, Any],
        keep_outputs_dir: str | None = None,
        debug_leak_mib: int = 0,
        commit_hash: str | None = None,
        debug_stage_delay_from: int = 0,
    ):
        self.pipeline = pipeline
        self.defaults = defaults
        self.max_frames = max_frames
        self.writer = PerfLogWriter(perf_log_dir)
        self.info = info
        self.keep_dir = Path(keep_outputs_dir) if keep_outputs_dir else None
        self.debug_leak_mib = debug_leak_mib
        self.commit_hash = commit_hash
        self.debug_stage_delay_from = debug_stage_delay_from
        self._measured = 0  # measured requests run so far (the startup warmup is not one)
        self.jobs: dict[str, Job] = {}
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.ready = False
        self.snapshots: dict[str, dict[str, float] | None] = {}
        self._leaks: list[Any] = []
        self._worker = threading.Thread(target=self._loop, name="pipeline-worker", daemon=True)
        self._worker.start()

    # -- validation --------------------------------------------------------------------
    def to_gen_request(self, vr: VideoRequest) -> GenRequest:
        """Fill defaults and check limits.

        Raises:
            FieldError: naming the field that is out of range.
        """
        h, w = vr.height, vr.width
        if vr.size and (h is None and w is None):
            try:
                w_s, h_s = vr.size.lower().split("x")
                w, h = int(w_s), int(h_s)
            except ValueError:
                raise FieldError("size", f"must look like WIDTHxHEIGHT, got {vr.size!r}") from None
        h = self.defaults["height"] if h is None else h
        w = self.defaults["width"] if w is None else w
        nf = self.defaults["num_frames"] if vr.num_frames is None else vr.num_frames
        steps = self.defaults["steps"] if vr.num_inference_steps is None else vr.num_inference_steps
        if nf < 1 or nf > self.max_frames:
            raise FieldError("num_frames", f"must be between 1 and {self.max_frames}, got {nf}")
        for name, val in (("height", h), ("width", w)):
            if val < 32 or val % 32:
                raise FieldError(name, f"must be a positive multiple of 32, got {val}")
        if steps < 1:
            raise FieldError("num_inference_steps", f"must be >= 1, got {steps}")
        if vr.guidance_scale < 0:
            raise FieldError("guidance_scale", f"must be >= 0, got {vr.guidance_scale}")
        return GenRequest(
            prompt=vr.prompt,
            num_frames=nf,
            height=h,
            width=w,
            num_inference_steps=steps,
            seed=vr.seed,
            guidance_scale=vr.guidance_scale,
            negative_prompt=vr.negative_prompt,
            fps=vr.fps,
            stage_timing=vr.perfkit_stage_timing,
        )

    # -- jobs --------------------------------------------------------------------------
    def submit(self, req: GenRequest, tag: str = "request") -> Job:
        job = Job(id=f"video_{uuid.uuid4().hex[:16]}", req=req, tag=tag)
        self.jobs[job.id] = job
        self.queue.put(job)
        return job

    def run_sync(self, req: GenRequest, tag: str) -> Job:
        """Submit and wait (used by the startup warmup)."""
        job = self.submit(req, tag)
        job.done.wait()
        return job

    def _loop(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            self._execute(job)

    def _execute(self, job: Job) -> None:
        job.status = "in_progress"
        dev = self.pipeline.device
        res: RunResult | None = None
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        slow = False
        if job.tag != "warmup":
            slow = self._measured >= self.debug_stage_delay_from
            self._measured += 1
        job.slowed = slow
        try:
            res = self.pipeline.run(job.req, keep_output=self.keep_dir is not None, slow=slow)
            job.status = "completed"
            if self.keep_dir is not None and res.video is not None:
                self.keep_dir.mkdir(parents=True, exist_ok=True)
                np.save(self.keep_dir / f"{job.id}.npy", res.video)
                res.video = None
            if self.debug_leak_mib > 0:
                self._leak(self.debug_leak_mib)
        except torch.OutOfMemoryError as exc:
            job.status = "failed"
            job.error = f"out of device memory: {str(exc).splitlines()[0]}"
            log.error("request %s: %s", job.id, job.error)
        except Exception as exc:  # noqa: BLE001 - any failure is the request's, not the server's
            job.status = "failed"
            job.error = f"{type(exc).__name__}: {exc}"
            log.exception("request %s failed", job.id)
        finally:
            peak = snapshot(dev)
            if dev.type == "cuda":
                torch.cuda.empty_cache() if job.status == "failed" else None
            job.completed = time.time()
            try:
                self._write_record(job, res, peak)
            except Exception:  # noqa: BLE001
                log.exception("could not write the record of %s", job.id)
            job.done.set()

    def _leak(self, mib: int) -> None:
        buf = np.ones(mib * MIB, dtype=np.uint8)  # touched pages: counts in anonymous RSS
        self._leaks.append(buf)
        if self.pipeline.device.type == "cuda":
            self._leaks.append(torch.ones(mib * MIB, dtype=torch.uint8, device=self.pipeline.device))

    def _write_record(self, job: Job, res: RunResult | None, peak: dict[str, float] | None) -> None:
        rss, anon = host_memory_mib()
        snaps = {k: v for k, v in self.snapshots.items() if v is not None}
        if peak is not None:
            snaps["runtime_peak"] = peak
        rec: dict[str, Any] = {
            "request_id": job.id,
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "commit_hash": self.commit_hash,
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
            "height": job.req.height,
            "width": job.req.width,
            "num_inference_steps": job.req.num_inference_steps,
            "guidance_scale": job.req.guidance_scale,
            "stage_timing": job.req.stage_timing,
            "host_rss_mib": round(rss, 2),
            "host_anon_mib": round(anon, 2),
            **self.info,
        }
        if "debug_stage_delay_pct" in self.info:
            pk["debug_stage_delay_applied"] = job.slowed
            if res is not None and res.injected:  # stage -> [its own work, busy time added] (ms)
                pk["debug_stage_delay_ms"] = {k: [round(x, 3) for x in v] for k, v in res.injected.items()}
        if res is not None:
            rec.update(record_payload(res))
            pk.update(
                {
                    "num_frames_effective": res.effective_frames,
                    "latent_shape": res.latent_shape,
                    "latent_frames": res.latent_shape[1] if res.latent_shape else None,
                    "compiles": res.compile.compiles,
                    "compile_ms": round(res.compile.compile_ms, 3),
                    "recompile_reasons": res.compile.reasons,
                    "recompile_limit_hit": res.compile.limit_hit,
                    "refinement_steps": [round(x, 3) for x in res.refinement_steps],
                    "stage_peak_allocated_mb": {
                        s.name: round(s.peak_allocated_mb, 2)
                        for s in res.stages
                        if s.peak_allocated_mb is not None
                    },
                    "stage_peak_reserved_mb": {
                        s.name: round(s.peak_reserved_mb, 2)
                        for s in res.stages
                        if s.peak_reserved_mb is not None
                    },
                    "stage_spans": [
                        {"name": s.name, "t_start": s.t_start, "t_end": s.t_end} for s in res.stages
                    ],
                    "t_start": res.t_start,
                    "t_end": res.t_end,
                }
            )
            if res.compile.limit_hit:
                log.warning("request %s hit the recompile limit: frames now run eagerly", job.id)
            if res.ranks:
                # multi-rank (CFG parallel): stages/steps above are rank 0's (it serves, decodes, and
                # its steps include waiting for the peer's branch); memory is the max across ranks,
                # as sglang records it; every rank's own numbers are under perfkit.ranks
                res.ranks[0]["memory_snapshots"] = dict(snaps)
                rec["memory_snapshots"] = max_snapshots([r.get("memory_snapshots") or {} for r in res.ranks])
                pk["ranks"] = res.ranks
        rec["perfkit"] = pk
        job.result = rec
        self.writer.write(rec)


class FieldError(ValueError):
    """A request field out of range; ``field`` names it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def _job_body(job: Job) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": job.id,
        "object": "video",
        "status": job.status,
        "created_at": int(job.created),
        "error": job.error,
    }
    if job.completed:
        body["completed_at"] = int(job.completed)
    r = job.req
    body.update(
        {
            "num_frames": r.num_frames,
            "height": r.height,
            "width": r.width,
            "num_inference_steps": r.num_inference_steps,
        }
    )
    if job.result is not None:
        body["inference_time_s"] = (job.result.get("total_duration_ms") or 0) / 1000.0
    return body


def create_app(engine: Engine, model_name: str) -> FastAPI:
    """The FastAPI application for ``engine``."""
    app = FastAPI(title="perfkit reference engine")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        parts = []
        for e in errs:
            loc = [str(x) for x in e.get("loc", []) if x != "body"]
            parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg')}")
        fields = [".".join(str(x) for x in e.get("loc", []) if x != "body") for e in errs]
        return JSONResponse(
            status_code=400,
            content={
                "error": {"message": "; ".join(parts), "fields": fields, "type": "invalid_request_error"}
            },
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.ready:
            return JSONResponse(status_code=503, content={"status": "warming up"})
        fatal = getattr(engine.pipeline, "fatal", None)  # multi-rank engine after a rank failed
        if fatal:
            return JSONResponse(status_code=503, content={"status": "failed", "error": fatal})
        return JSONResponse(content={"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "owned_by": "perfkit",
                    **{k: v for k, v in engine.info.items() if k != "device"},
                }
            ],
        }

    @app.post("/v1/videos")
    async def create_video(body: VideoRequest) -> JSONResponse:
        try:
            req = engine.to_gen_request(body)
        except FieldError as exc:
            return JSONResponse(
                status_code=400,
                content={
                    "error": {"message": str(exc), "fields": [exc.field], "type": "invalid_request_error"}
                },
            )
        job = engine.submit(req)
        return JSONResponse(status_code=200, content=_job_body(job))

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str) -> JSONResponse:
        job = engine.jobs.get(video_id)
        if job is None:
            return JSONResponse(
                status_code=404, content={"error": {"message": f"video {video_id!r} not found"}}
            )
        return JSONResponse(content=_job_body(job))

    return app

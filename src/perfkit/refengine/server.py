"""HTTP front of the reference engine (FastAPI), speaking sglang's /v1/videos protocol:
:class:`Engine` runs one request at a time and appends each run's record to ``performance.log``
(docs/refengine.md, "Serving and jobs"; profiled requests: docs/below-the-stage.md)."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, create_model

from perfkit.common import PERF_LOG_NAME
from perfkit.common.frames import PIXEL_MULTIPLE, align_frames
from perfkit.common.slugs import did_you_mean
from perfkit.refengine.jobs import GenRequest, Job, RunResult, append_line, job_body, job_record
from perfkit.refengine.pipeline import StagedPipeline
from perfkit.refengine.profiling import (
    MIB,
    RequestProfiler,
    SnapshotRecorder,
    TraceInfo,
    profile_mode,
    profiled_steps,
    snapshot,
)

log = logging.getLogger(__name__)


#: the fields this engine acts on (the rest of :data:`SGLANG_VIDEO_FIELDS` is ignored)
USED_FIELDS = frozenset(
    "prompt num_frames seconds height width size num_inference_steps seed guidance_scale negative_prompt "
    "fps n num_outputs_per_prompt profile num_profiled_timesteps profile_all_stages perfkit_stage_timing".split()
)
DEFAULT_FPS = 24
#: most denoising steps a request may ask for: the scheduler's 1000 training timesteps
MAX_STEPS = 1000


class _VideoRequestBase(BaseModel):
    # a NaN guidance_scale would pass "must be >= 0"
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)

    def ignored_fields(self) -> list[str]:
        """sglang fields this request sets, off their default, that this engine does not implement."""
        fields = type(self).model_fields
        return [
            n for n in sorted(self.model_fields_set - USED_FIELDS) if getattr(self, n) != fields[n].default
        ]


_S, _I, _F = Optional[str], Optional[int], Optional[float]
#: VideoRequest's fields in sglang's order, then perfkit's: names (space-separated) -> (type, default)
_FIELDS: dict[str, tuple[Any, Any]] = {
    "prompt": (str, Field(min_length=1)),
    "input_reference reference_url video_path video_url model": (_S, None),
    "n": (_I, 1),
    "num_outputs_per_prompt": (_I, None),
    "seconds": (_I, 4),
    "size": (_S, ""),
    "fps": (_I, Field(default=None, ge=1)),
    "num_frames": (_I, None),
    "seed": (Optional[Union[int, list[int]]], 0),
    "generator_device": (_S, "cuda"),
    "width height num_inference_steps": (_I, None),
    "guidance_scale guidance_scale_2 true_cfg_scale": (_F, None),
    "negative_prompt": (_S, None),
    "max_sequence_length": (_I, None),
    "flow_shift": (_F, None),
    "enable_teacache enable_frame_interpolation": (Optional[bool], False),
    "frame_interpolation_exp": (_I, 1),
    "frame_interpolation_scale": (_F, 1.0),
    "frame_interpolation_model_path": (_S, None),
    "enable_upscaling": (Optional[bool], False),
    "upscaling_model_path": (_S, None),
    "upscaling_scale": (_I, 4),
    "output_quality": (_S, "default"),
    "output_compression": (_I, None),
    "output_path": (_S, None),
    "diffusers_kwargs": (Optional[dict[str, Any]], None),
    "task": (_S, None),
    "conditions target": (Optional[Any], None),
    "audio_flow_shift": (_F, None),
    "perf_dump_path": (_S, None),
    "profile": (Optional[StrictBool], False),
    "num_profiled_timesteps": (Optional[StrictInt], None),
    "profile_all_stages": (Optional[StrictBool], False),
    "perfkit_stage_timing": (Union[bool, Literal["events", "sync", "off"]], True),
}

VideoRequest = create_model(
    "VideoRequest",
    __base__=_VideoRequestBase,
    __doc__="""sglang's /v1/videos request plus ``perfkit_stage_timing``; any other field is a 400.""",
    **{name: spec for names, spec in _FIELDS.items() for name in names.split()},
)


#: sglang's ``VideoGenerationsRequest`` fields, in order (multimodal_gen/.../openai/protocol.py)
SGLANG_VIDEO_FIELDS = tuple(n for n in VideoRequest.model_fields if n != "perfkit_stage_timing")


@dataclass(eq=False)
class Engine:
    """The serving state: pipeline, job table, worker thread, performance.log. ``defaults``:
    {height, width, steps, num_frames}; ``info``: engine facts in every record; ``runner``: the
    multi-rank front (None: ``pipeline`` runs alone); ``debug_stage_delay_from``: 0-based index of
    the first measured request the pipeline's test-only ``stage_delay`` applies to."""

    pipeline: StagedPipeline
    defaults: dict[str, int]
    max_frames: int
    perf_log_dir: str | None
    info: dict[str, Any]
    runner: Any = None
    keep_outputs_dir: str | None = None
    debug_leak_mib: int = 0
    commit_hash: str | None = None
    debug_stage_delay_from: int = 0
    snapshot_recorder: SnapshotRecorder | None = None

    def __post_init__(self) -> None:
        self.perf_log = Path(self.perf_log_dir) / PERF_LOG_NAME if self.perf_log_dir else None
        if self.perf_log is not None:
            self.perf_log.parent.mkdir(parents=True, exist_ok=True)
        self.keep_dir = Path(self.keep_outputs_dir) if self.keep_outputs_dir else None
        self._measured = 0  # measured requests run so far (not the startup warmup)
        self.jobs: dict[str, Job] = {}
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.ready = False
        self.snapshots: dict[str, dict[str, float] | None] = {}
        self._leaks: list[Any] = []
        self._worker = threading.Thread(target=self._loop, name="pipeline-worker", daemon=True)
        self._worker.start()

    def to_gen_request(self, vr: VideoRequest) -> GenRequest:
        """Fill defaults (frames: ``num_frames``, else ``seconds`` x ``fps``; pixels: ``height``/``width``,
        else ``size``) and check limits. FieldError: a field out of range or not honoured (``n`` > 1)."""
        h, w = vr.height, vr.width
        if vr.size and (h is None and w is None):
            try:
                w_s, h_s = vr.size.lower().split("x")
                w, h = int(w_s), int(h_s)
            except ValueError:
                raise FieldError("size", f"must look like WIDTHxHEIGHT, got {vr.size!r}") from None
        h = self.defaults["height"] if h is None else h
        w = self.defaults["width"] if w is None else w
        fps = DEFAULT_FPS if vr.fps is None else vr.fps
        nf = self.defaults["num_frames"] if vr.num_frames is None else vr.num_frames
        if vr.num_frames is None and "seconds" in vr.model_fields_set and vr.seconds is not None:
            nf = vr.seconds * fps
            if nf < 1 or nf > self.max_frames:
                raise FieldError(
                    "seconds",
                    f"{vr.seconds} s at {fps} fps is {nf} frames; must be between 1 and "
                    f"{self.max_frames} frames (or give num_frames)",
                )
        if nf < 1 or nf > self.max_frames:
            raise FieldError("num_frames", f"must be between 1 and {self.max_frames}, got {nf}")
        steps = self.defaults["steps"] if vr.num_inference_steps is None else vr.num_inference_steps
        for name, val in (("height", h), ("width", w)):
            if val < PIXEL_MULTIPLE or val % PIXEL_MULTIPLE:
                raise FieldError(name, f"must be a positive multiple of {PIXEL_MULTIPLE}, got {val}")
        if steps < 1 or steps > MAX_STEPS:
            raise FieldError("num_inference_steps", f"must be between 1 and {MAX_STEPS}, got {steps}")
        guidance = 3.0 if vr.guidance_scale is None else vr.guidance_scale
        if guidance < 0:
            raise FieldError("guidance_scale", f"must be >= 0, got {guidance}")
        for name in ("n", "num_outputs_per_prompt"):
            count = getattr(vr, name)
            if count is not None and count != 1:
                raise FieldError(name, f"the reference engine makes one video per request, got {count}")
        if vr.profile and not vr.profile_all_stages:
            try:
                profiled_steps(vr.num_profiled_timesteps, steps)
            except ValueError as exc:
                raise FieldError("num_profiled_timesteps", str(exc).split(": ", 1)[1]) from None
        seed = vr.seed
        if isinstance(seed, list):
            if len(seed) != 1:
                raise FieldError("seed", f"one seed per request (one video), got {len(seed)} seeds")
            seed = seed[0]
        return GenRequest(
            prompt=vr.prompt,
            num_frames=nf,
            height=h,
            width=w,
            num_inference_steps=steps,
            seed=0 if seed is None else seed,
            guidance_scale=guidance,
            negative_prompt=vr.negative_prompt or "",
            fps=fps,
            stage_timing=vr.perfkit_stage_timing,
        )

    def submit(
        self,
        req: GenRequest,
        tag: str = "request",
        ignored_fields: list[str] | None = None,
        profile: dict[str, Any] | None = None,
    ) -> Job:
        """Queue one run. ``profile``: {all_stages, num_profiled_timesteps} when profiled, else None."""
        job = Job(
            id=f"video_{uuid.uuid4().hex[:16]}",
            req=req,
            tag=tag,
            effective_frames=align_frames(req.num_frames, self.pipeline.temporal),
            ignored_fields=list(ignored_fields or []),
            profile=profile,
        )
        self.jobs[job.id] = job
        self.queue.put(job)
        return job

    def _loop(self) -> None:
        while (job := self.queue.get()) is not None:
            self._execute(job)

    def _execute(self, job: Job) -> None:
        job.started = time.time()  # queue wait ends, service begins
        job.status = "in_progress"
        dev = self.pipeline.device
        res: RunResult | None = None
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        index = None if job.tag == "warmup" else self._measured  # 0: the cold request
        job.slowed = slow = index is not None and index >= self.debug_stage_delay_from
        self._measured += index is not None
        profiler = self._start_profiler(job) if job.profile is not None else None
        self.pipeline.profiler = profiler
        try:
            try:
                run = (self.runner or self.pipeline).run
                res = run(job.req, keep_output=self.keep_dir is not None, slow=slow)
            finally:  # the trace is written before the request reads as done
                self.pipeline.profiler = None
                if profiler is not None:
                    job.trace = profiler.finish()
            job.status = "completed"
            if self.keep_dir is not None and res.video is not None:
                self.keep_dir.mkdir(parents=True, exist_ok=True)
                np.save(self.keep_dir / f"{job.id}.npy", res.video)
                res.video = None
            if self.debug_leak_mib > 0:
                inject_debug_leak(self._leaks, self.debug_leak_mib, self.pipeline.device)
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
            if dev.type == "cuda" and job.status == "failed":
                torch.cuda.empty_cache()
            if index is not None and self.snapshot_recorder is not None:
                job.memory_snapshot = self.snapshot_recorder.after_request(index)
            job.measured_index = index
            job.completed = time.time()
            try:
                job.result = job_record(
                    job,
                    res,
                    peak,
                    snapshots=self.snapshots,
                    info=self.info,
                    commit_hash=self.commit_hash,
                )
                if self.perf_log is not None:
                    append_line(self.perf_log, job.result)
            except Exception:  # noqa: BLE001
                log.exception("could not write the record of %s", job.id)
            job.done.set()

    def _start_profiler(self, job: Job) -> RequestProfiler | None:
        """The request's profiler, or None (``job.trace.error`` says why) when it cannot start."""
        steps = job.req.num_inference_steps
        try:  # the serving process is global rank 0 (the trace's name says it)
            return RequestProfiler(job.id, **job.profile, num_inference_steps=steps)
        except Exception as exc:  # noqa: BLE001 - profiling must never fail the request
            log.exception("request %s: the profiler did not start", job.id)
            mode = profile_mode(**job.profile, num_inference_steps=steps)
            job.trace = TraceInfo(mode, None, None, 0, f"{type(exc).__name__}: {exc}")
            return None


def inject_debug_leak(keep: list[Any], mib: int, device: torch.device) -> None:
    """TEST ONLY: keep ``mib`` MiB alive in ``keep`` (host, and CUDA ``device``); a function of its
    own so that an allocator snapshot names it as the site."""
    keep.append(np.ones(mib * MIB, dtype=np.uint8))
    if device.type == "cuda":
        keep.append(torch.ones(mib * MIB, dtype=torch.uint8, device=device))


class FieldError(ValueError):
    """A request field out of range; ``field`` names it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def _invalid_request(message: str, fields: list[str]) -> JSONResponse:
    error = {"message": message, "fields": fields, "type": "invalid_request_error"}
    return JSONResponse(status_code=400, content={"error": error})


def create_app(engine: Engine, model_name: str) -> FastAPI:
    """The FastAPI application for ``engine``."""
    app = FastAPI(title="perfkit reference engine")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        parts, fields = [], []
        for e in errs:
            if e.get("type") == "json_invalid":  # its loc is ("body", character offset), not a field
                pos = next((x for x in e.get("loc", [])[1:] if isinstance(x, int)), None)
                where = f" at character {pos}" if pos is not None else ""
                why = (e.get("ctx") or {}).get("error") or e.get("msg")
                parts.append(f"body: invalid JSON{where}: {why}")
                fields.append("body")
                continue
            loc = [str(x) for x in e.get("loc", []) if x != "body"]
            name = ".".join(loc) or "body"
            fields.append(".".join(loc))
            if e.get("type") == "extra_forbidden":
                parts.append(f"{name}: unknown field{did_you_mean(name, VideoRequest.model_fields)}")
            else:
                parts.append(f"{name}: {e.get('msg')}")
        return _invalid_request("; ".join(parts), fields)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.ready:
            return JSONResponse(status_code=503, content={"status": "warming up"})
        fatal = engine.runner and engine.runner.fatal  # multi-rank engine after a rank failed
        if fatal:
            return JSONResponse(status_code=503, content={"status": "failed", "error": fatal})
        return JSONResponse(content={"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        facts = {k: v for k, v in engine.info.items() if k != "device"}
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "owned_by": "perfkit", **facts}],
        }

    @app.post("/v1/videos")
    async def create_video(body: VideoRequest) -> JSONResponse:
        try:
            req = engine.to_gen_request(body)
        except FieldError as exc:
            return _invalid_request(str(exc), [exc.field])
        profile = None
        if body.profile:
            profile = {
                "all_stages": bool(body.profile_all_stages),
                "num_profiled_timesteps": body.num_profiled_timesteps,
            }
        job = engine.submit(req, ignored_fields=body.ignored_fields(), profile=profile)
        return JSONResponse(status_code=200, content=job_body(job))

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str) -> JSONResponse:
        job = engine.jobs.get(video_id)
        if job is None:
            return JSONResponse(
                status_code=404, content={"error": {"message": f"video {video_id!r} not found"}}
            )
        return JSONResponse(content=job_body(job))

    return app


def serve_http(engine: Engine, model_name: str, sock: Any, warm: Callable[[], bool]) -> int:
    """Serve the engine's app on ``sock`` until it stops, running ``warm`` (the startup warmup, True
    when it succeeded) once serving starts; then end the queue and other ranks. 0, or 3: warmup failed."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, model_name=model_name), log_level="warning", access_log=False)
    )
    failed: list[bool] = []

    def warm_then_ready() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.01)
        if not warm():
            failed.append(True)
            server.should_exit = True
            return
        engine.ready = True
        if engine.runner is not None:
            engine.runner.ready = True

    threading.Thread(target=warm_then_ready, name="startup-warmup", daemon=True).start()
    server.run(sockets=[sock])
    engine.queue.put(None)
    if engine.runner is not None:
        engine.runner.shutdown()
    return 3 if failed else 0

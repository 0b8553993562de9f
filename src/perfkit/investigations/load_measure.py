"""The load investigation's measuring half: the request trace read, its phases run through the
async client, each request joined with the engine's record into one ``per_request`` row
(docs/load.md)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.common.frames import MAX_FRAMES
from perfkit.common.jsonsafe import unique_keys
from perfkit.common.numfmt import json_float
from perfkit.common.provenance import repo_root
from perfkit.engine.client import AsyncVideoClient, RequestOutcome, VideoRequestSpec, closed_loop, open_loop
from perfkit.investigations.load_stats import capacity_rps, first_error, shape_key
from perfkit.investigations.registry import InvestigationError
from perfkit.measuring.launch_rows import record_rows
from perfkit.readings.records import parse_lines

_MAX_LINES = 100_000
MAX_BYTES = 32 * 2**20
#: the widest or tallest frame a trace line may ask (pixels)
_MAX_PIXELS = 16_384


class _TraceLine(BaseModel):
    """One trace request (vllm-omni's fields; pixels, frames, steps, ms)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # the bounds of perfkit.params.RequestParams
    width: Optional[int] = Field(None, ge=8, le=_MAX_PIXELS)
    height: Optional[int] = Field(None, ge=8, le=_MAX_PIXELS)
    num_frames: Optional[int] = Field(None, gt=0, le=MAX_FRAMES)
    num_inference_steps: Optional[int] = Field(None, gt=0, le=1000)
    #: torch.Generator.manual_seed takes at most 64 bits
    seed: Optional[int] = Field(None, ge=-(2**63), lt=2**64)
    fps: Optional[int] = Field(None, gt=0)
    slo_ms: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    prompt: Optional[str] = None


def read_trace(given: str | Path, base: VideoRequestSpec) -> list[tuple[VideoRequestSpec, float | None]]:
    """The trace's requests in order, each as (request, its slo_ms or None); ``given`` from the
    working directory, else from the checkout. Raises InvestigationError: the file is missing,
    too big, empty, or a line is bad (``trace.jsonl:3: key 'num_frames': ...``)."""
    path = Path(given)
    path = path if path.is_absolute() or path.exists() else repo_root() / path
    try:
        if path.stat().st_size > MAX_BYTES:
            raise InvestigationError(f"trace {path}: {path.stat().st_size:,} bytes, over {MAX_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvestigationError(f"trace {path}: cannot be read: {exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= _MAX_LINES:
            raise InvestigationError(f"{path}: more than {_MAX_LINES} requests")
        try:
            obj = json.loads(line, object_pairs_hook=unique_keys)
        except ValueError as exc:
            raise InvestigationError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise InvestigationError(f"{path}:{n}: a request is a JSON object, got {type(obj).__name__}")
        nulls = [k for k, v in obj.items() if v is None]
        if nulls:
            raise InvestigationError(
                f"{path}:{n}: key {nulls[0]!r}: null is not a value (leave the key out to take the params' request value)"
            )
        try:
            tl = _TraceLine.model_validate(obj)
        except ValidationError as exc:
            raise InvestigationError(f"{path}:{n}: {first_error(exc)}") from None
        fields = {k: v for k, v in tl.model_dump().items() if v is not None and k != "slo_ms"}
        out.append((dataclasses.replace(base, **fields), tl.slo_ms))
    if not out:
        raise InvestigationError(f"{path}: no request in the trace")
    return out


def run_phases(
    base_url: str, p: Any, request: VideoRequestSpec, trace: list, timeout_s: float, alive: Any = None
):
    """Every phase against one engine, ``p`` its ``LoadParams``: ([(phase, level, outcome,
    spec)], why the engine counts as lost or None); once ``alive`` says it is not, the rest
    come back unsent."""

    async def go() -> tuple[list[tuple[str, Any, RequestOutcome, VideoRequestSpec]], str | None]:
        out: list[tuple[str, Any, RequestOutcome, VideoRequestSpec]] = []
        biggest = max([*p.concurrency, 1, p.open_loop_requests])
        async with AsyncVideoClient(base_url, biggest, timeout_s, p.poll_s, alive) as c:
            for i, (spec, _slo) in enumerate(trace):
                out.append(("trace", 1, await c.generate(spec, slot=i), spec))
            for i in range(p.warmup_requests):
                out.append(("warmup", 1, await c.generate(request, slot=i), request))
            for k in p.concurrency:
                specs = [request] * p.requests_per_level
                out += [("closed", k, o, request) for o in await closed_loop(c, specs, k)]
            rate = p.rate_rps
            if rate is None and p.rate_over_capacity is not None:
                cap, _ = capacity_rps([_timing(ph, k, o) for ph, k, o, _ in out])
                rate = p.rate_over_capacity * cap if cap else None
            if rate is not None and not c.lost:
                rng = np.random.default_rng(p.seed)
                arrivals = np.cumsum(rng.exponential(1.0 / rate, p.open_loop_requests)).tolist()
                specs = [request] * p.open_loop_requests
                out += [("open", rate, o, request) for o in await open_loop(c, specs, arrivals)]
        return out, c.lost_why

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    # inside a running event loop (a notebook): on a thread of its own
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="perfkit-load") as ex:
        return ex.submit(lambda: asyncio.run(go())).result()


def _timing(phase: str, level: Any, o: RequestOutcome) -> dict[str, Any]:
    return {"phase": phase, "level": level, "status": o.status, "t_submit_s": o.t_submit,
            "t_arrival_s": o.t_arrival, "t_end_s": o.t_end}  # fmt: skip


def per_request_rows(sent: list, records: list[str], label: str) -> tuple[list[dict], list[dict], list]:
    """(load rows, requests-table rows, [stage rows, step rows]) of the requests sent, joined
    with the engine's records by request id (docs/load.md)."""
    recs = {r.request_id: r for r in parse_lines(records, source=f"records/{label}.jsonl").records}
    load_rows, req_rows, stage_rows, step_rows = [], [], [], []
    for i, (phase, level, o, spec) in enumerate(sent):
        rec = recs.get(o.request_id) if o.request_id else None
        row: dict[str, Any] = {
            "i": i,
            "phase": phase,
            "level": level,
            "slot": o.slot,
            "request_id": o.request_id,
            "status": o.status,
            "error": o.error,
            "shape": shape_key(spec),
            "num_frames": spec.num_frames,
            "t_arrival_s": o.t_arrival,
            "t_submit_s": o.t_submit,
            "t_end_s": o.t_end,
            "e2e_ms": o.client_ms,
            "in_flight_at_submit": o.in_flight_at_submit,
        }
        r: dict[str, Any] = {}
        if rec is not None:
            r, st, sp = record_rows(label, rec, i, None, spec)
            r["client_ms"] = o.client_ms
            req_rows.append(r)
            stage_rows += st
            step_rows += sp
        sub, start, done, server_ms = (
            json_float(r.get(k)) for k in ("submitted_s", "started_s", "completed_s", "e2e_ms")
        )
        row.update(_times(sub, start, done, server_ms, o.client_ms), server_ms=server_ms)
        row.update(latent_shape=r.get("latent_shape"), compiles=r.get("compiles"))
        row.update(engine_started_s=start, engine_completed_s=done)
        job = o.job
        row["job_json_started_s"] = job.started_at_s
        row["job_completed_at_s"] = job.completed_at_s
        row["job_inference_ms"] = job.inference_time_s * 1000.0 if job.inference_time_s is not None else None
        load_rows.append(row)
    return load_rows, req_rows, [stage_rows, step_rows]


def _times(sub, start, done, server_ms, client_ms) -> dict[str, Any]:
    if sub is not None and start is not None and done is not None:
        wait, service, source = (start - sub) * 1000.0, (done - start) * 1000.0, "engine"
    elif server_ms is not None and client_ms >= server_ms:
        wait, service, source = client_ms - server_ms, server_ms, "derived (start not reported)"
    elif server_ms is not None:
        wait, service, source = None, server_ms, "not reported (engine duration above e2e)"
    else:
        wait, service, source = None, None, "not reported"
    return {"queue_wait_ms": wait, "service_ms": service, "start_source": source}

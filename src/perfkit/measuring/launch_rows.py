"""One measured engine launch -> tidy rows (:func:`measure_launch`, :class:`LaunchData`; tables in
:mod:`perfkit.bundle_schema`); startup warmup records have ``index = WARMUP_INDEX`` (-1)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

import pandas as pd

from perfkit.bundle import WARMUP_INDEX
from perfkit.bundle_schema import sampler_frame
from perfkit.checks import reported_count, reported_flag
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import RequestOutcome, VideoClient, VideoRequestSpec
from perfkit.engine.launch import EngineStartError, launch
from perfkit.engine.spec import DEFAULT_REQUEST_TIMEOUT_S, EngineSpec
from perfkit.measuring.progress import launching, track_requests
from perfkit.readings.engine_config import effective_config
from perfkit.readings.records import PERF_LOG_NAME, ParseReport, PerfRecord, parse_lines

log = logging.getLogger(__name__)

NAN = math.nan


@dataclass
class LaunchData:
    """Everything one launch produced: row dicts of the bundle tables, the sampler timeline, raw
    performance.log lines and their parse ``report``, logs, client ``outcomes``, ``error`` (None:
    none), the engine argv and the GPUs it ran on ({index, uuid, name}; [] without NVML)."""

    label: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    launch_row: dict[str, Any] = field(default_factory=dict)
    record_lines: list[str] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    outcomes: list[RequestOutcome] = field(default_factory=list)
    error: str | None = None
    report: ParseReport | None = None
    command: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def sent_rows(self) -> pd.DataFrame:
        """Rows of the requests perfkit sent (failed ones too, no warmup), in index order."""
        df = pd.DataFrame(self.requests)
        if df.empty:
            return df
        return df[df["index"] != WARMUP_INDEX].sort_values("index")


def _num(v: Any) -> float:
    """A record's ms or MiB value as written, NaN when absent or null (not reported)."""
    return NAN if v is None else float(v)


def _epoch(v: Any) -> float:
    """Epoch s as written, NaN when absent; ValueError for anything else."""
    if v is None:
        return NAN
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= float(v) < math.inf):
        raise ValueError(f"job time {v!r} is not epoch seconds")
    return float(v)


def record_rows(
    label: str,
    rec: PerfRecord,
    index: int,
    outcome: RequestOutcome | None,
    request: VideoRequestSpec | None = None,
) -> tuple[dict, list[dict], list[dict]]:
    """Rows (request, stages, steps) of one record and its ``outcome``; not reported: NA."""
    pk = rec.perfkit
    spans = {s["name"]: s for s in pk.get("stage_spans") or [] if isinstance(s, dict)}
    status = pk.get("status") or ("completed" if rec.stages else "unknown")
    if outcome is not None and not outcome.ok:
        status = outcome.status
    row = {
        "launch": label,
        "request_id": rec.request_id,
        "index": index,
        "status": status,
        "error": (outcome.error if outcome is not None else None) or pk.get("error"),
        "num_frames": pk.get("num_frames_requested", request.num_frames if request else None),
        "effective_num_frames": pk.get("num_frames_effective"),
        "latent_frames": pk.get("latent_frames"),
        "latent_shape": "x".join(str(x) for x in pk.get("latent_shape") or []) or None,
        "height": pk.get("height"),
        "width": pk.get("width"),
        "steps": pk.get("num_inference_steps"),
        "client_ms": outcome.client_ms if outcome is not None else NAN,
        "e2e_ms": _num(rec.total_duration_ms),
        "compiles": reported_count(pk.get("compiles")),
        "compile_ms": _num(pk.get("compile_ms")),
        "recompile_reasons": (
            "; ".join(pk["recompile_reasons"]) if pk.get("recompile_reasons") is not None else None
        ),
        "compile_phases": json.dumps(pk["compile_phases_ms"]) if pk.get("compile_phases_ms") else None,
        "recompile_limit_hit": reported_flag(pk.get("recompile_limit_hit")),
        "recompile_limit_stage": pk.get("recompile_limit_stage"),
        "peak_allocated_mib": _num(rec.peak_mb("runtime_peak", "peak_allocated_mb")),
        "peak_reserved_mib": _num(rec.peak_mb("runtime_peak", "peak_reserved_mb")),
        "reserved_mib": _num(rec.peak_mb("runtime_peak", "reserved_mb")),
        "host_rss_mib": _num(pk.get("host_rss_mib")),
        "host_anon_mib": _num(pk.get("host_anon_mib")),
        "placement": pk.get("placement"),
        "t_start_s": pk.get("t_start", outcome.t_submit if outcome else NAN),
        "t_end_s": pk.get("t_end", outcome.t_end if outcome else NAN),
        "submitted_s": _epoch(pk.get("t_submitted")),
        "started_s": _epoch(pk.get("t_started")),
        "completed_s": _epoch(pk.get("t_completed")),
    }
    stage_peaks = pk.get("stage_peak_allocated_mb") or {}
    stages = []
    for name, ms in rec.stages:
        sp = spans.get(name, {})
        stages.append(
            {
                "launch": label,
                "request_id": rec.request_id,
                "index": index,
                "stage": name,
                "ms": ms,
                "peak_allocated_mib": stage_peaks.get(name, NAN),
                "t_start_s": sp.get("t_start", NAN),
                "t_end_s": sp.get("t_end", NAN),
            }
        )
    steps = [
        {
            "launch": label,
            "request_id": rec.request_id,
            "index": index,
            "stage": stage,
            "step": i,
            "ms": None if ms is None else float(ms),
        }
        for stage, seq in (
            ("DenoisingStage", rec.steps),
            ("RefinementStage", pk.get("refinement_steps") or []),
        )
        for i, ms in enumerate(seq)
    ]
    return row, stages, steps


def failed_row(label: str, index: int, outcome: RequestOutcome, request: VideoRequestSpec) -> dict[str, Any]:
    """The row of a request without a record; what only a record reports is NA."""
    return {
        "launch": label,
        "request_id": outcome.request_id or f"{label}-{index}",
        "index": index,
        "status": outcome.status,
        "error": outcome.error,
        "num_frames": request.num_frames,
        "height": request.height,
        "width": request.width,
        "steps": request.num_inference_steps,
        "client_ms": outcome.client_ms,
        "t_start_s": outcome.t_submit,
        "t_end_s": outcome.t_end,
        **dict.fromkeys(_NA_NONE, None),
        **dict.fromkeys(_NA_NAN, NAN),
    }


_NA_NONE = (
    "effective_num_frames latent_frames latent_shape compiles recompile_reasons compile_phases"
    " recompile_limit_hit recompile_limit_stage placement"
).split()
_NA_NAN = (
    "e2e_ms compile_ms peak_allocated_mib peak_reserved_mib reserved_mib host_rss_mib host_anon_mib".split()
)


def measure_launch(
    spec: EngineSpec,
    requests: list[VideoRequestSpec],
    run_dir: Path,
    label: str,
    caps: MemoryCaps | None = None,
    sample_interval_s: float = 0.1,
    request_timeout_s: float | None = None,
    stop_on_failure: bool = False,
    after: Callable[[Any, VideoClient, Any], dict[str, Any]] | None = None,
    turn: Callable[[int], ContextManager[Any]] | None = None,
) -> LaunchData:
    """Launch ``spec`` under ``caps``, send ``requests`` one after the other, tear down. Never raises
    for engine failures: they end the launch with :attr:`LaunchData.error` and the rows so far.
    ``after(handle, client, sampler)`` runs after the requests (its dict: ``extra``, unmeasured);
    ``turn(i)``: a context manager around request ``i`` that may wait (``perfkit ab --paired``)."""
    data = LaunchData(label=label)
    timeout_s = float(request_timeout_s or spec.request_timeout_s or DEFAULT_REQUEST_TIMEOUT_S)
    h = None
    start_dir: Path | None = None
    start_end: dict[str, Any] = {}  # how an engine that never became ready ended
    failed: int | None = None  # the request that ended the launch
    launching(label)
    try:
        with launch(spec, caps=caps, run_dir=run_dir, label=label) as h:
            data.command = list(h.command)
            data.gpus = list(h.gpus)
            sampler = h.sampler(interval_s=sample_interval_s)
            sampler.start()
            try:
                with VideoClient(h.base_url, h.perf_log_dir, timeout_s=timeout_s) as client:
                    for i, req in enumerate(track_requests(requests, label)):
                        with turn(i) if turn is not None else contextlib.nullcontext():
                            out = client.generate(req)
                        data.outcomes.append(out)
                        if not out.ok:
                            log.warning("%s request %d: %s (%s)", label, i, out.status, out.error)
                            # a timeout or a lost engine leaves an unknown state: stop
                            if not h.alive() or stop_on_failure or out.status in ("timeout", "error"):
                                failed = i
                                break
                    if after is not None and h.alive():
                        data.extra = after(h, client, sampler)
            finally:
                sampler.stop()
            mem = sampler_frame(sampler.to_frame())
            mem.insert(0, "launch", label)
            data.memory = mem
            data.launch_row = h.launch_row()
            data.launch_row.update(first_result(data.outcomes, h.cold_start))
            outcome = h.cap_outcome
            if outcome.exceeded:
                data.error = outcome.message
        end = h.end or {}
        data.launch_row.update(_ended(h.exit_code, end), failed_request=failed)
        if failed is not None and data.error is None:
            data.error = failed_launch_text(label, failed, data.outcomes[failed], end)
    except EngineStartError as exc:
        data.error = str(exc)
        log.error("launch %s failed: %s", label, exc)
        start_dir = exc.run_dir  # None: it failed before its directory was made
        end = exc.end or {}
        start_end = {
            **_ended(exc.exit_code, end),
            "cap_exceeded": bool(exc.cap_outcome and exc.cap_outcome.exceeded),
        }
    finally:
        d = Path(h.run_dir) if h is not None else start_dir
        if d is not None:
            for name in ("stdout.log", "stderr.log"):
                p = d / name
                if p.exists():
                    data.logs[f"{label}.{name}"] = p.read_text(errors="replace")[-2_000_000:]
        _read_log(data, h.perf_log_path if h is not None else d / "perf" / PERF_LOG_NAME if d else None)
    if not data.launch_row:
        data.launch_row = {
            "launch": label,
            "label": label,
            "ready_s": NAN,
            "command": " ".join(data.command),
            "device_cap_gib": caps.device_gib if caps else None,
            "host_cap_gib": caps.host_gib if caps else None,
            "error": data.error,
            **start_end,
        }
    if data.error is None and data.outcomes and all(o.status == "rejected" for o in data.outcomes):
        o = data.outcomes[0]
        data.error = (
            f"every request rejected by the engine ({len(data.outcomes)}): HTTP {o.http_status}: {o.error}"
        )
    data.launch_row["error"] = data.error
    _rows(data, requests)

    return data


def _ended(exit_code: int | None, end: dict[str, Any]) -> dict[str, Any]:
    return {
        "exit_code": exit_code,
        "ended": end.get("how"),
        "end_signal": end.get("signal"),
        "end_by_perfkit": end.get("by_perfkit"),
        "oom_record": end.get("oom"),
    }


def failed_launch_text(label: str, index: int, outcome: RequestOutcome, end: dict[str, Any]) -> str:
    """The launch error of a request that ended the launch: the request, what the client saw, how
    the engine ended and its OOM-kill record (docs/robustness.md, "How it ended")."""
    what = {"timeout": "timed out", "error": "failed (engine lost)"}.get(outcome.status, outcome.status)
    rid = f" (id {outcome.request_id})" if outcome.request_id else ""
    text = f"launch {label!r}: request {index}{rid} {what}: {outcome.error or 'no error text'}"
    how = end.get("how")
    if how:
        during = f" during request {index}" if not end.get("by_perfkit") else ""
        text += f"; the engine {how}{during}"
    if end.get("oom"):
        text += f"; OOM-kill record: {end['oom']}"
    return text


def first_result(outcomes: list[RequestOutcome], cold_start: dict[str, Any]) -> dict[str, float]:
    """``first_result_s``, ``first_request_wait_s`` and ``first_request_ms`` of the ``launches``
    table (docs/DESIGN.md, "Words"); NaN when no request succeeded or the launch time is unknown."""
    t_launch, t_ready = cold_start.get("t_launch"), cold_start.get("t_ready")
    ok = next((o for o in outcomes if o.ok), None)
    if ok is None or t_launch is None:
        return {"first_result_s": NAN, "first_request_wait_s": NAN, "first_request_ms": NAN}
    return {
        "first_result_s": ok.t_end - t_launch,
        "first_request_wait_s": ok.t_submit - t_ready if t_ready is not None else NAN,
        "first_request_ms": ok.client_ms,
    }


def _read_log(data: LaunchData, path: Path | None) -> None:
    """The raw lines (non-UTF-8 as ``\\xNN``) and their parse report, from one read."""
    try:
        raw = path.read_bytes().splitlines(keepends=True) if path is not None else []
    except OSError:
        raw = []
    data.record_lines = [
        ln.decode("utf-8", errors="backslashreplace").rstrip("\r\n") for ln in raw if ln.strip()
    ]
    data.report = parse_lines(raw, source=str(path))


def _rows(data: LaunchData, requests: list[VideoRequestSpec]) -> None:
    if data.report is None:
        data.report = parse_lines(data.record_lines, source=f"records/{data.label}.jsonl")
    report = data.report
    recs = {r.request_id: r for r in report.records}
    warm = [r for r in recs.values() if r.is_warmup]
    for rec in warm:
        row, st, sp = record_rows(data.label, rec, WARMUP_INDEX, None)
        data.requests.append(row)
        data.stages += st
        data.steps += sp
        data.launch_row.setdefault("warmup_latent_shape", row["latent_shape"])
    # the last record carries every snapshot (the warmup's own line predates warmup_peak)
    any_rec = next(reversed(list(recs.values())), None)
    if any_rec is not None:
        data.launch_row["load_peak_mib"] = _num(any_rec.peak_mb("load_peak", "peak_reserved_mb"))
        data.launch_row["load_peak_allocated_mib"] = _num(any_rec.peak_mb("load_peak", "peak_allocated_mb"))
        data.launch_row["warmup_peak_mib"] = _num(any_rec.peak_mb("warmup_peak", "peak_reserved_mb"))
        data.launch_row["placement"] = any_rec.perfkit.get("placement")
    cfg = asdict(effective_config(any_rec.perfkit if any_rec is not None else None, data.logs))
    cfg["engine_device"] = cfg.pop("device")
    data.launch_row.update(cfg)
    for i, (out, req) in enumerate(zip(data.outcomes, requests)):
        rec = recs.get(out.request_id) if out.request_id else None
        if rec is None:
            row = failed_row(data.label, i, out, req)
            refused = report.rejected.get(out.request_id) if out.request_id else None
            if refused is not None:  # its record was refused: not measured
                row["status"], row["error"] = "failed", refused
            data.requests.append(row)
            continue
        row, st, sp = record_rows(data.label, rec, i, out, req)
        data.requests.append(row)
        data.stages += st
        data.steps += sp

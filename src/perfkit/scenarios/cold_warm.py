"""Cold vs warm: does the warm request in one server session meet the cold request's numbers,
or does state leak across requests (seed case 000: residency, in-flight copies, host copies)?

One launch; the cold start and its parts; N identical requests. Request 0 is the cold request,
1..N-1 are warm. Reports the first-request penalty per stage, the stage that absorbs most of it,
and leak checks across the warm requests.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.caps import MemoryCaps
from perfkit.client import VideoRequestSpec
from perfkit.engine import EngineSpec
from perfkit.scenarios.common import assemble, json_float, measure_launch, stage_penalty
from perfkit.scenarios.overhead import overhead_probe

log = logging.getLogger(__name__)

#: Leak thresholds used when params give none: MiB per request and fraction of the 2nd request.
DEFAULT_THRESHOLDS = {
    "host_anon_slope_mib_per_request": 16.0,
    "device_reserved_slope_mib_per_request": 16.0,
    "latency_drift": 0.25,
}


def _request(request: VideoRequestSpec | dict | None) -> VideoRequestSpec:
    if request is None:
        return VideoRequestSpec()
    if isinstance(request, dict):
        return VideoRequestSpec.from_dict(request)
    return request


def cold_vs_warm(spec: EngineSpec, request: VideoRequestSpec | dict | None = None, repeats: int = 5,
                 caps: MemoryCaps | None = None, run_dir: str | Path = "outputs/cold_warm",
                 thresholds: dict[str, float] | None = None, sample_interval_s: float = 0.1,
                 overhead_pairs: int = 0) -> ResultBundle:
    """Run the cold vs warm investigation.

    Args:
        spec: the engine.
        request: the request sent ``repeats`` times (same shape, same session).
        repeats: requests in the session (>= 2: one cold, the rest warm).
        caps: memory budget for the launch.
        run_dir: where launch directories go.
        thresholds: leak thresholds (see :data:`DEFAULT_THRESHOLDS`).
        overhead_pairs: when > 0, after the measured requests the same session measures the
            instrumentation's cost (:mod:`perfkit.scenarios.overhead`) with this many ABBA pairs;
            results ``instrumentation``.

    Returns:
        A ResultBundle (scenario ``cold_warm``) whose results hold ``cold_ms``, ``warm_median_ms``,
        ``warm_cold_ratio`` (warm median / cold) and ``cold_warm_ratio`` (cold / warm median)
        with 95 % bootstrap intervals, ``penalty_ms`` per stage, ``penalty_stage``,
        ``cold_start`` (s) and ``leak_checks``.

    Raises:
        ValueError: repeats < 2.
    """
    if repeats < 2:
        raise ValueError(f"cold_vs_warm: repeats must be >= 2 (one cold + warm), got {repeats}")
    req = _request(request)
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    run_dir = Path(run_dir)
    after = overhead_probe(req, pairs=overhead_pairs, sampler_interval_s=sample_interval_s) if overhead_pairs else None
    data = measure_launch(spec, [req] * repeats, run_dir, "session", caps=caps, sample_interval_s=sample_interval_s,
                          after=after)
    df = data.measured()
    results: dict[str, Any] = {"repeats": repeats, "error": data.error, "thresholds": th,
                               "cold_start": {k: json_float(data.launch_row.get(k)) for k in
                                              ("ready_s", "process_start_s", "models_loaded_s", "warmup_s")}}
    if data.extra:
        results["instrumentation"] = {k: v for k, v in data.extra.items() if k != "request_ids"}
    ok = df[df["status"] == "completed"] if not df.empty else df
    results["completed"] = int(len(ok))
    if len(ok) >= 2 and (ok["index"] == 0).any():
        e2e = ok["e2e_ms"].to_numpy(float)
        cold = float(ok.loc[ok["index"] == 0, "e2e_ms"].iloc[0])
        warm = ok.loc[ok["index"] > 0, "e2e_ms"].to_numpy(float)
        wmed = float(np.median(warm))
        results.update({
            "cold_ms": cold, "warm_median_ms": wmed,
            "warm_iqr_ms": [json_float(v) for v in stats.median_iqr(warm)[1:]],
            "warm_cold_ratio": wmed / cold, "cold_warm_ratio": cold / wmed,
            "warm_cold_ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci(warm, [cold])],
            "cold_warm_ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci([cold], warm)],
            "cold_compiles": int(ok.loc[ok["index"] == 0, "compiles"].iloc[0]),
            "warm_compiles": int(ok.loc[ok["index"] > 0, "compiles"].sum()),
        })
        first_id = ok.loc[ok["index"] == 0, "request_id"].iloc[0]
        warm_ids = list(ok.loc[ok["index"] > 0, "request_id"])
        pen = stage_penalty(pd.DataFrame(data.stages), first_id, warm_ids)
        results["penalty_ms"] = {k: json_float(v) for k, v in pen.items()}
        finite = {k: v for k, v in pen.items() if not math.isnan(v)}
        results["penalty_stage"] = max(finite, key=finite.get) if finite else None
        results["penalty_total_ms"] = json_float(cold - wmed)
        warm_rows = ok[ok["index"] > 0]
        checks = []
        slope = stats.slope_per_index(warm_rows["host_anon_mib"].to_numpy(float))
        checks.append(_check("host_anon_slope_mib_per_request", slope, th["host_anon_slope_mib_per_request"]))
        slope_d = stats.slope_per_index(warm_rows["reserved_mb"].to_numpy(float))
        checks.append(_check("device_reserved_slope_mib_per_request", slope_d,
                             th["device_reserved_slope_mib_per_request"]))
        if len(e2e) >= 3:
            second = float(ok.loc[ok["index"] == 1, "e2e_ms"].iloc[0])
            last = float(ok.sort_values("index")["e2e_ms"].iloc[-1])
            checks.append(_check("latency_drift", stats.relative_drift(second, last), th["latency_drift"]))
        results["leak_checks"] = checks
    else:
        results["leak_checks"] = []
        if not results["error"]:  # the engine ran but refused or failed the requests: say why
            results["error"] = _request_error(data, df, repeats)
        log.error("cold_vs_warm: fewer than 2 completed requests (%s)", results["error"])
    params = {"spec": spec.to_dict(), "request": req.payload(), "repeats": repeats, "thresholds": th,
              "overhead_pairs": overhead_pairs}
    return assemble("cold_warm", [data], params, results, caps=[caps])


def _request_error(data: Any, df: pd.DataFrame, repeats: int) -> str:
    """Why fewer than 2 requests completed: the first failed request's error (e.g. the engine's
    HTTP 400 message), from the client outcomes or the request rows."""
    done = int((df["status"] == "completed").sum()) if not df.empty and "status" in df else 0
    head = f"{done} of {repeats} requests completed"
    for i, out in enumerate(data.outcomes):
        if not out.ok:
            http = f", HTTP {out.http_status}" if out.http_status else ""
            return f"{head}; request {i} {out.status}{http}: {out.error or 'no error text'}"
    if not df.empty and "error" in df:
        errs = [str(e) for e in df["error"] if isinstance(e, str) and e.strip()]
        if errs:
            return f"{head}; first error: {errs[0]}"
    return f"{head} (see the engine log)"


def _check(name: str, value: float, threshold: float) -> dict[str, Any]:
    v = json_float(value)
    return {"name": name, "value": v, "threshold": threshold,
            "passed": True if v is None else bool(v <= threshold),
            "measured": v is not None}

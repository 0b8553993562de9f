"""The load investigation's statistics per closed-loop level and for the open loop, and a request
trace's warmup coverage (docs/load.md)."""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Union

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit import stats
from perfkit.checks import number
from perfkit.common.numfmt import json_float
from perfkit.engine.client import VideoRequestSpec
from perfkit.investigations.registry import InvestigationError


class RequestRow(BaseModel):
    """One row of ``results.per_request`` as the summaries read it (ms, epoch seconds); a null
    or left-out engine time is "not reported"."""

    model_config = ConfigDict(extra="allow", strict=True)

    phase: Literal["trace", "warmup", "closed", "open"]
    #: concurrency (closed loop, trace, warm-up) or the asked arrival rate (open loop, 1/s)
    level: Union[int, float]
    status: str
    shape: str
    e2e_ms: float = Field(allow_inf_nan=False)
    t_submit_s: float = Field(allow_inf_nan=False)
    t_end_s: float = Field(allow_inf_nan=False)
    t_arrival_s: Optional[float] = Field(allow_inf_nan=False)
    in_flight_at_submit: int = Field(ge=0)
    queue_wait_ms: Optional[float] = Field(allow_inf_nan=False)
    service_ms: Optional[float] = Field(allow_inf_nan=False)
    start_source: str
    engine_started_s: Optional[float] = Field(None, allow_inf_nan=False)
    engine_completed_s: Optional[float] = Field(None, allow_inf_nan=False)
    latent_shape: Optional[str] = None
    compiles: Optional[int] = None


def check_rows(rows: Any, source: str = "results") -> list[dict[str, Any]]:
    """``rows`` validated as :class:`RequestRow`, as plain dicts. Raises InvestigationError
    naming the row and key: ``results.per_request[16]: key 'e2e_ms': ... (got None)``."""
    if not isinstance(rows, list):
        raise InvestigationError(f"{source}.per_request: a list of requests, got {type(rows).__name__}")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(RequestRow.model_validate(row).model_dump())
        except ValidationError as exc:
            raise InvestigationError(f"{source}.per_request[{i}]: {first_error(exc)}") from None
    return out


def first_error(exc: ValidationError) -> str:
    """pydantic's first error as ``key 'a.b': message (got value)`` (or ``(missing)``)."""
    e = exc.errors()[0]
    key = ".".join(str(x) for x in e.get("loc") or ()) or "?"
    got = "missing" if e.get("type") == "missing" else f"got {e.get('input')!r}"
    return f"key {key!r}: {e.get('msg')} ({got})"


def shape_key(spec: VideoRequestSpec) -> str:
    """A request's shape as the trace tables name it: ``"64x64 25f 4 steps"`` (W x H)."""
    return f"{spec.width}x{spec.height} {spec.num_frames}f {spec.num_inference_steps} steps"


def trace_summary(rows: list[dict[str, Any]], warmup_shape: Any, slos: list[Any]) -> dict[str, Any]:
    """The trace's rows per shape (first hit, later median, penalty, covered; ms) and over the
    trace (uncovered share, p99 and the share of it uncovered first hits cause, SLO attainment)."""
    shapes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        shapes.setdefault(r["shape"], []).append(r)
    table = []
    for key, s in shapes.items():
        done = [r for r in s if r["status"] == "completed"]
        first = s[0]
        later = [r["e2e_ms"] for r in done if r is not first]
        latent = next((r["latent_shape"] for r in done if r.get("latent_shape")), None)
        covered = None if latent is None or not warmup_shape else latent == warmup_shape
        later_med = float(np.median(later)) if later else None
        ok_first = first["status"] == "completed"
        table.append(
            {
                "shape": key,
                "requests": len(s),
                "latent_shape": latent,
                "covered": covered,
                "first_hit_ms": first["e2e_ms"] if ok_first else None,
                "first_hit_compiles": first.get("compiles"),
                "later_median_ms": later_med,
                "first_hit_penalty_ms": (first["e2e_ms"] - later_med)
                if ok_first and later_med is not None
                else None,
            }
        )
    n = len(rows)
    uncovered = {t["shape"] for t in table if t["covered"] is False}
    e2e = [r["e2e_ms"] for r in rows if r["status"] == "completed"]
    swap = {id(shapes[t["shape"]][0]): t["later_median_ms"] for t in table if t["shape"] in uncovered}
    fixed = [
        swap[id(r)] if swap.get(id(r)) is not None else r["e2e_ms"]
        for r in rows
        if r["status"] == "completed"
    ]
    p99, p99_fixed = (float(np.quantile(x, 0.99)) if x else None for x in (e2e, fixed))
    share_p99 = (p99 - p99_fixed) / p99 if p99 and p99_fixed is not None else None
    with_slo = [(r, s) for r, s in zip(rows, slos) if s is not None]
    met = [r for r, s in with_slo if r["status"] == "completed" and r["e2e_ms"] <= s]
    unknown = [t["shape"] for t in table if t["covered"] is None]
    share = sum(t["requests"] for t in table if t["covered"] is False) / n if n else None
    sentence = (
        f"Trace: {n} requests of {len(table)} shapes against a startup warmup of latent shape "
        f"{warmup_shape or 'not reported'}; {len(uncovered)} shape(s) not covered "
        f"({', '.join(sorted(uncovered)) or 'none'}), {share:.0%} of the requests; their first hits "
        f"cause {share_p99:.0%} of the trace's p99."
        if share is not None and share_p99 is not None
        else f"Trace: {n} requests of {len(table)} shapes; coverage not reported for {', '.join(unknown) or 'any'}."
    )
    return {
        "shapes": table,
        "requests": n,
        "uncovered_shapes": sorted(uncovered),
        "coverage_not_reported": unknown,
        "uncovered_share": share,
        "p99_ms": p99,
        "p99_without_uncovered_first_hits_ms": p99_fixed,
        "uncovered_p99_share": share_p99,
        "slo_requests": len(with_slo),
        "slo_attainment": (len(met) / len(with_slo)) if with_slo else None,
        "sentence": sentence,
    }


#: the quantiles reported per level
_QUANTILES = (0.5, 0.9, 0.99)
#: coverage of the quantile intervals and of the concurrency findings' intervals
_CONFIDENCE = 0.95


def quantile_row(e2e: list[float]) -> dict[str, Any]:
    """``p50_ms``, ``p90_ms``, ``p99_ms`` with ``*_ci`` ([low, high]; an unbounded end is None)."""
    out: dict[str, Any] = {}
    for q in _QUANTILES:
        tag = f"p{int(q * 100)}"
        if not e2e:
            out.update({f"{tag}_ms": None, f"{tag}_ci": [None, None]})
            continue
        lo, hi = stats.quantile_ci(e2e, q, _CONFIDENCE)
        out[f"{tag}_ms"] = float(np.quantile(e2e, q))
        out[f"{tag}_ci"] = [json_float(lo), json_float(hi)]
    return out


def median(xs: list) -> float | None:
    """The median of the finite values of ``xs``, or None."""
    return json_float(stats.median_iqr([v for v in (number(x) for x in xs) if v is not None])[0])


#: a level's peak key -> the memory timeline's column it is the maximum of (MiB)
_PEAKS = {
    "device_peak_mib": "device_used_mib",
    "host_peak_mib": "host_pss_mib",
    "host_rss_peak_mib": "host_rss_mib",
}


def peaks(mem: pd.DataFrame, t0: float, t1: float) -> dict[str, float | None]:
    """Device and host peaks (MiB) of the samples in [t0, t1] (PSS: None when no read fell in it)."""
    if mem is None or mem.empty:
        return dict.fromkeys(_PEAKS)
    sel = mem[(mem["t_s"] >= t0) & (mem["t_s"] <= t1)]
    return {k: json_float(pd.to_numeric(sel.get(col), errors="coerce").max()) for k, col in _PEAKS.items()}


def _t0(rows: list[dict]) -> float:
    return min(r["t_submit_s"] if r.get("t_arrival_s") is None else r["t_arrival_s"] for r in rows)


def _level_stats(rows: list[dict], slo_ms: float | None, mem: pd.DataFrame | None) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "completed"]
    e2e = [r["e2e_ms"] for r in ok]
    t0 = _t0(rows)
    t1 = max(r["t_end_s"] for r in rows)
    minutes = (t1 - t0) / 60.0
    met = [r for r in ok if slo_ms is not None and r["e2e_ms"] <= slo_ms]
    out: dict[str, Any] = {
        "n": len(rows),
        "completed": len(ok),
        "failed": len(rows) - len(ok),
        "queue_wait_ms": median([r["queue_wait_ms"] for r in ok]),
        "service_ms": median([r["service_ms"] for r in ok]),
        "e2e_median_ms": median(e2e),
        "start_source": sorted({r["start_source"] for r in ok}),
        "throughput_vpm": len(ok) / (t1 - t0) * 60.0 if t1 > t0 else None,
        "slo_attainment": (len(met) / len(rows)) if slo_ms is not None and rows else None,
        "goodput_vpm": (len(met) / minutes) if slo_ms is not None and minutes > 0 else None,
        "t0_s": t0,
        "t1_s": t1,
        "engine_idle_share": engine_idle_share(ok),
    }
    out.update(quantile_row(e2e))
    if mem is not None:
        out.update(peaks(mem, t0, t1))
    return out


#: requests with a queue wait per third of the open loop's arrivals, at least, for a verdict
_MIN_PER_THIRD = 2


def open_loop_stats(
    rows: list[dict], slo_ms: float | None, mem, capacity_rps: float | None
) -> dict[str, Any]:
    """The open loop's level row plus whether its queue grew (``queue_verdict``, docs/load.md)
    and ``arrival_rate_rps``, the rate the Poisson draw gave."""
    out = _level_stats(rows, slo_ms, mem)
    rate = rows[0]["level"]
    waits = [r["queue_wait_ms"] for r in rows]
    finite = [w for w in waits if number(w) is not None]
    third = max(1, len(waits) // 3)
    first, last = median(waits[:third]), median(waits[-third:])
    from scipy.stats import spearmanr  # 0.4 s to import

    rho = float(spearmanr(range(len(finite)), finite).statistic) if len(set(finite)) > 1 else None
    too_few = third < _MIN_PER_THIRD or len(finite) < 3 * _MIN_PER_THIRD
    rising = first is not None and last is not None and last > first
    grows = bool(not too_few and rho is not None and rho >= 0.5 and rising)
    if grows:
        verdict = "grows"
    elif not too_few and rho is not None and (rho <= 0.2 or not rising):
        verdict = "does not grow"
    else:
        verdict = "not shown"
    arrivals = [r["t_arrival_s"] for r in rows if number(r.get("t_arrival_s")) is not None]
    span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    out.update(
        {
            "rate_rps": rate,
            "capacity_rps": capacity_rps,
            "above_capacity": (rate > capacity_rps) if capacity_rps else None,
            "queue_wait_first_third_ms": first,
            "queue_wait_last_third_ms": last,
            "queue_wait_slope_ms_per_request": json_float(stats.slope_per_index(waits)),
            "queue_wait_rho": json_float(rho),
            "queue_grows": grows,
            "queue_verdict": verdict,
            "arrival_rate_rps": json_float((len(arrivals) - 1) / span) if span > 0 else None,
            "queue_wait_series_ms": waits,
        }
    )
    return out


def engine_idle_share(rows: list[dict[str, Any]]) -> float | None:
    """Share of the engine's window (first start to last completion) in which no job of
    ``rows`` ran; None without start times."""
    spans = [(r.get("engine_started_s"), r.get("engine_completed_s")) for r in rows]
    if not spans or any(a is None or b is None for a, b in spans):
        return None
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    busy = sum(b - a for a, b in spans)
    return max(0.0, 1.0 - busy / window) if window > 0 else None


def slo(rows: list[dict], given: Any, scale: Any) -> tuple[float | None, str]:
    """(SLO in ms or None, how it was set): ``given``, else ``scale`` x the median e2e of the
    warm-up requests that compiled nothing (sglang bench_serving's ``--slo --slo-scale``).
    Raises InvestigationError: ``given`` or ``scale`` is not a number > 0 or None."""
    for key, v in (("slo_ms_given", given), ("slo_scale", scale)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise InvestigationError(f"results.{key}: a number > 0 or null, got {v!r}")
    if given is not None:
        return float(given), "slo_ms (fixed)"
    warm = [r for r in rows if r["phase"] == "warmup" and r["status"] == "completed"]
    if not warm:
        return None, "not set: no warm-up request completed"
    if scale is None:
        return None, "not set: no slo_ms and no slo_scale recorded"
    known = [r for r in warm if r.get("compiles") is not None]
    steady = [r["e2e_ms"] for r in warm if r.get("compiles") == 0] if known else [r["e2e_ms"] for r in warm]
    if not steady:
        return None, f"not set: each of the {len(warm)} warm-up requests compiled (raise warmup_requests)"
    base = float(np.median(steady))
    how = (
        f"the {len(steady)} of {len(warm)} warm-up requests that compiled nothing"
        if known
        else f"the {len(warm)} warm-up requests (compiles not reported)"
    )
    return scale * base, f"{scale:g} x median e2e {base:,.1f} ms of {how}"


def _completion_gaps(rows: list[dict]) -> np.ndarray:
    t0 = _t0(rows)
    ends = sorted(r["t_end_s"] for r in rows if r["status"] == "completed")
    return np.diff([t0, *ends])


#: a level's throughput or service time this far from the first level's (interval's far end) is a finding
_FINDING_REL = 0.15


def _concurrency_findings(levels: list[dict], closed: list[dict]) -> list[str]:
    """Add each later level's service and throughput ratio intervals; one sentence per finding."""
    if not levels:
        return []
    rows = {k: [r for r in closed if r["level"] == k] for k in (lv["concurrency"] for lv in levels)}
    first = levels[0]
    k1 = first["concurrency"]
    svc1 = [r["service_ms"] for r in rows[k1] if r["status"] == "completed"]
    g1 = _completion_gaps(rows[k1])
    out = []
    for lv in levels[1:]:
        k = lv["concurrency"]
        svc = [r["service_ms"] for r in rows[k] if r["status"] == "completed"]
        lo, hi = stats.bootstrap_ratio_ci(svc, svc1, _CONFIDENCE)
        a, b = lv.get("service_ms"), first.get("service_ms")
        lv["service_ratio"] = json_float(a / b) if a is not None and b else None
        lv["service_ratio_ci"] = [json_float(lo), json_float(hi)]
        t_lo, t_hi = (
            json_float(v) for v in stats.bootstrap_mean_ratio_ci(g1, _completion_gaps(rows[k]), _CONFIDENCE)
        )
        lv["throughput_ratio_ci"] = [t_lo, t_hi]
        said = []
        if t_hi is not None and t_hi < 1 - _FINDING_REL:
            said.append(
                f"throughput fell to {lv.get('throughput_ratio', 0):.2f} x concurrency {k1}'s "
                f"({lv['throughput_vpm']:,.0f} vs {first['throughput_vpm']:,.0f} videos/min, "
                f"95 % interval {t_lo:.2f}-{t_hi:.2f})"
            )
        if lo == lo and lo > 1 + _FINDING_REL:
            said.append(
                f"median service time rose from {b:,.0f} to {a:,.0f} ms ({a / b:.2f} x, 95 % "
                f"interval {lo:.2f}-{hi:.2f}): the engine itself slowed with requests in flight"
            )
        if said:
            out.append(f"At concurrency {k} " + " and ".join(said))
    return out


def capacity_rps(rows: list[dict]) -> tuple[float | None, str | None]:
    """(requests/s, where): the largest throughput a closed level delivered (client's clock),
    else the warm-up's; what ``rate_over_capacity`` multiplies."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["phase"] in ("closed", "warmup"):
            where = f"concurrency {r['level']}" if r["phase"] == "closed" else "the warm-up"
            groups.setdefault(where, []).append(r)
    closed = {w: g for w, g in groups.items() if w != "the warm-up"} or groups
    rated = []
    for w, g in closed.items():
        n, span = sum(r["status"] == "completed" for r in g), max(r["t_end_s"] for r in g) - _t0(g)
        rated += [(n / span, w)] if n and span > 0 else []
    return max(rated) if rated else (None, None)


def summarise(results: Mapping[str, Any], mem: pd.DataFrame | None) -> dict[str, Any]:
    """Everything the tables, checks and reading show, from ``results["per_request"]`` and the
    memory timeline (docs/load.md). Raises InvestigationError: a bad row (naming it and the
    key), or ``slo_ms_given``/``slo_scale`` not a number > 0 or null."""
    rows = check_rows(results.get("per_request") or [])
    slo_ms, slo_source = slo(rows, results.get("slo_ms_given"), results.get("slo_scale"))
    levels = []
    for k in sorted({r["level"] for r in rows if r["phase"] == "closed"}):
        mine = [r for r in rows if r["phase"] == "closed" and r["level"] == k]
        lv = {"concurrency": k, **_level_stats(mine, slo_ms, mem)}
        # the steady state: submitted with k - 1 others in flight
        steady = [r for r in mine if r["status"] == "completed" and r["in_flight_at_submit"] == k - 1]
        lv["steady_requests"] = len(steady)
        lv["queue_wait_steady_ms"] = median([r["queue_wait_ms"] for r in steady])
        svc = lv["service_ms"]
        expect = (k - 1) * svc if svc is not None else None
        lv["queue_wait_expected_ms"] = expect
        lv["queue_model_rel_err"] = (
            abs(lv["queue_wait_steady_ms"] - expect) / expect
            if k > 1 and expect and lv["queue_wait_steady_ms"] is not None
            else None
        )
        levels.append(lv)
    if levels and levels[0]["throughput_vpm"]:
        for lv in levels:
            tp = lv["throughput_vpm"]
            lv["throughput_ratio"] = tp / levels[0]["throughput_vpm"] if tp is not None else None
    growth, host_source = None, None
    if levels and mem is not None:
        base = levels[0]
        # PSS where every level has a PSS read, else RSS
        host_key = (
            "host_peak_mib"
            if all(lv.get("host_peak_mib") is not None for lv in levels)
            else "host_rss_peak_mib"
        )
        diffs = [
            lv[key] - base[key]
            for lv in levels[1:]
            for key in ("device_peak_mib", host_key)
            if lv.get(key) is not None and base.get(key) is not None
        ]
        growth = max(diffs) if diffs else None
        if any(lv.get(host_key) is not None for lv in levels):
            host_source = "pss" if host_key == "host_peak_mib" else "rss"
    capacity, capacity_at = capacity_rps(rows)
    findings = _concurrency_findings(levels, [r for r in rows if r["phase"] == "closed"])
    opened = [r for r in rows if r["phase"] == "open"]
    traced = [r for r in rows if r["phase"] == "trace"]
    return {
        "slo_ms": slo_ms,
        "slo_source": slo_source,
        "requests": len(rows),
        "failed_requests": sum(1 for r in rows if r["status"] != "completed"),
        "levels": levels,
        "capacity_rps": capacity,
        "capacity_at": capacity_at,
        "findings": findings,
        "memory_growth_mib": growth,
        "memory_growth_host_source": host_source,
        "open_loop": open_loop_stats(opened, slo_ms, mem, capacity) if opened else None,
        "trace": (
            trace_summary(traced, results.get("warmup_latent_shape"), results.get("trace_slo_ms") or [])
            if traced
            else None
        ),
    }

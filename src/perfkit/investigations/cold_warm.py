"""Cold vs warm (seed case 000): one launch, N identical requests (request 0 the cold one); the
first-request penalty per stage and leak checks across the warm requests (docs/suite.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd
from pydantic import Field

from perfkit import stats
from perfkit.bundle import ResultBundle, steady_state
from perfkit.checks import NOT_REPORTED, Check, check_max, check_min, number, reported_count, reported_sum
from perfkit.common.numfmt import fmt, json_float
from perfkit.common.slugs import md_text
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import common, registry
from perfkit.investigations.common import as_request, code, first_vs_warm, md, run_kwargs
from perfkit.measuring.assemble import PlannedLaunch, assemble, launch_key
from perfkit.measuring.launch_rows import LaunchData, measure_launch
from perfkit.measuring.profiled import (
    ProfileParams,
    SnapshotParams,
    attach,
    run_profiled,
    sites_markdown,
    top_sites_text,
)

log = logging.getLogger(__name__)

NAME = "cold_warm"
#: leak check name -> its invariant key
LEAK_CHECKS = {
    "host_anon_slope_mib_per_request": "host_anon_slope_mib_per_request_max",
    "device_reserved_slope_mib_per_request": "device_reserved_slope_mib_per_request_max",
    "latency_drift": "latency_drift_max",
}
_LEAK_NOISE = "lower bound: the least-squares slope over the warm requests, one-sided 95 %"
#: the leak checks a CUDA allocator snapshot explains (device memory only)
SITE_CHECKS = ("device_reserved_slope_mib_per_request",)


class ColdWarmParams(registry.InvestigationParams):
    """``cold_warm`` section: one session, the cold request then warm ones of the same shape."""

    #: requests in the session: one cold + (repeats - 1) warm
    repeats: int = Field(5, ge=2, le=1000)
    #: memory budget of the launch (None: no cap)
    caps: Optional[registry.CapParams] = None
    #: profiler traces of a cold and a warm request in an extra launch
    profile: Optional[ProfileParams] = None
    #: CUDA allocator snapshots after the cold request and warm request k (``memory_sites``)
    snapshot: Optional[SnapshotParams] = None


class ColdWarmInvariants(registry.InvariantParams):
    """Within-run invariants of cold vs warm (docs/suite.md, "Measurement rules")."""

    #: warm median / cold request (judged with ``warm_cold_ratio_lower95``)
    warm_cold_ratio_max: Optional[float] = 1.0
    warm_cold_ratio_min: Optional[float] = None
    #: slope of host anonymous memory over warm requests (MiB per request)
    host_anon_slope_mib_per_request_max: Optional[float] = 16.0
    #: slope of device memory reserved over warm requests (MiB per request)
    device_reserved_slope_mib_per_request_max: Optional[float] = 16.0
    #: (last warm - second request) / second request (fraction)
    latency_drift_max: Optional[float] = 0.25


def _session_results(results: dict[str, Any], data: LaunchData, df: pd.DataFrame, repeats: int) -> None:
    """Add the session's numbers to ``results``, or why none (``error``)."""
    ok = df[df["status"] == "completed"] if not df.empty else df
    results["completed"] = int(len(ok))
    if len(ok) >= 2 and ok["index"].iloc[0] == 0:
        cold, warm, wmed, pen, results["penalty_stage"] = first_vs_warm(ok, pd.DataFrame(data.stages))
        results.update(
            {
                "cold_ms": cold,
                "warm_median_ms": wmed,
                "warm_iqr_ms": [json_float(v) for v in stats.median_iqr(warm)[1:]],
                "warm_cold_ratio": wmed / cold,
                "cold_warm_ratio": cold / wmed,
                "warm_cold_ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci(warm, [cold])],
                "cold_warm_ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci([cold], warm)],
                "warm_cold_ratio_lower95": json_float(stats.ratio_lower_bound_single_reference(warm, cold)),
                "cold_compiles": reported_count(ok["compiles"].iloc[0]),
                "warm_compiles": reported_sum(ok["compiles"].iloc[1:], count=True),
                "penalty_ms": pen,
                "penalty_total_ms": json_float(cold - wmed),
            }
        )
        warm_rows = ok[ok["index"] > 0].sort_values("index")
        checks = []
        for name, col in (
            ("host_anon_slope_mib_per_request", "host_anon_mib"),
            ("device_reserved_slope_mib_per_request", "reserved_mib"),
        ):
            y = warm_rows[col].to_numpy(float)
            checks.append(_leak(name, stats.slope_per_index(y), stats.slope_lower_bound(y)))
        if len(ok) >= 3:
            y = warm_rows["e2e_ms"].to_numpy(float)
            second, last = float(y[0]), float(y[-1])
            lower = stats.slope_lower_bound(y) * (len(y) - 1) / second
            checks.append(_leak("latency_drift", stats.relative_drift(second, last), lower))
        results["leak_checks"] = checks
    else:
        results["leak_checks"] = []
        if not results["error"]:
            results["error"] = _request_error(data, df, repeats)
        log.error("cold_vs_warm: fewer than 2 completed requests (%s)", results["error"])


def cold_vs_warm(
    spec: EngineSpec,
    request: VideoRequestSpec | dict | None = None,
    repeats: int = 5,
    caps: MemoryCaps | None = None,
    run_dir: str | Path = "outputs/cold_warm",
    sample_interval_s: float = 0.1,
    profile: ProfileParams | dict | None = None,
    snapshot: SnapshotParams | dict | None = None,
) -> ResultBundle:
    """The ``cold_warm`` bundle: one session of ``repeats`` requests (results keys: docs/suite.md,
    "Results"). Raises ValueError: repeats < 2."""
    if repeats < 2:
        raise ValueError(f"cold_vs_warm: repeats must be >= 2 (one cold + warm), got {repeats}")
    req = as_request(request)
    run_dir = Path(run_dir)
    spec, snapshot, why_not = common.snapshot_spec(spec, snapshot, repeats)
    data = measure_launch(
        spec, [req] * repeats, run_dir, "session", caps=caps, sample_interval_s=sample_interval_s
    )
    df = data.sent_rows()
    results: dict[str, Any] = {
        "repeats": repeats,
        "error": data.error,
        "cold_start": {
            k: json_float(data.launch_row.get(k))
            for k in (
                "ready_s process_start_s models_loaded_s warmup_s first_result_s first_request_wait_s "
                "first_request_ms"
            ).split()
        },
    }
    results["cold_start"]["sources"] = data.launch_row.get("cold_start_sources")
    _session_results(results, data, df, repeats)
    params = {"spec": spec.to_dict(), "request": req.payload(), "repeats": repeats}
    profile = ProfileParams.model_validate(profile) if isinstance(profile, dict) else profile
    if profile is not None:
        params["profile"] = profile.model_dump()
    if snapshot is not None:
        params["snapshot"] = snapshot.model_dump()
        results["memory_sites"], sites = common.snapshot_sites(data, snapshot, repeats, why_not)
        for chk in results.get("leak_checks") or []:
            if chk["name"] in SITE_CHECKS:
                chk["sites"] = top_sites_text(results)
    bundle = assemble(NAME, [data], params, results, caps=[caps])
    if snapshot is not None:
        common.attach_sites(bundle, [sites])
    if profile is not None:
        attach(bundle, *run_profiled(spec, req, profile, run_dir, caps=caps))
    return bundle


def _request_error(data: Any, df: pd.DataFrame, repeats: int) -> str:
    """Why fewer than 2 requests completed: the first failed request's error."""
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


def _leak(name: str, value: float, lower: float) -> dict[str, Any]:
    v = json_float(value)
    return {"name": name, "value": v, "lower95": json_float(lower), "measured": v is not None}


def run(ctx: registry.RunContext, p: ColdWarmParams) -> ResultBundle:
    """:func:`cold_vs_warm` with the params section."""
    caps = p.caps.to_caps() if p.caps else None
    return cold_vs_warm(ctx.engine, **run_kwargs(ctx, p, NAME, reuse=False, caps=caps))


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: an error, or no cold/warm numbers (naming the missing keys)."""
    r = bundle.results or {}
    missing = " and ".join(k for k in ("cold_ms", "warm_median_ms") if r.get(k) is None)
    if r.get("error") or missing:
        why = r.get("error") or f"results have no {missing}"
        raise registry.bundle_error(bundle, f"no cold/warm measurement: {why}")


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """warm/cold ratio bounds and the leak checks, against :class:`ColdWarmInvariants`."""
    rows: list[Check] = []
    ratio = number(r.get("warm_cold_ratio"))
    if ratio is None and number(r.get("cold_ms")) and number(r.get("warm_median_ms")) is not None:
        ratio = float(r["warm_median_ms"]) / float(r["cold_ms"])
    ci = r.get("warm_cold_ratio_ci")
    ok = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(number(x) is not None for x in ci)
    ci = f"95% CI {fmt(ci[0], 'g')}..{fmt(ci[1], 'g')}" if ok else ""
    if "warm_cold_ratio_max" in inv:
        lower = number(r.get("warm_cold_ratio_lower95"))
        what = (
            ci + ("; " if ci else "") + "no lower bound recorded: judged on the value"
            if lower is None
            else ""
        )
        noise = (
            "one-sided 95% lower bound: bootstrap of the warm median, the single cold request "
            "given the warm requests' relative spread"
        )
        rows.append(
            check_max(NAME, "warm_cold_ratio", ratio, float(inv["warm_cold_ratio_max"]), what, lower, noise)
        )
    if "warm_cold_ratio_min" in inv:
        rows.append(check_min(NAME, "warm_cold_ratio_min", ratio, float(inv["warm_cold_ratio_min"]), ci))
    leaks = {c.get("name"): c for c in (r.get("leak_checks") or []) if isinstance(c, dict)}
    for name, key in LEAK_CHECKS.items():
        if key in inv:
            chk = leaks.get(name)
            # only a device leak comes with its top allocation sites
            what = str(chk.get("sites") or "") if chk and name in SITE_CHECKS else ""
            chk = chk or {}
            rows.append(
                check_max(
                    NAME, name, chk.get("value"), float(inv[key]), what, chk.get("lower95"), _LEAK_NOISE
                )
            )
    return rows


def key_numbers(r: Mapping[str, Any]) -> list[registry.KeyNumber]:
    """The key numbers of a ``cold_warm`` results dict: cold start (s), cold and warm (ms), ratio."""
    cs = r.get("cold_start") or {}
    return [
        registry.KeyNumber("cold start, ready", number(cs.get("ready_s")), "s", ".1f"),
        registry.KeyNumber("cold start, time to first result", number(cs.get("first_result_s")), "s", ".1f"),
        registry.KeyNumber("cold request", number(r.get("cold_ms")), "ms"),
        registry.KeyNumber("warm median", number(r.get("warm_median_ms")), "ms"),
        registry.KeyNumber("warm/cold ratio", number(r.get("warm_cold_ratio")), "", "g"),
        registry.KeyNumber("first-request penalty stage", r.get("penalty_stage") or None),
    ]


def _count_text(n: Any) -> Any:
    return NOT_REPORTED if n is None else n


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """metric/value rows (s, ms; compiles "not reported" when the engine reports none)."""
    cs = r.get("cold_start") or {}
    ci = r.get("warm_cold_ratio_ci") or [None, None]
    iqr = r.get("warm_iqr_ms") or [None, None]
    rows = [
        ("cold start: ready (s)", cs.get("ready_s")),
        ("cold start: models loaded (s)", cs.get("models_loaded_s")),
        ("cold start: startup warmup (s)", cs.get("warmup_s")),
        ("cold start: parts from", cs.get("sources") or "not recorded (older bundle)"),
        ("time to first result (s)", cs.get("first_result_s")),
        ("time to first result: ready → first request sent (s)", cs.get("first_request_wait_s")),
        ("time to first result: first request (ms)", cs.get("first_request_ms")),
        ("cold request (ms)", r.get("cold_ms")),
        ("warm median (ms)", r.get("warm_median_ms")),
        ("warm interquartile range (ms)", f"{fmt(iqr[0], '.0f')}–{fmt(iqr[1], '.0f')}"),
        ("warm/cold ratio", r.get("warm_cold_ratio")),
        ("warm/cold ratio 95% CI", f"{fmt(ci[0], '.3f')}..{fmt(ci[1], '.3f')}"),
        ("first-request penalty stage", r.get("penalty_stage")),
    ]
    if "cold_compiles" in r:  # bundles written before perfkit recorded them have no key
        rows += [
            ("compiles: cold request", _count_text(r.get("cold_compiles"))),
            ("compiles: warm requests", _count_text(r.get("warm_compiles"))),
        ]
    for st, ms in (r.get("penalty_ms") or {}).items():
        rows.append((f"penalty {st} (ms)", ms))
    return pd.DataFrame(rows, columns=["metric", "value"])


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of a ``cold_warm`` results dict: cold start, cold vs warm, the penalty."""
    ci = r.get("warm_cold_ratio_ci") or [None, None]
    cs = r.get("cold_start") or {}
    pen = r.get("penalty_ms") or {}
    stage = r.get("penalty_stage")
    ratio = number(r.get("warm_cold_ratio"))
    lines = [
        f"**Cold start** took {fmt(cs.get('ready_s'), '.1f', ' s')} until ready "
        f"(process start {fmt(cs.get('process_start_s'), '.1f', ' s')}, models loaded "
        f"{fmt(cs.get('models_loaded_s'), '.1f', ' s')}, startup warmup "
        f"{fmt(cs.get('warmup_s'), '.1f', ' s')}).",
    ]
    if cs.get("sources"):
        lines.append(f"Cold start parts from: {cs['sources']}.")
    if number(cs.get("first_result_s")) is not None:
        lines.append(
            f"**Time to first result** (launch until the first request ended, not trusting the "
            f"engine's word that it was ready): {fmt(cs.get('first_result_s'), '.1f', ' s')}."
        )
        ready, first = number(cs.get("ready_s")), number(cs.get("first_result_s"))
        if ready is not None and first is not None and ready < 0.25 * first:
            lines.append(
                "The engine said it was ready after only "
                f"{fmt(ready / first, '.0%')} of that: it may answer /health before its warmup."
            )
    lines += [
        f"The **cold request** took {fmt(r.get('cold_ms'), '.0f', ' ms')}; the **warm** "
        f"median is {fmt(r.get('warm_median_ms'), '.0f', ' ms')}: warm/cold ratio "
        f"{fmt(ratio, 'g')} (95% CI {fmt(ci[0], 'g')}..{fmt(ci[1], 'g')}).",
    ]
    if stage:
        lines.append(
            f"The **first-request penalty** sits mostly in {md_text(stage, code=True)} ({fmt(pen.get(stage), '.0f', ' ms')})."
        )
    if "cold_compiles" in r:
        cold_n, warm_n = r.get("cold_compiles"), r.get("warm_compiles")
        if cold_n is None and warm_n is None:
            lines.append(
                "**Compiles**: not reported (the engine's records carry no compile counts), so "
                "whether the cold request paid a compile is not known from them."
            )
        else:
            lines.append(
                f"**Compiles**: cold request {_count_text(cold_n)}, warm requests {_count_text(warm_n)}."
            )
    if ratio is not None and ratio > 1.0:
        lines.append(
            "Warm requests are *slower* than the cold one: look for state that "
            "leaks across requests (residency, in-flight copies, host copies)."
        )
    leaks = [c for c in (r.get("leak_checks") or []) if isinstance(c, dict)]
    measured = [c for c in leaks if number(c.get("value")) is not None]
    unmeasured = [c for c in leaks if number(c.get("value")) is None]
    if measured:
        lines.append(
            "Leak checks measured: "
            + ", ".join(
                f"{md_text(c['name'], code=True)} = {md_text(fmt(c.get('value'), '.3g'))}" for c in measured
            )
            + " (judged against the invariants in the gate table)."
        )
    if unmeasured:
        lines.append(
            "Not measured on this host: "
            + ", ".join(md_text(c["name"], code=True) for c in unmeasured)
            + " (no device memory readings)."
        )
    sites = sites_markdown(r)
    if sites:
        lines.append(sites)
    return "\n\n".join(lines)


def cases(bundle: ResultBundle, case_id: Any) -> dict[str, ResultBundle]:
    """One baseline case, ``<preset>_<F>f_<H>x<W>_<S>s_w<warmup>``: the session's steady state."""
    if bundle.measured_requests().empty:
        return {}
    return {case_id(): steady_state(bundle)}


NOTEBOOK = common.headline(NAME) + (
    md(
        "## Why the first request pays: recompilation\n\n"
        "Each request that ran a shape first in its launch (the cold request, or the first of a "
        "new shape): its penalty over the warm median of the same shape, the stage holding "
        "most of it, and the recompilations it paid (count, compile time, the compiler's reason)."
    ),
    code(common.ROOT_CAUSE),
    md(
        "## Below the stage: profiled requests\n\n"
        "With `profile` set, an extra launch sends a cold and a warm request with sglang's "
        "profiling fields (`profile`, `num_profiled_timesteps`, `profile_all_stages`); their "
        "torch.profiler traces are in the bundle under `traces/` (open them in Perfetto, "
        "ui.perfetto.dev, or chrome://tracing). They are extra requests: no statistic, "
        "invariant or gate here reads them. Op time is the wall time of top-level ops."
    ),
    code(common.BELOW_STAGE),
    md("## Every request: role and shape"),
    code(common.REQUESTS),
    md("## Gate (invariants measured within this run)"),
    code(common.GATE_CELL),
    md("## Per-stage latency, cold vs warm requests"),
    code("show(plots.stage_breakdown(bundle))"),
    md("## End-to-end latency per request"),
    code("show(plots.e2e_per_request(bundle))"),
    md("## Denoising step times"),
    code("show(plots.step_times(bundle))"),
    md("## Memory timeline"),
    code("""cap_lines = {"device_cap_gib": (caps or {}).get("device_gib"),
             "host_cap_gib": (caps or {}).get("host_gib")}
show(plots.memory_timeline(bundle, caps=cap_lines))"""),
    md("## Leak checks (rows of the gate above)"),
    code("""from perfkit.investigations.cold_warm import LEAK_CHECKS

leak_rows = [r for r in rows if r.metric in LEAK_CHECKS]
show_table(check_frame(leak_rows))
display(Markdown(verdict_markdown(leak_rows, "Leak checks")))"""),
    md(common.MEMORY_SITES_MD),
    code(common.MEMORY_SITES),
    md(
        "## How to read this\n\n"
        "- The **cold request** (red) pays what the startup warmup did not: shape setup, "
        "lazy initialisation. The **first-request penalty** is cold minus the warm median, per "
        "stage; the stage that holds it says where to look.\n"
        "- A warm/cold ratio above 1 means warm requests are slower than the first: state "
        "leaks across requests (residency, in-flight copies, host copies). The leak checks "
        "fit a slope to host/device memory per request and to latency drift.\n"
        "- Absolute milliseconds are only comparable on the same hardware; the gate here uses "
        "ratios measured within this run."
    ),
)

SECTION_INTRO = "Cold request: the first request after ready. Warm request: a later one with the same shape, in the same session. The gate compares their latencies and the memory slope across requests."


INVESTIGATION = registry.register_module(
    globals(),
    order=10,
    plan=lambda p: [p.repeats],
    title="Cold vs warm",
    question="Does the warm request in one server session meet the numbers of the first, or does "
    "state leak across requests?",
    params_model=ColdWarmParams,
    invariants_model=ColdWarmInvariants,
    case_ids=lambda p, namer: [namer()],
    launches=lambda p, engine, request: [
        PlannedLaunch((launch_key(engine, request, p.caps.to_caps() if p.caps else None),), p.repeats)
    ],
    session=True,
    notebook_intro="Does the second (warm) request in one server session meet the same numbers as the "
    "first (cold) request, or does state leak across requests and degrade it?",
)

"""sglang-layout case entries from bundles or per-request records, one written into a baseline
file (:func:`update_baseline`); a run's entries compared with a baseline by sglang's rule
(:func:`compare`). Rules: docs/sglang.md "Interop facts"."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfkit.bundle import ResultBundle, row_keys, rows_of, steady_state, table_rows
from perfkit.checks import Check
from perfkit.common.numfmt import json_float
from perfkit.gate.baseline.files import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    DEFAULT_STEP_FRACTIONS,
    DERIVED_KEYS,
    ENGINE_KEY,
    MB_DECIMALS,
    MS_DECIMALS,
    OPTIONAL_TOLERANCES,
    PER_FRAME_METRIC,
    S_DECIMALS,
    TOP_LEVEL_CASE_MAPS,
    BaselineError,
    StageClassifier,
    _flatten,
    _metric_rule,
    bound,
    classify_stage,
    load_baseline,
    metric_value,
    new_baseline,
    save_baseline,
    tolerance_profile,
)
from perfkit.readings.engine_config import effective_config
from perfkit.readings.records import parse_lines

log = logging.getLogger(__name__)


def _max(values: Iterable[Any]) -> float | None:
    vals = [f for f in (json_float(v) for v in values) if f is not None]
    return max(vals) if vals else None


def step_indices(n_steps: int, step_fractions: Iterable[float]) -> list[int]:
    """Sampled step indices: ``round(fraction * (n_steps - 1))`` (sglang), deduplicated, sorted."""
    if n_steps <= 0:
        return []
    return sorted({int(round(float(f) * (n_steps - 1))) for f in step_fractions})


def from_bundle(
    bundle: ResultBundle,
    case_id: str,
    step_fractions: Iterable[float] | None = None,
    launch: str | None = None,
) -> dict[str, Any]:
    """One case entry (sglang layout; ms, MiB) from a bundle: the worst value over its measured
    requests (of ``launch`` when given); keys and sources: docs/sglang.md "Interop facts". Raises
    ValueError: no measured request, or a null stage or step ``ms`` (naming file and column)."""
    fractions = step_fractions if step_fractions is not None else DEFAULT_STEP_FRACTIONS
    req = bundle.measured_requests(launch)
    if req.empty:
        where = f" in launch {launch!r}" if launch is not None else ""
        raise ValueError(
            f"bundle {bundle.path or bundle.investigation}: no completed non-warmup "
            f"requests{where} for case {case_id!r}"
        )
    req_keys = row_keys(req)
    keys = set(req_keys)
    stage_ms, step_ms = _request_stages(bundle, keys)
    rows = (
        (stage_ms.get(k, {}), step_ms.get(k, []), json_float(e), {}) for k, e in zip(req_keys, req["e2e_ms"])
    )
    entry = _worst_entry(rows, fractions)
    if entry["expected_e2e_ms"] is None:  # no e2e_ms: the client's view, said
        e2e = _max(req["client_ms"])
        entry["expected_e2e_ms"] = None if e2e is None else round(e2e, MS_DECIMALS)
        log.warning(
            "%s: requests.e2e_ms not reported for case %r: expected_e2e_ms is the client's client_ms (%s)",
            bundle.path or bundle.investigation,
            case_id,
            entry["expected_e2e_ms"],
        )
    lt = _launch_values(bundle, req, keys, launch, entry)
    total_s, ready = 0.0, {la: json_float(r) or 0.0 for la, r in zip(lt["launch"], lt["ready_s"])}
    launch_col = pd.Series([k[0] for k in req_keys], index=req.index, dtype=object)
    for la, grp in req.groupby(launch_col, sort=False, dropna=False):
        t0, t1 = json_float(grp["t_start_s"].min()), json_float(grp["t_end_s"].max())
        span = t1 - t0 if t0 is not None and t1 is not None else float(grp["e2e_ms"].fillna(0).sum()) / 1000
        total_s += span + ready.get(la, 0.0)
    entry["estimated_full_test_time_s"] = round(total_s, S_DECIMALS)
    if ran := _engine_ran(bundle, lt):
        entry[ENGINE_KEY] = ran
    return {k: v for k, v in entry.items() if v is not None}


_ENGINE_COLUMNS = ("compile_active", "compile_backend", "dtype", "engine_device")


def _engine_ran(bundle: ResultBundle, lt: pd.DataFrame) -> dict[str, Any]:
    """What the launches in ``lt`` ran, fields reported the same by all of them."""
    seen: dict[str, set[Any]] = {}
    for ln in table_rows(lt):
        cfg = {c.removeprefix("engine_"): ln.get(c) for c in _ENGINE_COLUMNS}
        if cfg["compile_active"] is None:
            label = str(ln.get("launch"))
            recs = parse_lines(bundle.records.get(label, [])).records
            logs = {n: t for n, t in bundle.logs.items() if n.startswith(f"{label}.")}
            old = effective_config(recs[0].perfkit if recs else None, logs)
            cfg = {k: getattr(old, k) if v is None else v for k, v in cfg.items()}
        for k, v in cfg.items():
            if v is not None and v == v:  # not NaN
                seen.setdefault(k, set()).add(bool(v) if k == "compile_active" else str(v))
    return {k: v.pop() for k, v in seen.items() if len(v) == 1}


def _request_stages(
    bundle: ResultBundle, keys: set[tuple[Any, str]]
) -> tuple[dict[tuple[Any, str], dict[str, float]], dict[tuple[Any, str], list[float]]]:
    """Per request of ``keys``: stage -> ms (a repeated stage sums) and its denoise steps' ms."""
    stages, steps = rows_of(bundle.stages, keys), rows_of(bundle.steps, keys)
    if stages["ms"].isna().any():
        miss = stages[stages["ms"].isna()].iloc[0]
        raise ValueError(
            f"{bundle.path}/stages.parquet: column ms is null for stage {miss['stage']!r} of request "
            f"{miss['request_id']!r}: no baseline from an unmeasured stage"
        )
    stage_ms: dict[tuple[Any, str], dict[str, float]] = {}
    for k, name, ms in zip(row_keys(stages), stages["stage"].astype(str), stages["ms"]):
        per = stage_ms.setdefault(k, {})
        per[name] = per.get(name, 0.0) + float(ms)
    if not steps.empty:
        names = steps["stage"].fillna("").astype(str)
        if (names == "DenoisingStage").any():
            steps = steps[names == "DenoisingStage"]
        elif (denoise := names.map(lambda s: classify_stage(s) == "denoise")).any():
            steps = steps[denoise]
    if steps["ms"].isna().any():
        raise ValueError(
            f"{bundle.path}/steps.parquet: column ms is null in request "
            f"{steps[steps['ms'].isna()]['request_id'].iloc[0]!r}"
        )
    step_ms: dict[tuple[Any, str], list[float]] = {}
    steps = steps.sort_values("step", kind="stable")
    for k, ms in zip(row_keys(steps), steps["ms"]):
        step_ms.setdefault(k, []).append(float(ms))
    return stage_ms, step_ms


def _launch_values(
    bundle: ResultBundle,
    req: pd.DataFrame,
    keys: set[tuple[Any, str]],
    launch: str | None,
    entry: dict[str, Any],
) -> pd.DataFrame:
    """Put the launch values and peaks into ``entry``; return the launches used."""
    lt = bundle.launches
    used = {k[0] for k in keys}
    if not lt.empty:
        lt = lt[lt["launch"].isin(used)] if used != {None} else lt
        if launch is not None:
            lt = lt[lt["launch"] == launch]
    for df, col, key, scale, decimals in (
        (lt, "ready_s", "expected_load_ms", 1000.0, MS_DECIMALS),
        (lt, "first_result_s", "expected_first_result_ms", 1000.0, MS_DECIMALS),
        (lt, "load_peak_mib", "load_peak_vram_mb", 1.0, MB_DECIMALS),
        (lt, "warmup_peak_mib", "warmup_peak_vram_mb", 1.0, MB_DECIMALS),
        (req, "peak_reserved_mib", "runtime_peak_vram_mb", 1.0, MB_DECIMALS),
        (req, "peak_allocated_mib", "runtime_peak_allocated_mb", 1.0, MB_DECIMALS),
    ):
        v = _max(df[col])
        if v is not None:
            entry[key] = round(v * scale, decimals)
    return lt


def set_case(doc: dict[str, Any], case_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Put ``entry`` under ``doc["scenarios"][case_id]`` (and the top-level per-case maps) in place
    and return ``doc``; an old entry's keys :func:`from_bundle` does not derive are kept."""
    cases = doc.setdefault("scenarios", {})
    old = cases.get(case_id) or {}
    merged: dict[str, Any] = {}
    for k, v in old.items():  # old key order; stale derived keys dropped
        if k not in DERIVED_KEYS:
            merged[k] = v
        elif k in entry:
            merged[k] = entry[k]
    for k, v in entry.items():
        merged.setdefault(k, v)
    cases[case_id] = merged
    for key in TOP_LEVEL_CASE_MAPS:
        if isinstance(doc.get(key), dict) and key in entry:
            doc[key][case_id] = entry[key]
    return doc


def baseline_from_bundles(cases: Mapping[str, ResultBundle], hardware: str | None = None) -> dict[str, Any]:
    """A baseline document (sglang's defaults) from case id -> bundle, naming their git commits."""
    commits = sorted({str(b.meta.get("git_commit")) for b in cases.values() if b.meta.get("git_commit")})
    at = f" at git commit {', '.join(commits)}" if commits else ""
    doc = new_baseline(hardware, description=f"Reference numbers from perfkit bundles{at}.")
    for case_id, bundle in cases.items():
        set_case(doc, case_id, from_bundle(bundle, case_id))
    return doc


def entry_from_records(records: Iterable[Any]) -> dict[str, Any]:
    """One case entry from per-request records (:class:`perfkit.readings.records.PerfRecord`),
    the worst request's values as sglang's baseline dump keeps (``test_server_utils.py``); a value
    no record measured is None, never 0. Raises ValueError: no records."""
    peak_keys = (
        ("runtime_peak_vram_mb", "peak_reserved_mb"),
        ("runtime_peak_allocated_mb", "peak_allocated_mb"),
    )
    rows = (
        (r.stage_ms(), list(r.steps), r.total_duration_ms, {k: r.peak_mb(key=sk) for k, sk in peak_keys})
        for r in records
    )
    return _worst_entry(rows, DEFAULT_STEP_FRACTIONS)


def _worst_entry(rows: Iterable[tuple[dict, list, Any, dict]], fractions: Iterable[float]) -> dict[str, Any]:
    """A case entry from per-request (stage -> ms, step ms list, e2e ms, key -> MiB) rows, the
    worst value each, in one pass; a value no row measured is None. Raises ValueError: no rows."""

    def worse(cur: float | None, v: float | None) -> float | None:
        return cur if v is None else (v if cur is None else max(cur, v))

    fractions = list(fractions)
    n = 0
    stages: dict[str, float | None] = {}  # first-seen order
    step_ms: dict[int, float | None] = {}
    e2e: float | None = None
    avg: float | None = None
    med: float | None = None
    peaks: dict[str, float | None] = {}
    for stage_ms, seq, total_ms, peak in rows:
        n += 1
        for name, ms in stage_ms.items():
            stages[name] = worse(stages.get(name), ms)
        for i in step_indices(len(seq), fractions):
            step_ms[i] = worse(step_ms.get(i), seq[i])
        if seq and all(v is not None for v in seq):
            avg = worse(avg, statistics.fmean(seq))
            med = worse(med, statistics.median(seq))
        e2e = worse(e2e, total_ms)
        for key, v in peak.items():
            if v is not None:
                peaks[key] = worse(peaks.get(key), v)
    if not n:
        raise ValueError("no records to derive a baseline entry from")

    def r3(v: float | None) -> float | None:
        return None if v is None else round(v, MS_DECIMALS)

    entry: dict[str, Any] = {"stages_ms": {k: r3(v) for k, v in stages.items()}}
    entry["denoise_step_ms"] = {str(i): r3(v) for i, v in sorted(step_ms.items())}
    entry["expected_e2e_ms"] = r3(e2e)
    entry["expected_avg_denoise_ms"] = r3(avg) if avg is not None else 0.0
    entry["expected_median_denoise_ms"] = r3(med) if med is not None else 0.0
    entry.update({k: r3(v) for k, v in peaks.items()})
    return entry


def update_baseline(
    bundle_dir: str | Path,
    baseline_file: str | Path,
    case_id: str,
    *,
    hardware: str | None = None,
    launch: str | None = None,
    num_frames: int | None = None,
) -> dict[str, Any]:
    """Write ``case_id``'s entry from the bundle's steady state (:func:`perfkit.bundle.steady_state`)
    into ``baseline_file`` (atomically; created when missing) and return the document. Raises
    ValueError: a bad case id, several launches and no ``launch``, an unknown launch, or
    ``hardware`` other than the file's."""
    if not case_id or len(case_id) > 200 or not case_id.isprintable():
        raise ValueError(f"case id {case_id[:60]!r}: 1 to 200 printable characters")
    bundle = ResultBundle.load(bundle_dir)
    launches = [str(x) for x in bundle.launches["launch"]]
    if launch is None and len(launches) > 1:
        raise ValueError(
            f"{bundle_dir} holds {len(launches)} launches ({', '.join(launches)}): name one with --launch"
        )
    if launch is not None and launches and launch not in launches:
        raise ValueError(f"{bundle_dir}: no launch {launch!r} (has {', '.join(launches)})")
    sel = steady_state(bundle, launch=launch, num_frames=num_frames)
    path = Path(baseline_file)
    if path.exists():
        doc = load_baseline(path)
        have = (doc.get("metadata") or {}).get("hardware")
        if hardware is not None and have and have != hardware:
            raise ValueError(
                f"{path} holds numbers for hardware {have!r}, not {hardware!r}: "
                f"write another hardware's numbers to its own baseline file"
            )
    else:
        log.info("creating baseline %s", path)
        doc = new_baseline(hardware)
    fractions = (doc.get("sampling") or {}).get("step_fractions") or DEFAULT_STEP_FRACTIONS
    entry = from_bundle(sel, case_id, fractions)
    set_case(doc, case_id, entry)
    meta = doc.setdefault("metadata", {})
    commit = bundle.meta.get("git_commit") or "unknown"
    meta["description"] = (
        f"Reference numbers for {case_id} from perfkit bundle "
        f"{Path(bundle_dir).name} ({bundle.investigation}) at git commit {commit}."
    )
    meta["last_updated"] = _dt.date.today().isoformat()
    if hardware is not None:
        meta["hardware"] = hardware
    save_baseline(doc, path)
    log.info("baseline %s: case %s updated from %s", path, case_id, bundle_dir)
    return doc


def _expected_metrics(baseline: Mapping[str, Any], case: str) -> dict[str, float | None] | None:
    entry = (baseline.get("scenarios") or {}).get(case)
    top = {
        k: baseline[k][case]
        for k in TOP_LEVEL_CASE_MAPS
        if isinstance(baseline.get(k), dict) and case in baseline[k]
    }
    if entry is None and not top:
        return None
    flat = _flatten(entry or {}, f"baseline scenarios.{case}")
    for k, v in top.items():
        flat.setdefault(k, metric_value(v, f"baseline {k}.{case}"))
    return flat


def compare(
    run: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Any],
    profile: str = "pr_test",
    strict: bool = False,
    *,
    stage_classes: Mapping[str, str] | None = None,
    video: bool = True,
) -> list[Check]:
    """Verdict rows of ``run`` (case id -> entry, ms and MiB) against ``baseline`` by sglang's rule
    (docs/sglang.md "Interop facts"; ``strict``: an unknown case or metric fails, not ``new``;
    ``video=False``: image models' step pad). Raises KeyError for a profile the baseline lacks,
    :class:`BaselineError` for a value that is not a number or null (naming case and key)."""
    profile, tols = tolerance_profile(baseline.get("tolerances"), profile)
    given = (baseline.get("improvement_reporting") or {}).get("threshold")
    threshold_from = "the baseline's" if given is not None else "sglang's default: the baseline gives none"
    threshold = float(DEFAULT_IMPROVEMENT_THRESHOLD if given is None else given)
    classes = dict(stage_classes or {})
    rule = _Rule(
        profile, tols, lambda n: classes.get(n) or classify_stage(n), video, threshold, threshold_from
    )
    rows: list[Check] = []
    for case, entry in run.items():
        expected = _expected_metrics(baseline, case)
        actual = _flatten(entry, f"run {case}")
        unknown = ("fail", " (strict)") if strict else ("new", "")
        if expected is None:
            rows.append(Check(case, "*", None, None, None, unknown[0], "case not in baseline" + unknown[1]))
            continue
        if otherwise := ran_otherwise(entry, (baseline.get("scenarios") or {}).get(case) or {}):
            rows += [
                Check(case, m, exp, actual.get(m), None, "skipped", otherwise)
                for m, exp in (expected.items() or [("*", None)])
            ]
            continue
        first = len(rows)
        no_denoise = no_denoise_reason(entry, rule.classify)
        for metric, exp in expected.items():
            if no_denoise and exp is not None and _is_denoise_metric(metric):
                rows.append(Check(case, metric, exp, actual.get(metric), None, "skipped", no_denoise))
                continue
            rows.append(_metric_check(case, metric, exp, actual, rule))
        if not any(r.status in ("pass", "fail", "improved") for r in rows[first:]):  # no hollow pass
            why = "its baseline entry holds no metric" if not expected else "every metric was skipped"
            why = f"nothing compared for this case: {why}"
            rows.append(Check(case, "metrics compared", None, 0, None, "fail", why))
        rows += [
            Check(case, m, None, v, None, unknown[0], "metric not in baseline" + unknown[1])
            for m, v in actual.items()
            if m not in expected and v is not None and not (no_denoise and _is_denoise_metric(m))
        ]
    return rows


def ran_otherwise(run_entry: Mapping[str, Any], base_entry: Mapping[str, Any]) -> str | None:
    """Why a case is not comparable ("baseline measured with compile off, this run compile on: not
    compared") from the entries' :data:`ENGINE_KEY`, or None."""
    base, mine = base_entry.get(ENGINE_KEY) or {}, run_entry.get(ENGINE_KEY) or {}
    keys = [k for k in base if k in mine and base[k] != mine[k]]

    def say(cfg: Mapping[str, Any]) -> str:
        on = {True: "compile on", False: "compile off"}
        return ", ".join(
            on[cfg[k]] if k == "compile_active" else f"{k.replace('_', ' ')} {cfg[k]}" for k in keys
        )

    return f"baseline measured with {say(base)}, this run {say(mine)}: not compared" if keys else None


#: sglang's ``--backend diffusers`` one stage (runtime/pipelines/diffusers_pipeline.py): no steps
DIFFUSERS_STAGE = "DiffusersExecutionStage"
_DENOISE_AGGREGATES = ("expected_avg_denoise_ms", "expected_median_denoise_ms")


def no_denoise_reason(entry: Mapping[str, Any], classify: StageClassifier) -> str | None:
    """Why a run entry has no denoising to judge (e.g. sglang's diffusers backend), or None."""
    stages = [str(s) for s in (entry.get("stages_ms") or {})]
    if any(classify(s) == "denoise" for s in stages):
        return None
    if DIFFUSERS_STAGE in stages:
        return f"not reported by sglang's diffusers backend: one {DIFFUSERS_STAGE}, no steps"
    return f"not reported: the run has no denoising stage (stages: {', '.join(stages) or 'none'})"


def _is_denoise_metric(metric: str) -> bool:
    return metric in _DENOISE_AGGREGATES or metric.startswith("denoise_step_ms.")


@dataclass(frozen=True)
class _Rule:
    profile: str
    tols: Mapping[str, float]
    classify: StageClassifier
    video: bool
    threshold: float
    threshold_from: str


def _metric_check(
    case: str, metric: str, exp: float | None, actual: Mapping[str, float | None], rule: _Rule
) -> Check:
    """One metric's verdict row: skipped, fail, improved (with a snippet) or pass."""
    act = actual.get(metric)
    tol, pad, rule_name = _metric_rule(metric, rule.tols, rule.classify, rule.video)
    if exp is None:
        return Check(case, metric, None, act, None, "skipped", "not measured in the baseline (null)")
    if metric == PER_FRAME_METRIC and rule.video:
        why = "sglang skips per_frame_generation for video cases"
        return Check(case, metric, exp, act, None, "skipped", why)
    if tol is None:
        if rule_name not in OPTIONAL_TOLERANCES:
            log.warning("profile %s has no tolerance for %s (%s)", rule.profile, metric, rule_name)
        why = f"profile {rule.profile!r} has no {rule_name!r} tolerance"
        return Check(case, metric, exp, act, None, "skipped", why)
    b = bound(exp, tol, pad)
    if act is None:
        why = "not measured in the run (null)" if metric in actual else "missing from run"
        return Check(case, metric, exp, None, b, "fail", why)
    rule_txt = f"{rule_name}: tol {tol:g}, pad {pad:g}"
    threshold = rule.threshold
    if act > b:
        if not exp:  # sglang's placeholder 0
            raise BaselineError(f"scenarios.{case}.{metric}: 0 is no reference for {act:g} (needs > 0)")
        why = f"{act:g} > bound {b:g} (+{(act / exp - 1.0) * 100:.1f}% vs expected; {rule_txt})"
        return Check(case, metric, exp, act, b, "fail", why)
    if exp > 0 and act < exp * (1.0 - threshold):
        group, _, name = metric.partition(".")
        snip = {group: {name: act}} if name else {metric: act}
        why = (
            f"{(1 - act / exp) * 100:.1f}% faster than expected (improvement threshold "
            f"{threshold:g}, {rule.threshold_from}); update scenarios.{case} with {json.dumps(snip)}"
        )
        return Check(case, metric, exp, act, b, "improved", why, snip)
    return Check(case, metric, exp, act, b, "pass", rule_txt)


def check_overlap(
    run: Mapping[str, Any], baseline: Mapping[str, Any], *, source: str, run_hardware: str | None = None
) -> tuple[list[Check], list[str]]:
    """``(rows, warnings)``: a failing row (``baseline``, ``cases compared``) when no case of
    ``run`` is in ``baseline``; warnings naming both hardware labels then or when they differ."""
    ref_hw = (baseline.get("metadata") or {}).get("hardware") or "unknown"
    run_hw = run_hardware or "unknown"
    common = [c for c in run if c in (baseline.get("scenarios") or {})]
    hw = f"hardware {ref_hw!r} vs this run's {run_hw!r}"
    if not common:
        what = "no case of this run is in" if run else "this run has no case to compare with"
        reason = f"{what} {source} ({hw}): nothing compared"
        return (
            [Check("baseline", "cases compared", None, 0, None, "fail", reason)],
            [f"{reason}; a baseline only gates runs of its own hardware and cases"],
        )
    if ref_hw != run_hw:
        return [], [
            f"{source} was measured on {ref_hw!r}, this run on {run_hw!r}: absolute "
            f"numbers are only comparable on the same hardware"
        ]
    return [], []

"""Compare a run's entries with a baseline by sglang's rule: verdict rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfkit.checks import Check
from perfkit.gate.baseline.files import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    ENGINE_KEY,
    MEMORY_METRICS,
    OPTIONAL_TOLERANCES,
    PER_FRAME_METRIC,
    SCALAR_TIMING_METRICS,
    TOP_LEVEL_CASE_MAPS,
    BaselineError,
    StageClassifier,
    _metric_rule,
    bound,
    classify_stage,
    metric_value,
    tolerance_profile,
)

log = logging.getLogger(__name__)


def _flatten(entry: Mapping[str, Any], where: str = "<entry>") -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in ("stages_ms", "denoise_step_ms"):
        m = entry.get(k)
        if m is None:
            continue
        if not isinstance(m, Mapping):
            raise BaselineError(f"{where}.{k}: {m!r} is not an object")
        for name, v in m.items():
            out[f"{k}.{name}"] = metric_value(v, f"{where}.{k}.{name}")
    for k in (*SCALAR_TIMING_METRICS, *MEMORY_METRICS):
        if k in entry:
            out[k] = metric_value(entry[k], f"{where}.{k}")
    return out


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
        # a value inside the case entry wins
        flat.setdefault(k, metric_value(v, f"baseline {k}.{case}"))
    return flat


def _snippet(metric: str, value: float) -> dict[str, Any]:
    if "." in metric:
        group, name = metric.split(".", 1)
        return {group: {name: value}}
    return {metric: value}


def compare(
    run: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Any],
    profile: str = "pr_test",
    strict: bool = False,
    *,
    stage_classes: Mapping[str, str] | None = None,
    video: bool = True,
) -> list[Check]:
    """Check a run against a baseline with sglang's rule: a metric passes when ``actual <=
    max(expected * (1 + tol), expected + pad)`` (:mod:`~perfkit.gate.baseline.files`; nulls as
    docs/sglang.md says). Stage classes: :func:`classify_stage` unless ``stage_classes`` (name
    -> class) says otherwise.

    Args:
        run: case id -> case entry (:func:`from_bundle`'s); ms and MiB.
        profile: tolerance profile name; a flat file has one set for every profile.
        strict: a case (or metric) with no baseline fails instead of being ``new``.
        video: the 160 ms pad for denoise steps after step 0 (False: 20 ms, image models).

    Returns:
        Verdict rows: ``fail`` when over the bound or missing (or null) in the run; ``improved``
        (a pass) when faster than ``expected * (1 - threshold)`` (the document's improvement
        threshold, else sglang's 0.2), with a snippet to paste;
        ``skipped`` when the profile has no tolerance for an optional metric (``load``,
        allocated/warmup peaks), the baseline value is null, for ``stages_ms.per_frame_generation``
        of video cases, for the denoise metrics of a run without a denoising stage
        (:func:`no_denoise_reason`), and for every row of a case whose engine ran otherwise
        (:func:`ran_otherwise`).

    Raises:
        KeyError: when ``profile`` is not in the baseline's (profiled) tolerances.
        BaselineError: a value in ``run`` or ``baseline`` that is not a number or null (the
            message names the case and the key).
    """
    profile, tols = tolerance_profile(baseline.get("tolerances"), profile)
    given = (baseline.get("improvement_reporting") or {}).get("threshold")
    threshold_from = "the baseline's" if given is not None else "sglang's default: the baseline gives none"
    threshold = float(DEFAULT_IMPROVEMENT_THRESHOLD if given is None else given)
    classes = dict(stage_classes or {})

    def classify(name: str) -> str:
        return classes.get(name) or classify_stage(name)

    rule = _Rule(profile, tols, classify, video, threshold, threshold_from)
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
        if not any(r.status in ("pass", "fail", "improved") for r in rows[first:]):
            # no hollow pass: a case present on both sides must compare something
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
    """Why a case is not comparable, naming both sides ("baseline measured with compile off, this
    run compile on: not compared"), from the entries' :data:`ENGINE_KEY` (what the engine ran);
    None when every field both record is the same (or either records none)."""
    base, mine = base_entry.get(ENGINE_KEY) or {}, run_entry.get(ENGINE_KEY) or {}
    keys = [k for k in base if k in mine and base[k] != mine[k]]

    def say(cfg: Mapping[str, Any]) -> str:
        on = {True: "compile on", False: "compile off"}
        return ", ".join(
            on[cfg[k]] if k == "compile_active" else f"{k.replace('_', ' ')} {cfg[k]}" for k in keys
        )

    return f"baseline measured with {say(base)}, this run {say(mine)}: not compared" if keys else None


#: the one stage sglang's ``--backend diffusers`` writes (multimodal_gen/runtime/pipelines/
#: diffusers_pipeline.py): the whole diffusers call, ``is_denoising`` false, no steps
DIFFUSERS_STAGE = "DiffusersExecutionStage"
_DENOISE_AGGREGATES = ("expected_avg_denoise_ms", "expected_median_denoise_ms")


def no_denoise_reason(entry: Mapping[str, Any], classify: StageClassifier) -> str | None:
    """Why a run entry has no denoising to judge, or None when one of its stages denoises.

    sglang's diffusers backend runs the whole pipeline as one ``DiffusersExecutionStage`` with
    no steps (its records: ``is_denoising`` false, ``steps: []``); the denoise aggregates sglang's
    layout writes then (0.0) measure nothing, so they are never a pass."""
    stages = [str(s) for s in (entry.get("stages_ms") or {})]
    if any(classify(s) == "denoise" for s in stages):
        return None
    if DIFFUSERS_STAGE in stages:
        return f"not reported by sglang's diffusers backend: one {DIFFUSERS_STAGE}, no steps"
    return f"not reported: the run has no denoising stage (stages: {', '.join(stages) or 'none'})"


def _is_denoise_metric(metric: str) -> bool:
    """The step metrics (a denoising stage the run lacks stays "missing from run")."""
    return metric in _DENOISE_AGGREGATES or metric.startswith("denoise_step_ms.")


@dataclass(frozen=True)
class _Rule:
    """What :func:`compare` checks every metric with."""

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
        if not exp:  # sglang's placeholder 0: no reference to gate a measured value on (issue 54)
            raise BaselineError(f"scenarios.{case}.{metric}: 0 is no reference for {act:g} (needs > 0)")
        why = f"{act:g} > bound {b:g} (+{(act / exp - 1.0) * 100:.1f}% vs expected; {rule_txt})"
        return Check(case, metric, exp, act, b, "fail", why)
    if exp > 0 and act < exp * (1.0 - threshold):
        snip = _snippet(metric, act)
        why = (
            f"{(1 - act / exp) * 100:.1f}% faster than expected (improvement threshold "
            f"{threshold:g}, {rule.threshold_from}); update scenarios.{case} with {json.dumps(snip)}"
        )
        return Check(case, metric, exp, act, b, "improved", why, snip)
    return Check(case, metric, exp, act, b, "pass", rule_txt)


def check_overlap(
    run: Mapping[str, Any], baseline: Mapping[str, Any], *, source: str, run_hardware: str | None = None
) -> tuple[list[Check], list[str]]:
    """Whether comparing ``run`` (case id -> entry) with ``baseline`` compares anything.

    Returns ``(rows, warnings)``: a failing row (case ``baseline``, metric ``cases compared``)
    when no case of the run is in the baseline, so that a run on other hardware (a CPU run
    against ``baselines/h200.json``) never reads as a pass; and warnings naming both hardware
    labels when nothing was compared or when the labels differ.
    """
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

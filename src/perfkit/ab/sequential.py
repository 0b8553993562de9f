"""The sequential procedure of ``perfkit ab``: launch until every gated metric is decided.

After ``min_launches`` a side the run is *looked at*; while a gated metric is still
"inconclusive" (:func:`perfkit.stats.decide`) another interleaved pair of launches runs and
the run is looked at again, up to ``max_launches`` launches a side. It stops at the first look
where every gated metric is decided (regression, improvement or no change at its threshold), or
where a gated metric is a regression (the exit code is then known), or at the maximum:
**undecided**, which exits 1 unless the user opts out (``--undecided pass``).

**Why the false-alarm rate holds under repeated looks: alpha spending.** Looking at a 95 %
interval after every pair and stopping at the first regression would cry wolf far more often
than 2.5 %. Each look ``n`` (launches a side) instead gets its own share of the error rate
α = 1 − confidence from a Lan–DeMets spending function of the information fraction
``t = n / max_launches`` (Lan & DeMets, Biometrika 1983; Jennison & Turnbull, *Group Sequential
Methods*, 2000, ch. 7):

- ``pocock`` (default): α(t) = α · ln(1 + (e − 1) t): much of α at the first looks, so a change
  several times the noise stops early (launches are the expensive unit: ~40 s on an H200);
- ``obrien-fleming``: α(t) = 2 − 2 Φ(z_{1−α/2} / √t): almost nothing early, nearly the full
  α at the last look (fewer early stops, a narrower last interval).

Look ``n`` builds the usual Welch t interval on launch medians (:func:`perfkit.stats.ratio_interval`)
for each of the K gated metrics at confidence ``1 − (α(t_n) − α(t_{n−1})) / K``. The shares add up
to α, so by the union bound the chance that *any* look's interval of *any* gated metric misses its
true ratio is at most α whatever the correlation between looks and metrics, and the chance that an
A/A exits 1 as a regression at most α/2 (2.5 % at the default 95 %; the recorded pools measure
0–0.7 %, ``docs/choosing-n-m.md``). This is conservative next to exact group-sequential boundaries, which have no closed
form for Welch t at 2–10 launches a side; an always-valid confidence sequence (Howard et al.,
2021) needs a variance bound or many samples to be that tight at a handful of launches. With
``min_launches == max_launches`` there is one look at the nominal confidence: the fixed-N A/B.

**Slow spells** (``slow_rule``): a launch with at least half of its warm DenoisingStage requests
above 1.05 × its side's quiet level (:func:`perfkit.ab.slow.slow_launches`, the detector of
:func:`perfkit.ab.slow.slow_spells`) ran its median in a host slow spell. With ``replace``
(default) it is left out of the intervals and another launch of its side runs instead; it still
counts against ``max_launches`` (launches *run* a side). A spell is an exception: when half or
more of a side's launches are marked, that is the host's state, nothing is replaced and the
result says so. With ``keep`` every launch counts. The marking looks at each side against its
own quiet level, so under A/A both sides lose launches alike (``benchmarks/ab_power.py`` shows
the A/A rates with both rules).

Units: ratios and confidences are fractions; launches are counts a side.

This module runs it live (:func:`run_sequential`) and decides a recorded A/B with it
(:func:`decide_sequential`); the procedure is in :mod:`perfkit.ab.procedure`, its replay on a
recorded pool in :mod:`perfkit.ab.replay`; their names are re-exported here.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.ab.metrics import launch_means, metric_order, metric_values, paired_values
from perfkit.ab.procedure import (
    DEFAULT_MAX_LAUNCHES,
    DEFAULT_MIN_LAUNCHES,
    SLOW_METRIC,
    SLOW_RULES,
    SPENDINGS,
    UNDECIDED,
    Design,
    Walk,
    Walker,
    end_of_recording,
    spent_alpha,
)
from perfkit.ab.replay import pool_design, replay_pool, replay_summary

__all__ = ["DEFAULT_MAX_LAUNCHES", "DEFAULT_MIN_LAUNCHES", "SLOW_RULES", "SPENDINGS", "spent_alpha"]
__all__ += ["pool_design", "replay_pool", "replay_summary"]  # re-exported


def _inputs(
    values: Mapping[str, pd.DataFrame], metrics: Sequence[str], paired: bool = False
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per side: label -> log launch medians of ``metrics`` (:func:`perfkit.ab.metrics.launch_means`,
    the values the decision's intervals use; ``paired``: a pair's B value is A's median times the
    pair's request-by-request ratio, :func:`perfkit.ab.metrics.paired_values`) and label -> warm
    :data:`SLOW_METRIC` times."""
    logmed, slow = {}, {}
    for side, v in values.items():
        lm = launch_means(v)
        wide = lm.pivot_table(index="launch", columns="metric", values="value", aggfunc="first")
        wide = np.log(wide.reindex(columns=list(metrics)).astype(float))
        logmed[side] = {str(k): row.to_numpy(float) for k, row in wide.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1)]
        slow[side] = {str(k): g["value"].to_numpy(float) for k, g in x.groupby("launch")}
    if paired and set(values) == {"A", "B"}:
        for j, metric in enumerate(metrics):
            # A keeps its launch median (paired_values' a is the same); B becomes a·(pair ratio)
            for pr in paired_values(values["A"], values["B"], metric).itertuples():
                label = f"B{pr.pair}"
                if label in logmed["B"]:
                    row = np.array(logmed["B"][label], dtype=float)  # a copy: pandas' may be read-only
                    row[j] = math.log(pr.b) if pr.b > 0 else math.nan
                    logmed["B"][label] = row
    return logmed, slow


def gated_metrics(values: Mapping[str, pd.DataFrame], gate: Sequence[str] | None) -> list[str]:
    """The metrics the procedure waits for: ``gate``, or every metric either side measured."""
    if gate is not None:
        return list(dict.fromkeys(gate))
    return metric_order(pd.concat([v["metric"] for v in values.values()]).unique())


def _failed_labels(bundle: Any) -> list[str]:
    la = bundle.launches
    if la.empty or "error" not in la:
        return []
    return [str(x) for x in la.loc[la["error"].notna(), "launch"]]


def _order(a: Any, b: Any) -> list[tuple[str, str]]:
    """(side, label) in the order the two bundles' launches ran (their meta ``ab.order``), else
    interleaved A B B A … over each side's launches in label order."""
    la = [str(x) for x in a.launches["launch"]] if not a.launches.empty else []
    lb = [str(x) for x in b.launches["launch"]] if not b.launches.empty else []
    recorded = (a.meta.get("ab") or {}).get("order") or []
    side = {x: "A" for x in la} | {x: "B" for x in lb}
    if recorded and set(la) | set(lb) <= set(recorded) and not set(la) & set(lb):
        return [(side[x], x) for x in recorded if x in side]
    out, seq = [], {"A": list(la), "B": list(lb)}
    for s in stats.interleaved_order(max(len(la), len(lb), 1)):
        if seq[s]:
            out.append((s, seq[s].pop(0)))
    return out


def _walk_bundles(
    a: Any,
    b: Any,
    design: Design,
    gate: Sequence[str] | None,
    threshold: float,
    thresholds: Mapping[str, float] | None,
    order: Sequence[tuple[str, str]] | None = None,
) -> tuple[Walk, list[str]]:
    """(the procedure's walk over two sides' bundles in ``order``, default the order they ran
    (:func:`_order`); the gated metrics)."""
    values = {"A": metric_values(a), "B": metric_values(b)}
    metrics = gated_metrics(values, gate)
    logmed, slow = _inputs(values, metrics, design.paired)
    failed = _failed_labels(a) + _failed_labels(b)
    thr = [float((thresholds or {}).get(m, threshold)) for m in metrics]
    seq = list(order) if order is not None else _order(a, b)
    return Walker(logmed, slow, metrics, thr, design, failed).feed(seq), metrics


def decide_sequential(
    a: Any,
    b: Any,
    design: Design,
    threshold: float = stats.DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    gate: Sequence[str] | None = None,
    undecided: str = "fail",
    order: Sequence[tuple[str, str]] | None = None,
) -> Any:
    """Decide two sides' bundles (live or recorded) by the procedure: walk their launches in the
    order they ran (:meth:`Walker.feed`; a recording that ends first is undecided), then the full
    comparison (:func:`perfkit.ab.decide.compare_bundles`) of the last look's launches at its
    confidence. Undecided gated metrics make the exit code 1 unless ``undecided="pass"``.

    Returns:
        :class:`perfkit.ab.decide.AbResult` whose ``meta["sequential"]`` holds the design, the
        looks (launches, confidence, each gated metric's interval and decision), why it
        stopped, the launches run and replaced, the undecided metrics, the launches a side each
        would need, and ``undecided_rule``.

    Raises:
        ValueError: ``undecided`` not in :data:`UNDECIDED`; a gate naming a metric not compared
            (as :func:`perfkit.ab.decide.compare`).
    """
    from perfkit.ab.decide import compare_bundles
    from perfkit.gate.verdicts import EXIT_OK, EXIT_REGRESSION, jsonable

    if undecided not in UNDECIDED:
        raise ValueError(f"undecided must be one of {', '.join(UNDECIDED)}, got {undecided!r}")
    w, metrics = _walk_bundles(a, b, design, gate, threshold, thresholds, order)
    if w.stop is None:
        end_of_recording(w, metrics, design)
    final = w.final
    if final is not None:
        keep, conf = final.launches, final.confidence
    else:
        keep = {s: [x for x in w.run[s] if x not in w.replaced.get(s, [])] for s in ("A", "B")}
        conf = design.look_confidence(design.min_launches)
    res = compare_bundles(a, b, threshold, thresholds, conf, gate=gate, keep=keep, paired=design.paired)
    t = res.table.set_index("metric")
    needed = {}  # every gated metric left inconclusive, also when another's regression stopped it
    for m in metrics:
        if m in t.index and t.loc[m, "decision"] == "inconclusive":
            v = t.loc[m, "launches_needed"]
            needed[m] = None if v is None or pd.isna(v) else int(v)
    if w.stop == "maximum" and res.exit_code == EXIT_OK and w.undecided and undecided == "fail":
        res.exit_code = EXIT_REGRESSION
    res.meta["sequential"] = jsonable(
        {
            "design": design.to_dict(),
            **w.to_dict(),
            "launches_needed": needed,
            "undecided_rule": undecided,
            "metrics": metrics,
        }
    )
    return res


def run_sequential(
    plan: Any,
    design: Design,
    out: Any,
    threshold: float = stats.DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    gate: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run a live A/B (a :class:`perfkit.ab.driver.AbPlan`; its ``launches`` is not read) by the
    procedure: ``design.min_launches`` a side interleaved (:func:`perfkit.ab.driver.run_ab`),
    then after each launch the one the procedure asks for (the procedure's walk over what ran, with the
    same gate and thresholds as the decision after it), until it stops.

    Returns:
        {"A": bundle, "B": bundle} (saved under ``out/a`` and ``out/b``); their meta ``ab``
        holds ``sequential`` (the design and ``gate_metrics``), which ``--replay`` reads back.
    """
    from perfkit.ab.driver import run_ab

    def extend(bundles: dict[str, Any]) -> list[str]:
        if set(bundles) != {"A", "B"}:
            return []
        w, _ = _walk_bundles(bundles["A"], bundles["B"], design, gate, threshold, thresholds)
        if w.stop is not None or not w.next_arm:
            return []
        if design.paired:  # a pair more, its first request side alternating: A B, B A, A B, …
            k = len(w.run["A"])
            return ["A", "B"] if k % 2 == 0 else ["B", "A"]
        return [w.next_arm]

    return run_ab(
        plan,
        out,
        launches=design.min_launches,
        extend=extend,
        # the gated metrics and thresholds with the design: a replay without --gate-metrics or
        # --threshold splits alpha and decides as the run did
        meta={
            "sequential": {
                **design.to_dict(),
                "gate_metrics": list(gate) if gate else None,
                "threshold": threshold,
                "thresholds": dict(thresholds or {}),
            }
        },
        paired=design.paired,
    )

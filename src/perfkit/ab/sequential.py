"""The sequential procedure of ``perfkit ab``, launch until every gated metric is decided: run
live (:func:`run_sequential`), decide a recorded A/B (:func:`decide_sequential`) and replay it on
a recorded pool (:func:`replay_pool`, :func:`replay_summary`). The procedure itself is in
:mod:`perfkit.ab.procedure`; the method (looks, alpha spending, slow spells) and its sources are
in docs/choosing-n-m.md, "Launching until decided". Ratios and confidences are fractions;
launches are counts a side.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.ab.metrics import launch_errors, metric_order, metric_values, paired_values
from perfkit.ab.pool import log_medians
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

__all__ = ["DEFAULT_MAX_LAUNCHES", "DEFAULT_MIN_LAUNCHES", "SLOW_RULES", "SPENDINGS", "spent_alpha"]


def _inputs(
    values: Mapping[str, pd.DataFrame], metrics: Sequence[str], paired: bool = False, m: float = math.inf
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per side: label -> log launch medians of ``metrics`` over the first ``m`` warm requests
    (:func:`perfkit.ab.pool.log_medians`, the values the decision's intervals use; ``paired``: a
    pair's B value is A's median times the pair's request-by-request ratio,
    :func:`perfkit.ab.metrics.paired_values`) and label -> warm :data:`SLOW_METRIC` times (ms)."""
    logmed, slow = {}, {}
    for side, v in values.items():
        med = log_medians(v, m).reindex(columns=list(metrics))
        logmed[side] = {str(k): row.to_numpy(float) for k, row in med.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1) & (v["index"] <= m)]
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
    # the metrics the procedure waits for: ``gate``, or every metric either side measured
    every = pd.concat([v["metric"] for v in values.values()]).unique()
    metrics = list(dict.fromkeys(gate)) if gate is not None else metric_order(every)
    logmed, slow = _inputs(values, metrics, design.paired)
    failed = [*launch_errors(a), *launch_errors(b)]
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
    """Decide two sides' bundles by the procedure: walk their launches in the order they ran (a
    recording that ends first is undecided), then :func:`perfkit.ab.decide.compare_bundles` of
    the last look's launches at its confidence. Undecided gated metrics exit 1 unless
    ``undecided="pass"``.

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
    """Run a live A/B (a :class:`perfkit.ab.driver.AbPlan`; its ``launches`` is not read):
    ``design.min_launches`` a side interleaved (:func:`perfkit.ab.driver.run_ab`), then the
    launch the procedure asks for after each, with the decision's gate and thresholds, until it stops.

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


def pool_design(pool: Any, design: Design) -> Design:
    """``design`` with its maximum cut to what the pool can replay: at most half of A's launches
    (an A/A draws both sides from A, without sharing) and every arm's launches."""
    a = len(pool.launches("A"))
    cap = min([a // 2, *(len(pool.launches(arm)) for arm in pool.arms)])
    if cap < design.min_launches:
        raise ValueError(
            f"{pool.path}: the pool replays at most {cap} launches a side ({a} of A: an A/A needs two "
            f"disjoint sides), fewer than the first look's {design.min_launches}"
        )
    return dataclasses.replace(design, max_launches=min(design.max_launches, cap))


def replay_pool(
    pool: Any,
    design: Design,
    metrics: Sequence[str] = ("DenoisingStage", "warm_e2e"),
    threshold: float = 0.01,
    sims: int = 2000,
    seed: int = 0,
    m: int | None = None,
) -> pd.DataFrame:
    """Replay the procedure on a recorded pool (:func:`perfkit.ab.pool.load_pool`): ``sims``
    experiments an arm and as many A/As, each a random order of launches a side fed to a
    :class:`Walker` (docs/choosing-n-m.md, "How the replay resamples").

    Args:
        design: its ``max_launches`` is cut by :func:`pool_design` (at most the pool's launches).
        metrics: the gated metrics; threshold: theirs (fraction).
        m: warm requests a launch used (default the pool's).

    Returns:
        One row per experiment: ``kind`` ("A/A" or the arm), ``target`` (the arm's metric;
        None for A/A), ``stop`` (``regression``, ``decided``, ``maximum``), ``regressed`` (the
        metrics called a regression, comma-separated), ``caught`` (the target called a
        regression), ``launches`` (launches run a side, the larger side), ``looks``,
        ``max_launches``, ``slow_rule``.

    Raises:
        ValueError: the pool is too small for a first look (:func:`pool_design`).
    """
    design = pool_design(pool, design)
    m = int(m or pool.warm)
    mx = design.max_launches
    rng = np.random.default_rng(seed)
    arms = ["A", *pool.arms]
    logmed, slow = _inputs({arm: pool.values[arm] for arm in arms}, metrics, m=m)
    thresholds = [threshold] * len(metrics)
    rows = []
    a_labels = np.array(sorted(logmed["A"]))
    for kind in ["A/A", *pool.arms]:
        target = None if kind == "A/A" else pool.arms[kind].get("target", SLOW_METRIC)
        other = "A" if kind == "A/A" else kind
        b_labels = np.array(sorted(logmed[other]))
        lm = {"A": logmed["A"], "B": logmed[other]}
        sl = {"A": slow["A"], "B": slow[other]}
        for _ in range(sims):
            pa = list(rng.permutation(a_labels))
            pb = pa[mx:] if kind == "A/A" else list(rng.permutation(b_labels))  # A/A: no launch on both
            seq = {"A": pa[:mx], "B": pb[:mx]}
            walker = Walker(lm, sl, metrics, thresholds, design)
            w = walker.w
            while w.stop is None:
                side = w.next_arm or "A"
                w = walker.add(side, str(seq[side][len(w.run[side])]))
            regressed = [
                k for k, v in (w.final.metrics if w.final else {}).items() if v["decision"] == "regression"
            ]
            rows.append(
                {
                    "kind": kind,
                    "target": target,
                    "stop": w.stop,
                    "regressed": ",".join(regressed) if w.stop == "regression" else "",
                    "caught": bool(target and w.stop == "regression" and target in regressed),
                    "launches": max(len(v) for v in w.run.values()),
                    "looks": len(w.looks),
                    "max_launches": mx,
                    "slow_rule": design.slow_rule,
                }
            )
    return pd.DataFrame(rows)


def replay_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per ``kind`` of :func:`replay_pool`'s rows: ``experiments``; ``regression`` (stopped on a
    gated regression: exit 1), ``caught`` (the arm's target metric called a regression),
    ``decided`` (stopped with every gated metric decided, no regression: exit 0),
    ``undecided`` (at the maximum: exit 1 unless ``--undecided pass``), fractions; launches run a
    side: ``median_launches``, ``p90_launches``, ``max_used`` and ``max_launches``."""
    out = []
    for kind, g in runs.groupby("kind", sort=False):
        out.append(
            {
                "kind": kind,
                "target": g["target"].iloc[0],
                "experiments": len(g),
                "regression": float((g["stop"] == "regression").mean()),
                "caught": float(g["caught"].mean()) if kind != "A/A" else math.nan,
                "decided": float((g["stop"] == "decided").mean()),
                "undecided": float((g["stop"] == "maximum").mean()),
                "median_launches": float(g["launches"].median()),
                "p90_launches": float(g["launches"].quantile(0.9)),
                "max_used": int(g["launches"].max()),
                "max_launches": int(g["max_launches"].iloc[0]),
            }
        )
    return pd.DataFrame(out)

"""The sequential procedure replayed on a recorded pool of launches: :func:`replay_pool` walks
every way to pick the launches, :func:`replay_summary` gives the A/A false-alarm and detection
rates and launches used (``benchmarks/ab_power.py``, figures ``kind=ab-sequential``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perfkit.ab.procedure import SLOW_METRIC, Design, Walker


def _pool_arrays(
    pool: Any, arms: Sequence[str], metrics: Sequence[str], m: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Per arm: label -> log launch medians of ``metrics`` over the first ``m`` warm requests
    (:func:`perfkit.ab.pool.log_medians`, as the live decision reads them), and label -> its
    warm :data:`SLOW_METRIC` times (ms)."""
    from perfkit.ab.pool import log_medians

    logmed, slow = {}, {}
    for arm in arms:
        v = pool.values[arm]
        med = log_medians(v, m).reindex(columns=list(metrics))
        logmed[arm] = {str(k): row.to_numpy(float) for k, row in med.iterrows()}
        x = v[(v["metric"] == SLOW_METRIC) & (v["index"] >= 1) & (v["index"] <= m)]
        slow[arm] = {str(k): g["value"].to_numpy(float) for k, g in x.groupby("launch")}
    return logmed, slow


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
    experiments an arm and as many A/As.

    Each experiment draws, without replacement, a random order of launches for each side from
    the pool (an A/A: a random order of A's launches, the first ``max`` launches side A and the
    next ``max`` side B, so no launch is on both sides; an arm: a random order of A's launches
    and one of the arm's) and feeds them to a :class:`Walker` one at a time in the order the
    procedure asks for (interleaved, replacements of slow-spell launches included). Draws
    share launches, so the rates describe the pool, not independent occasions.

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
    logmed, slow = _pool_arrays(pool, arms, metrics, m)
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

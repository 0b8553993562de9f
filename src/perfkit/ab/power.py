"""Power of ``perfkit ab`` from a recorded pool (:mod:`perfkit.ab.pool`): A/A false-alarm and
detection rates for each N, M and decision setting (:func:`power_table`, :func:`recommend`).
Draws share launches, so the rates describe one pool, not independent experiments; how the draws
are made: docs/choosing-n-m.md. The pool's names other code reads are re-exported here.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.ab.pool import (
    KEY_METRICS,
    POOL_FILE,
    UNTOUCHED,
    Pool,
    arm_warnings,
    load_pool,
    log_medians,
    slow_launches,
    slow_spells,
    variance_table,
)

__all__ = ["POOL_FILE", "arm_warnings", "load_pool", "variance_table", "slow_spells", "slow_launches"]
#: up to this many ways to pick the launches, every way is taken (exact rates for the pool)
MAX_EXACT = 100_000


def _rate(hits: np.ndarray, has: np.ndarray) -> float:
    """Share of draws with a hit; a draw without an interval (``has`` False: a side with fewer
    than 2 values) counts as no hit, as ``perfkit ab`` calls it inconclusive, but no draw with an
    interval at all is no rate (NaN), never 0."""
    if not has.any():
        return math.nan
    return float(np.mean(hits))


def _draws(rng: np.random.Generator, n_launches: int, k: int, sims: int) -> np.ndarray:
    """(sims, k) indices: k distinct launches of n_launches in each row."""
    return np.argsort(rng.random((sims, n_launches)), axis=1)[:, :k]


Moments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: draws of one kind: (launch index groups (G, n), each draw's first side (rows,) and second side
#: (rows,) as rows of the groups, every way taken); a group's moments are reduced once
Ways = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]


def _aa_ways(rng: np.random.Generator, n_launches: int, n: int, sims: int) -> Ways:
    """A/A splits (n launches a side, no launch on both): every ordered split when there are at
    most :data:`MAX_EXACT` (then both sides are rows of the n-subsets of the launches, in
    increasing order), else ``sims`` random draws (each side a group of its own); as
    :data:`Ways` with the same groups for both sides."""
    ways = math.comb(n_launches, n) * math.comb(n_launches - n, n)
    if ways <= MAX_EXACT:
        combos = list(itertools.combinations(range(n_launches), n))
        pos = {c: i for i, c in enumerate(combos)}
        first, second = [], []
        for i, x in enumerate(combos):
            for y in itertools.combinations([j for j in range(n_launches) if j not in x], n):
                first.append(i)
                second.append(pos[y])
        g = np.array(combos, dtype=int)
        return g, np.array(first, dtype=int), g, np.array(second, dtype=int), True
    d = _draws(rng, n_launches, 2 * n, sims)
    rows = np.arange(sims)
    return d[:, :n], rows, d[:, n:], rows, False


def _ab_ways(rng: np.random.Generator, n_a: int, n_b: int, n: int, sims: int) -> Ways:
    """A's n launches against B's n launches: every pair of subsets when there are at most
    :data:`MAX_EXACT` (A's groups the n-subsets of A, B's of B), else ``sims`` random draws;
    as :data:`Ways` (A's groups first)."""
    if math.comb(n_a, n) * math.comb(n_b, n) <= MAX_EXACT:
        ca = np.array(list(itertools.combinations(range(n_a), n)), dtype=int)
        cb = np.array(list(itertools.combinations(range(n_b), n)), dtype=int)
        ra, rb = np.arange(len(ca)), np.arange(len(cb))
        return ca, np.repeat(ra, len(cb)), cb, np.tile(rb, len(ca)), True
    rows = np.arange(sims)
    return _draws(rng, n_a, n, sims), rows, _draws(rng, n_b, n, sims), rows, False


def _moments(xa: np.ndarray, xb: np.ndarray, ways: Ways) -> Moments:
    """Welch (d, se, df, bad) of every draw of ``ways``: ``xa``, ``xb`` (launches, metrics) log
    values of the first and second side; each group reduced once
    (:func:`perfkit.stats.side_moments`): as reducing every draw, within rounding."""
    ga, pa, gb, pb, _ = ways
    return stats.combine(
        stats.take(stats.side_moments(xa[ga]), pa), stats.take(stats.side_moments(xb[gb]), pb)
    )


def power_table(
    pool: Pool,
    n: Iterable[int] = (2, 3, 4, 5),
    m: Iterable[int] | None = None,
    settings: Iterable[tuple[float, float]] = ((stats.DEFAULT_THRESHOLD, stats.DEFAULT_CONFIDENCE),),
    sims: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Resampled rates for every B arm, N, M and decision setting (module doc).

    Args:
        pool: from :func:`load_pool`.
        n: launches a side. A/A needs 2N distinct A launches (NaN rates where the pool has fewer).
        m: warm requests a launch (default 1, 3, 5 and the pool's own M, those ≤ the pool's M).
        settings: (threshold, confidence) pairs: a regression is an interval wholly above
            1 + threshold (:func:`perfkit.stats.decide`).
        sims: random draws per (arm, N, M) where there are more than :data:`MAX_EXACT` ways to
            pick the launches; up to that, every way is taken once (exact for the pool).
        seed: of the draws (the same seed gives the same table).

    Returns:
        One row per (arm, n, m, threshold, confidence) with ``slowdown_pct`` (of DenoisingStage),
        ``target``, ``launches_a``, ``launches_b`` (the pool), ``aa_covers`` (DenoisingStage
        interval holds 1), ``aa_alarm_<metric>`` for :data:`KEY_METRICS`, ``aa_alarm_any``,
        ``detect_<metric>`` for :data:`KEY_METRICS`, ``detect_any`` (the B draw's exit code is 1:
        any metric called a regression), ``detect_gate`` and ``aa_alarm_gate`` (the exit code of
        ``perfkit ab --gate-metrics DenoisingStage,warm_e2e``: any key metric called a
        regression), ``alarm_untouched`` (fractions of the draws); ``aa_ways``/``ab_ways`` (how
        many draws) and ``aa_exact``/``ab_exact`` (every way taken; None: no draw).

    Raises:
        ValueError: a setting outside (0, 1), or N < 2.
    """
    settings = [(float(t), float(c)) for t, c in settings]
    for t, c in settings:
        if not (0.0 < t < 1.0 and 0.0 < c < 1.0):
            raise ValueError(
                f"threshold and confidence must be in (0, 1) (as perfkit ab takes them), got ({t}, {c})"
            )
    ns = sorted(set(int(x) for x in n))
    if not ns or ns[0] < 2:
        raise ValueError(f"launches a side must be >= 2 for an interval, got {ns}")
    if sims < 1:
        raise ValueError(f"sims must be >= 1, got {sims}")
    if m is None:
        ms = sorted({x for x in (1, 3, 5, pool.warm) if x <= pool.warm})
    else:
        ms = sorted(set(int(x) for x in m))
        bad = [x for x in ms if not 1 <= x <= pool.warm]
        if bad:
            raise ValueError(f"M {bad}: the pool has 1 to {pool.warm} warm requests a launch")
    rng = np.random.default_rng(seed)
    rows = []
    for mm in ms:
        med = {arm: log_medians(v, mm) for arm, v in pool.values.items()}
        a = med["A"]
        la = a.to_numpy()
        cols = list(a.columns)
        gate = [cols.index(k) for k in KEY_METRICS if k in cols]
        for nn in ns:
            aa, aa_ways, aa_exact = None, 0, None
            if 2 * nn <= len(a):
                ways = _aa_ways(rng, len(a), nn, sims)
                aa, aa_ways, aa_exact = _moments(la, la, ways), len(ways[1]), ways[-1]
            for arm, info in pool.arms.items():
                b = med[arm].reindex(columns=cols)
                # N launches of each side: none drawn (no rate) when either side has fewer
                ab, ab_ways, ab_exact = None, 0, None
                if nn <= len(a) and nn <= len(b):
                    ways = _ab_ways(rng, len(a), len(b), nn, sims)
                    ab, ab_ways, ab_exact = _moments(la, b.to_numpy(), ways), len(ways[1]), ways[-1]
                for thr, conf in settings:
                    row: dict[str, Any] = {
                        "arm": arm,
                        "slowdown_pct": info.get("DenoisingStage_pct"),
                        "target": info.get("target", "DenoisingStage"),
                        "n": nn,
                        "m": mm,
                        "threshold": thr,
                        "confidence": conf,
                        "launches_a": len(a),
                        "launches_b": len(b),
                        "aa_ways": aa_ways,
                        "aa_exact": aa_exact,
                        "ab_ways": ab_ways,
                        "ab_exact": ab_exact,
                    }
                    up = math.log1p(thr)
                    row.update(_rates(aa, conf, cols, gate, up, True))
                    row.update(_rates(ab, conf, cols, gate, up, False))
                    rows.append(row)
    return pd.DataFrame(rows)


def _rates(
    mom: Moments | None, conf: float, cols: list[str], gate: list[int], up: float, aa: bool
) -> dict[str, float]:
    """A/A (``aa``: ``aa_covers``, ``aa_alarm_<metric>``, ``aa_alarm_any``, ``aa_alarm_gate``) or
    detection (``detect_<metric>``, ``alarm_untouched``, ``detect_any``, ``detect_gate``) columns
    of one :func:`power_table` row from the draws' Welch moments (:func:`perfkit.stats.combine`,
    each (draws, metrics); None: nothing drawn, every rate NaN) at two-sided ``conf``; a
    regression is a low end above ``up`` (log of 1 + threshold). ``*_any`` is the exit code with
    every metric gating, ``*_gate`` with the key metrics."""
    pre = "aa_alarm" if aa else "detect"
    keys = [f"{pre}_{m}" for m in KEY_METRICS]
    row = dict.fromkeys(
        [*(["aa_covers", *keys] if aa else [*keys, "alarm_untouched"]), f"{pre}_any", f"{pre}_gate"], math.nan
    )
    if mom is None:
        return row
    has = ~mom[3]
    low, high = stats.log_ends(*mom, conf)
    reg = low > up  # NaN (no interval) is never above

    def rate(metric: str, hit: np.ndarray) -> float:
        return _rate(hit[:, cols.index(metric)], has[:, cols.index(metric)]) if metric in cols else math.nan

    row.update({k: rate(m, reg) for m, k in zip(KEY_METRICS, keys)})
    if aa:
        row["aa_covers"] = rate("DenoisingStage", has & (low <= 0) & (high >= 0))
    else:
        row["alarm_untouched"] = rate(UNTOUCHED, reg)
    row[f"{pre}_any"] = _rate(reg.any(axis=1), has)
    row[f"{pre}_gate"] = _rate(reg[:, gate].any(axis=1), has[:, gate]) if gate else math.nan
    return row


#: what each judgement of :func:`recommend` means, in words (Markdown)
JUDGEMENTS = {
    "key": "each arm caught on its own metric; false alarms of DenoisingStage and warm e2e",
    "gate": "the exit code with `--gate-metrics DenoisingStage,warm_e2e`",
    "any": "the exit code with every metric gating",
}
#: what :func:`recommend` judges: detection column(s), false-alarm column(s)
_JUDGED = {
    "key": (None, tuple(f"aa_alarm_{k}" for k in KEY_METRICS)),
    "gate": ("detect_gate", ("aa_alarm_gate",)),
    "any": ("detect_any", ("aa_alarm_any",)),
}


def recommend(
    table: pd.DataFrame, detect_min: float = 0.95, alarm_max: float = 0.01, alarm: str = "key"
) -> pd.DataFrame:
    """The cheapest settings that meet the targets: rows of :func:`power_table` (one per setting
    and N, M, all arms together) where every arm's detection is at least ``detect_min`` and the
    A/A false-alarm rate is at most ``alarm_max``, judged as ``alarm`` says (:data:`JUDGEMENTS`:
    ``"key"`` each arm's ``target`` metric and the worst of :data:`KEY_METRICS`, ``"gate"`` the
    ``*_gate`` columns, ``"any"`` the ``*_any`` ones). Sorted by N, then M, then false alarms;
    empty when nothing meets them. A NaN rate (nothing drawn) never meets a target.

    Returns:
        Columns ``threshold, confidence, n, m, detect_min_seen, alarm_max_seen``.

    Raises:
        ValueError: ``alarm`` is not one of the three; ``detect_min`` or ``alarm_max`` is not a
            fraction in [0, 1]; ``table`` lacks a column the judgement needs (not a
            :func:`power_table`, or one from before the column existed).
    """
    if alarm not in _JUDGED:
        raise ValueError(f"alarm must be one of {sorted(_JUDGED)}, got {alarm!r}")
    for name, v in (("detect_min", detect_min), ("alarm_max", alarm_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1] (0.95, not 95), got {v!r}")
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"table must be a power_table() DataFrame, got {type(table).__name__}")
    if table.empty:
        return pd.DataFrame(
            columns=["threshold", "confidence", "n", "m", "detect_min_seen", "alarm_max_seen"]
        )
    det_col, alarm_cols = _JUDGED[alarm]
    t = table.copy()
    if det_col is None:
        targets = sorted(set(t["target"])) if "target" in t else []
        need = ["target", *[f"detect_{x}" for x in targets]]
    else:
        need = [det_col]
    missing = [c for c in [*need, *alarm_cols, "threshold", "confidence", "n", "m"] if c not in t]
    if missing:
        raise ValueError(f"table lacks {missing} (not a power_table() of this perfkit)")
    cols = list(alarm_cols) + ([det_col] if det_col else [f"detect_{x}" for x in targets])
    bad = [c for c in cols if not pd.api.types.is_numeric_dtype(t[c])]
    if bad:
        raise ValueError(f"table columns {bad} are not numeric rates")
    if det_col is None:
        t["detect"] = [r[f"detect_{r['target']}"] for _, r in t.iterrows()]
    else:
        t["detect"] = t[det_col]
    t["alarm"] = t[list(alarm_cols)].max(axis=1, skipna=False)
    # NaN (no rate: nothing drawn) is never "met": min/max keep it
    g = t.groupby(["threshold", "confidence", "n", "m"], as_index=False).agg(
        detect_min_seen=("detect", lambda x: x.min(skipna=False)),
        alarm_max_seen=("alarm", lambda x: x.max(skipna=False)),
    )
    ok = g[(g["detect_min_seen"] >= detect_min) & (g["alarm_max_seen"] <= alarm_max)]
    # the fewest launches, then requests; among equals the fewest false alarms, then the most detections
    ok = ok.sort_values(["n", "m", "alarm_max_seen", "detect_min_seen"], ascending=[True, True, True, False])
    return ok.astype({"n": int, "m": int}).reset_index(drop=True)

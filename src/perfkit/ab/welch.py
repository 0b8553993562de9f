"""The Welch t interval of a difference of mean logs for many comparisons at once, and the
decision "is its low end above c?" without a t quantile for every comparison.

:func:`welch_moments` reduces (S, n, K) arrays (S draws, n launches a side, K metrics) to the
difference of means, its standard error and the Welch–Satterthwaite df; :func:`welch_log_intervals`
adds the interval's ends (one ``scipy.special.stdtrit`` a comparison, ~1.7 µs each);
:func:`low_above` answers ``low > c`` for every comparison with the very same floating-point
result as computing ``low`` (``perfkit.ab.power`` asks it for millions of draws).

How :func:`low_above` stays exact: ``low = d − t(df)·se`` is computed as ``fl(d − fl(t·se))``,
and both roundings are monotone, so ``low > c`` can only flip from True to False as ``t`` grows.
The t quantile falls as df grows, so the quantiles at the ends of a df bucket (a geometric grid of
:data:`GRID` points over the draws' df, each bound widened by 1e-9 relative) bracket every
quantile inside it: a draw whose answer is the same at both bounds has that answer; only the
draws left between them (an end near ``c``: within the spread of quantiles of its df bucket and its
neighbours) get their own quantile, computed exactly
as :func:`welch_log_intervals` does. A low end exactly equal to ``c`` is therefore decided by the
same ``fl(d − fl(t·se)) > c`` comparison as before (False).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["GRID", "side_moments", "take", "combine", "welch_moments", "welch_log_intervals", "low_above"]

#: points of the df grid whose t quantiles bracket each draw's (:func:`low_above`)
GRID = 2048


Side = tuple[np.ndarray, np.ndarray, np.ndarray]


def side_moments(x: np.ndarray) -> Side:
    """(count, var/count, mean) of one side's (S, n, K) log values along axis 1 (NaN: not
    measured; var with ddof 1), each (S, K): what :func:`combine` needs of a side. A row's
    numbers depend only on that row, so a side drawn in many comparisons may be reduced once and
    its rows taken (``perfkit.ab.power``'s exact draws)."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN, marked bad
        count = np.isfinite(x).sum(1)
        return count, np.nanvar(x, axis=1, ddof=1) / count, np.nanmean(x, axis=1)


def take(side: Side, rows: np.ndarray) -> Side:
    """The ``rows`` (indices along axis 0) of a :func:`side_moments` result."""
    return tuple(v[rows] for v in side)  # type: ignore[return-value]


def combine(a: Side, b: Side) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, df, bad) of the Welch comparison of side ``b`` with side ``a`` (each from
    :func:`side_moments`, the same shape): as :func:`welch_moments`."""
    (na, va, ma), (nb, vb, mb) = a, b
    with np.errstate(invalid="ignore", divide="ignore"):
        d = mb - ma
        se = np.sqrt(va + vb)
        den = np.where(va > 0, va**2 / (na - 1), 0.0) + np.where(vb > 0, vb**2 / (nb - 1), 0.0)
        df = np.where(den > 0, (va + vb) ** 2 / np.where(den > 0, den, 1.0), np.inf)
    bad = (na < 2) | (nb < 2) | ~np.isfinite(d)
    return d, se, df, bad


def welch_moments(xa: np.ndarray, xb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, df, bad) of the Welch comparison of ``xb`` with ``xa``: (S, n, K) arrays of log
    launch values (NaN: not measured there), reduced along axis 1.

    Returns:
        each (S, K): the difference of mean logs, its standard error, the Welch–Satterthwaite df
        (inf when se = 0), and ``bad`` (True where a side has fewer than 2 values or ``d`` is not
        finite: no interval there).
    """
    return combine(side_moments(xa), side_moments(xb))


def welch_log_intervals(
    xa: np.ndarray, xb: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Welch t interval of mean(xb) − mean(xa) for many comparisons at once: ``xa``, ``xb``
    are (S, n, K) arrays of log launch values (S draws, n launches a side, K metrics; NaN: not
    measured there), reduced along axis 1. :func:`perfkit.ab.stats.ratio_interval` is its
    one-comparison case.

    Returns:
        (d, se, df, low, high), each (S, K): the difference of mean logs, its standard error,
        the Welch–Satterthwaite df (inf when se = 0), and the interval's ends in log units (the
        difference itself when se = 0; NaN when a side has fewer than 2 values).
    """
    # stdtrit is scipy.stats.t.ppf's own kernel (the same numbers) without its per-call overhead
    from scipy.special import stdtrit  # imported here: the CLI starts without scipy (see perfkit.stats)

    d, se, df, bad = welch_moments(xa, xb)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = np.where(se > 0, stdtrit(df, 0.5 + confidence / 2.0) * se, 0.0)
        low, high = d - half, d + half
    low[bad] = np.nan
    high[bad] = np.nan
    return d, se, df, low, high


def low_above(
    d: np.ndarray, se: np.ndarray, df: np.ndarray, bad: np.ndarray, confidence: float, c: float
) -> np.ndarray:
    """``low > c`` for the intervals of :func:`welch_moments`'s (d, se, df, bad) (any one shape)
    at two-sided ``confidence``: the same booleans as ``welch_log_intervals(...)[3] > c`` (False
    where ``bad``: a NaN end is never above), without a t quantile for every element (module doc).
    ``high < c`` is ``low_above(-d, se, df, bad, confidence, -c)`` (IEEE negation is exact).

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    from scipy.special import stdtrit  # imported here: the CLI starts without scipy (see perfkit.stats)

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    q = 0.5 + confidence / 2.0
    d, se, df, bad = (np.asarray(v) for v in (d, se, df, bad))
    out = np.zeros(d.shape, dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        pos = se > 0
        flat = ~bad & ~pos  # half is 0: low is d itself
        out[flat] = d[flat] > c
        todo = ~bad & pos & np.isfinite(df) & (df > 0)
        odd = ~bad & pos & ~todo  # kept for the exact path below
        dt, st, ft = d[todo], se[todo], df[todo]
        amb = np.zeros(dt.shape, dtype=bool)
        if dt.size:
            lo, hi = float(ft.min()), float(ft.max())
            g = GRID if hi > lo else 2
            grid = np.geomspace(lo, hi, g) if hi > lo else np.array([lo, hi])
            grid[0], grid[-1] = lo, hi
            tq = stdtrit(grid, q)  # falls as df grows
            step = np.log(hi / lo) / (g - 1) if hi > lo else 1.0
            j = np.clip(np.floor(np.log(ft / lo) / step).astype(np.int64), 0, g - 1)
            t_big = tq[np.clip(j - 1, 0, g - 1)] * (1 + 1e-9)  # ≥ every quantile in the bucket
            t_small = tq[np.clip(j + 2, 0, g - 1)] * (1 - 1e-9)  # ≤ every quantile in the bucket
            yes = (dt - t_big * st) > c  # true even at the largest quantile
            no = ~((dt - t_small * st) > c)  # false even at the smallest
            res = yes
            amb = ~yes & ~no
            res[amb] = (dt[amb] - stdtrit(ft[amb], q) * st[amb]) > c
            out[todo] = res
        if odd.any():  # df not finite or not positive: as welch_log_intervals computes it
            out[odd] = (d[odd] - stdtrit(df[odd], q) * se[odd]) > c
    return out

"""Ratio intervals with the engine launch as the unit of repetition (A/B, history's steps), part
of :mod:`perfkit.stats` (import them from there): Welch t intervals on log launch values, their
decisions and sizing (Kalibera & Jones, ISMM 2013). Why Welch t and not a bootstrap or a rank
test: docs/choosing-n-m.md. Ratios and fractions are unitless; inputs in any positive unit."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import numpy as np

#: Default decision threshold: a ratio interval wholly above 1 + 5 % is a regression, wholly below
#: 1 − 5 % an improvement, wholly inside ±5 % no change. 5 % is the smallest change the 2-core CPU
#: runner resolves at 4 launches a side (its tiny preset's warm request has a CV of 12 %); on an
#: H200 (launch-mean CV 1–2 %) a recorded A/A gives a tighter one (``--threshold-from``).
DEFAULT_THRESHOLD = 0.05
#: Two-sided confidence of the intervals (each one-sided error 2.5 %).
DEFAULT_CONFIDENCE = 0.95
#: Decision words, worst first.
DECISIONS = ("regression", "inconclusive", "improvement", "no change", "not measured")


def _positive(x: Any) -> np.ndarray:
    a = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=float).ravel()
    return a[np.isfinite(a) & (a > 0)]


def _check(confidence: float, n_resamples: int = 1) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")


@dataclass(frozen=True)
class RatioInterval:
    """Ratio B/A of the geometric means of per-launch values (launch medians), with its Welch t
    interval: ``ratio`` exp(mean log B − mean log A) (unitless; NaN when a side has no launch),
    ``low``/``high`` (NaN with fewer than 2 launches on a side) at two-sided ``confidence``,
    ``n_a``/``n_b`` launches used, Welch–Satterthwaite ``df``, ``se_log`` the log ratio's standard
    error, ``sd_log_a``/``sd_log_b`` the sides' SD of log launch values (≈ CV of launch means)."""

    ratio: float
    low: float
    high: float
    n_a: int
    n_b: int
    df: float
    se_log: float
    sd_log_a: float
    sd_log_b: float
    confidence: float

    @property
    def pvalue(self) -> float:
        """Two-sided p-value of Welch's t-test of ratio 1 on the log values (``scipy.special.stdtr``);
        with se 0: 1 for ratio 1, else 0; NaN with fewer than 2 launches on a side."""
        from scipy.special import stdtr

        if not self.se_log > 0:
            return self.se_log if math.isnan(self.se_log) else float(self.ratio == 1.0)
        return float(2.0 * stdtr(self.df, -abs(math.log(self.ratio)) / self.se_log))


def ratio_interval(
    a: Iterable[float], b: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
) -> RatioInterval:
    """Welch t interval of the ratio B/A from one value per launch and side (a launch median, or
    its single value such as its ready time; any positive unit: ms, s, MiB; non-finite and
    non-positive values dropped). Returns a :class:`RatioInterval`: ``ratio`` the ratio of
    geometric means, [low, high] ``exp(d ± t_{df, (1+c)/2} · se)`` with d the difference of mean
    logs, ``se = sqrt(s_a²/n_a + s_b²/n_b)`` and Welch–Satterthwaite df; both sides constant
    (se = 0): the ratio itself; fewer than 2 launches on a side: NaN ends. Raises ValueError:
    confidence outside (0, 1)."""
    la, lb = np.log(_positive(a)), np.log(_positive(b))
    return _interval(la, lb, confidence, _sd(la), _sd(lb))


def _sd(x: np.ndarray) -> float:
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


def _interval(la: np.ndarray, lb: np.ndarray, confidence: float, sa: float, sb: float) -> RatioInterval:
    """:class:`RatioInterval` of log values ``la``, ``lb`` (1-D) by :func:`welch_log_intervals`."""
    na, nb, nan = la.size, lb.size, math.nan
    if na == 0 or nb == 0:
        _check(confidence)
        return RatioInterval(nan, nan, nan, na, nb, nan, nan, nan, nan, confidence)
    d, se, df, low, high = (
        float(v[0, 0]) for v in welch_log_intervals(la[None, :, None], lb[None, :, None], confidence)
    )
    if na < 2 or nb < 2:
        se = df = nan
    with np.errstate(over="ignore"):  # inf, not an error, past 1e308
        low, high = (float(v) for v in np.exp([low, high]))
    return RatioInterval(math.exp(d), low, high, na, nb, df, se, sa, sb, confidence)


# ---------------------------------------------------------------- many comparisons at once (numpy)
Side = tuple[np.ndarray, np.ndarray, np.ndarray]
#: above this many quantiles, :func:`t_quantiles` interpolates (a power table asks for millions)
SPLINE_MIN = 4096
#: knots of that interpolation a unit of log df (at least 64, at most 16,384 knots)
SPLINE_KNOTS = 1024


def t_quantiles(df: np.ndarray, q: float) -> np.ndarray:
    """Student t quantiles ``scipy.special.stdtrit(df, q)`` of an array of degrees of freedom
    (any shape; inf: the normal quantile; NaN or df <= 0: NaN). For more than
    :data:`SPLINE_MIN` finite df a cubic spline in log df through exact quantiles
    (:data:`SPLINE_KNOTS` a unit of log df) (relative error below 1e-9, ``tests/test_ab_welch.py``): stdtrit costs 2-3 µs each."""
    from scipy.special import stdtrit  # here: the CLI starts without scipy

    df = np.asarray(df, dtype=float)
    ok = np.isfinite(df) & (df > 0)
    if np.count_nonzero(ok) <= SPLINE_MIN or df[ok].min() == df[ok].max():
        with np.errstate(invalid="ignore"):
            return np.asarray(stdtrit(df, q), dtype=float)
    from scipy.interpolate import CubicSpline

    u = np.log(df[ok])
    span = float(u.max() - u.min())
    knots = np.linspace(u.min(), u.max(), int(np.clip(span * SPLINE_KNOTS, 64, 16384)))
    out = np.empty(df.shape)
    with np.errstate(invalid="ignore"):
        out[~ok] = stdtrit(df[~ok], q)  # inf, NaN, <= 0 as stdtrit says
    out[ok] = CubicSpline(knots, stdtrit(np.exp(knots), q))(u)
    return out


def side_moments(x: np.ndarray) -> Side:
    """(count, var/count, mean) of one side's (S, n, K) log values along axis 1 (NaN: not
    measured; var with ddof 1), each (S, K): what :func:`combine` needs of a side. A row's
    numbers depend only on that row, so a side drawn in many comparisons may be reduced once and
    its rows indexed (``perfkit.ab.power``'s draws)."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN, marked bad
        count = np.isfinite(x).sum(1)
        return count, np.nanvar(x, axis=1, ddof=1) / count, np.nanmean(x, axis=1)


def combine(a: Side, b: Side) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, df, bad) of the Welch comparison of side ``b`` with side ``a`` (each from
    :func:`side_moments`, the same shape): the difference of mean logs, its standard error, the
    Welch–Satterthwaite df (inf when se = 0), and ``bad`` (a side with fewer than 2 values or
    ``d`` not finite: no interval there)."""
    (na, va, ma), (nb, vb, mb) = a, b
    with np.errstate(invalid="ignore", divide="ignore"):
        d = mb - ma
        se = np.sqrt(va + vb)
        den = np.where(va > 0, va**2 / (na - 1), 0.0) + np.where(vb > 0, vb**2 / (nb - 1), 0.0)
        df = np.where(den > 0, (va + vb) ** 2 / np.where(den > 0, den, 1.0), np.inf)
    bad = (na < 2) | (nb < 2) | ~np.isfinite(d)
    return d, se, df, bad


def log_ends(
    d: np.ndarray, se: np.ndarray, df: np.ndarray, bad: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the Welch t intervals of :func:`combine`'s (d, se, df, bad) at two-sided
    ``confidence``, in log units: ``d ± t_df · se`` (``d`` itself when se = 0; NaN where bad).
    Raises ValueError: ``confidence`` outside (0, 1)."""
    _check(confidence)
    with np.errstate(invalid="ignore", over="ignore"):
        half = np.where(se > 0, t_quantiles(np.where(se > 0, df, 1.0), 0.5 + confidence / 2.0) * se, 0.0)
        low, high = d - half, d + half
    return np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def welch_log_intervals(
    xa: np.ndarray, xb: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Welch t interval of mean(xb) − mean(xa) for many comparisons at once: ``xa``, ``xb``
    are (S, n, K) arrays of log launch values (S draws, n launches a side, K metrics; NaN: not
    measured there), reduced along axis 1; :func:`ratio_interval` is its one-comparison case.
    Returns (d, se, df, low, high), each (S, K): as :func:`combine` and :func:`log_ends`."""
    d, se, df, bad = combine(side_moments(xa), side_moments(xb))
    return (d, se, df, *log_ends(d, se, df, bad, confidence))


def paired_ratio_interval(
    a: Iterable[float], b: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
) -> RatioInterval:
    """Paired t interval of the ratio B/A from launch pairs (``perfkit ab --paired``): ``a[i]``
    and ``b[i]`` are one pair (any positive unit: ms, s, MiB; a pair with a non-finite or
    non-positive value on either side is dropped whole). Returns a :class:`RatioInterval` with
    ``n_a == n_b`` = pairs used: ``ratio`` = exp(mean d) over ``d_i = log b_i − log a_i``,
    [low, high] = ``exp(mean d ± t_{n−1, (1+c)/2} · sd(d)/√n)`` (Student's paired t); fewer than 2
    pairs: NaN ends. Raises ValueError: confidence outside (0, 1); ``a`` and ``b`` of different lengths."""
    xa, xb = (np.asarray(x if isinstance(x, np.ndarray) else list(x), dtype=float).ravel() for x in (a, b))
    if xa.size != xb.size:
        raise ValueError(f"paired values need one B per A: {xa.size} A values, {xb.size} B values")
    ok = np.isfinite(xa) & np.isfinite(xb) & (xa > 0) & (xb > 0)
    la, lb = np.log(xa[ok]), np.log(xb[ok])
    # Welch's interval of the differences against as many zeros is Student's paired one
    iv = _interval(np.zeros(la.size), lb - la, confidence, _sd(la), _sd(lb))
    return replace(iv, df=float(la.size - 1)) if iv.se_log > 0 else iv


@dataclass(frozen=True)
class VarianceSplit:
    """Variance of log values split between and within launches (one-way random effects):
    ``between`` σ_b² (log²: of launch means beyond what the requests inside explain; √ ≈ CV
    between launches), ``within`` σ_w² (log²: of requests around their launch mean), ``icc``
    σ_b² / (σ_b² + σ_w²) (intraclass correlation: the share of a request's variance between
    launches), ``launches`` used and mean ``requests_per_launch``."""

    between: float
    within: float
    icc: float
    launches: int
    requests_per_launch: float

    @property
    def cv_between(self) -> float:
        """√σ_b² (≈ CV of launch means beyond request noise, unitless)."""
        return math.sqrt(self.between) if self.between >= 0 else math.nan

    @property
    def cv_within(self) -> float:
        """√σ_w² (≈ CV of requests inside a launch, unitless)."""
        return math.sqrt(self.within) if self.within >= 0 else math.nan


def variance_split(
    values: Iterable[float], launches: Iterable[Any], sides: Iterable[Any] | None = None
) -> VarianceSplit:
    """One-way ANOVA estimate of the variance components of log ``values`` (one a request, any
    positive unit; non-positive/non-finite dropped) of ``launches`` (each value's label, unique
    across sides) nested in ``sides`` (each value's ``"A"``/``"B"``, whose means are removed first
    so a real A/B difference is not variance between launches; None: one side). Returns a
    :class:`VarianceSplit` with σ_w² = MSW and σ_b² = max(0, (MSB − MSW) / m₀), m₀ the ANOVA's
    effective group size (Searle, Casella & McCulloch, Variance Components, §3.5); NaN components
    with fewer than 2 launches or no launch with 2 requests."""
    import pandas as pd

    v = np.asarray(list(values), dtype=float)
    lab = list(launches)
    sd = list(sides) if sides is not None else ["_"] * len(lab)
    df = pd.DataFrame({"x": v, "launch": lab, "side": sd})
    df = df[np.isfinite(df["x"]) & (df["x"] > 0)]
    df = df.assign(x=np.log(df["x"]))
    nan = math.nan
    if df.empty:
        return VarianceSplit(nan, nan, nan, 0, nan)
    g = df.groupby(["side", "launch"], sort=False)["x"]
    sizes, means = g.size(), g.mean()
    k, n = len(sizes), int(sizes.sum())
    n_sides = df["side"].nunique()
    ss_w = float(((df["x"] - g.transform("mean")) ** 2).sum())
    side_mean = df.groupby("side")["x"].mean()
    ss_b = float(sum(sizes[i] * (means[i] - side_mean[i[0]]) ** 2 for i in sizes.index))
    df_w, df_b = n - k, k - n_sides
    m_bar = n / k
    if df_b < 1 or df_w < 1:
        return VarianceSplit(nan, ss_w / df_w if df_w >= 1 else nan, nan, k, m_bar)
    msw, msb = ss_w / df_w, ss_b / df_b
    # effective group size, per side then pooled (equal sizes: m)
    ns = sizes.groupby(level=0).sum()
    m0 = float((ns - (sizes**2).groupby(level=0).sum() / ns).sum()) / df_b
    between = max(0.0, (msb - msw) / m0) if m0 > 0 else nan
    total = between + msw
    return VarianceSplit(between, msw, between / total if total > 0 else nan, k, m_bar)


def decide(iv: RatioInterval, threshold: float = DEFAULT_THRESHOLD) -> str:
    """The decision for one metric: ``regression``: the interval lies above 1 + threshold;
    ``improvement``: below 1 − threshold; ``no change``: inside [1 − threshold, 1 + threshold];
    ``inconclusive``: anything else (it straddles a boundary, or a side has a single launch);
    ``not measured``: a side has no value."""
    if iv.n_a == 0 or iv.n_b == 0 or not math.isfinite(iv.ratio):
        return "not measured"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return "inconclusive"
    if iv.low > 1.0 + threshold:
        return "regression"
    if iv.high < 1.0 - threshold:
        return "improvement"
    if iv.low >= 1.0 - threshold and iv.high <= 1.0 + threshold:
        return "no change"
    return "inconclusive"


def launches_needed(
    iv: RatioInterval, threshold: float = DEFAULT_THRESHOLD, max_launches: int = 200, paired: bool = False
) -> int | None:
    """Launches a side that would decide a metric, if the ratio and the noise stay as measured
    (Kalibera & Jones 2013, §"dimensioning"): the smallest n (≥ the current count) whose half-width
    ``t · se · √(k / n)`` (k = 2 / (1/n_a + 1/n_b); t at df 2n − 2, paired n − 1, and
    ``iv.confidence``) fits between the log ratio and the nearest boundary (log(1 ± threshold));
    None with fewer than 2 launches on a side or past ``max_launches`` (the ratio on a boundary)."""
    if iv.n_a < 2 or iv.n_b < 2 or not (math.isfinite(iv.ratio) and math.isfinite(iv.se_log)):
        return None
    lr = math.log(iv.ratio)
    up, lo = math.log1p(threshold), math.log1p(-threshold)
    margin = abs(max(lr - up, lo - lr))  # to the nearest boundary, outside or inside the band
    if margin <= 0:
        return None
    if iv.se_log == 0:
        return max(iv.n_a, iv.n_b)
    from scipy.special import stdtrit  # scipy.stats.t.ppf's kernel, without its per-call cost

    k = 2.0 / (1.0 / iv.n_a + 1.0 / iv.n_b)
    for n in range(max(2, min(iv.n_a, iv.n_b)), max_launches + 1):
        df = n - 1 if paired else 2 * n - 2
        if float(stdtrit(df, 0.5 + iv.confidence / 2.0)) * iv.se_log * math.sqrt(k / n) < margin:
            return n
    return None


def requests_per_launch(split: VarianceSplit, launch_cost_s: float, request_cost_s: float) -> int | None:
    """Warm requests per launch that spend a fixed time best, ``M*`` of docs/choosing-n-m.md
    (Kalibera & Jones 2013): ``launch_cost_s`` one more launch (s: cold start + cold request),
    ``request_cost_s`` one more warm request (s). At least 1; None when σ_b² is 0 or unknown."""
    b, w = split.between, split.within
    if not (math.isfinite(b) and math.isfinite(w)) or b <= 0 or request_cost_s <= 0:
        return None
    return max(1, math.ceil(math.sqrt(launch_cost_s / request_cost_s * w / b)))


def interleaved_order(n: int | Mapping[str, int]) -> list[str]:
    """Balanced interleaved launch order: for n launches a side ``A B B A A B B A …`` (rounds
    alternate AB / BA, so a drift of the host over the run hits both sides alike; asv's
    ``continuous`` alternates rounds the same way). Given a mapping arm -> launches (a power
    pool with several B arms), each round holds every arm with launches left, forward in even
    rounds and backward in odd ones: ``{"A": 2, "B": 2, "C": 1}`` gives ``A B C B A``.
    Raises ValueError: a count < 1 (or no arm)."""
    counts = {"A": n, "B": n} if isinstance(n, int) else dict(n)
    if not counts or min(counts.values()) < 1:
        raise ValueError(f"launches per side must be >= 1, got {n}")
    out: list[str] = []
    for i in range(max(counts.values())):
        arms = [arm for arm, k in counts.items() if k > i]
        out += arms if i % 2 == 0 else arms[::-1]
    return out

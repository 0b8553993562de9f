"""perfkit's statistics: one series' medians, bootstrap and quantile intervals, rank tests, slopes;
launch-level Welch t ratio intervals, decisions and sizing (Kalibera & Jones, ISMM 2013; why:
docs/choosing-n-m.md). Results in the input unit unless said; non-finite inputs dropped; scipy
imported where needed (the CLI starts without it)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Literal, Mapping

import numpy as np

#: fewest samples a side for which :func:`mann_whitney` runs the rank test
MIN_RANK_TEST_SAMPLES = 5

# elements of one resample matrix at most (chunks of rows above it)
_MAX_MATRIX_ELEMENTS = 4_000_000


def _clean(x: Any) -> np.ndarray:
    """1-D float array of the finite values of ``x``."""
    a = np.asarray(x, dtype=float).ravel()
    return a[np.isfinite(a)]


def median_iqr(x: Any) -> tuple[float, float, float]:
    """``(median, q1, q3)`` of a sample, in its unit; all NaN for an empty sample."""
    a = _clean(x)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    q1, med, q3 = np.percentile(a, [25.0, 50.0, 75.0])
    return (float(med), float(q1), float(q3))


def _bootstrap_medians(a: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    n = a.size
    if n == 1:
        return np.full(n_resamples, a[0])
    rows = max(1, _MAX_MATRIX_ELEMENTS // n)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(a[idx], axis=1)
    return out


def _ends(v: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    lo, hi = np.quantile(v, [alpha / 2.0, 1.0 - alpha / 2.0])
    return (float(lo), float(hi))


def bootstrap_median_ci(
    x: Any, confidence: float = 0.95, n_resamples: int = 2000, seed: int | None = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval ``(lo, hi)`` of the median, in the unit of ``x``; ``(v, v)``
    for one value, NaN for none. Raises ValueError: confidence outside (0, 1), n_resamples < 1."""
    _check(confidence, n_resamples)
    a = _clean(x)
    if a.size == 0:
        return (math.nan, math.nan)
    return _ends(_bootstrap_medians(a, n_resamples, np.random.default_rng(seed)), confidence)


def bootstrap_ratio_ci(
    a: Any, b: Any, confidence: float = 0.95, n_resamples: int = 2000, seed: int | None = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval ``(lo, hi)`` of ``median(a) / median(b)``, sides resampled
    independently (a side of one value held fixed); NaN when a side is empty."""
    _check(confidence, n_resamples)
    xa, xb = _clean(a), _clean(b)
    if xa.size == 0 or xb.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    ma = _bootstrap_medians(xa, n_resamples, rng)
    mb = _bootstrap_medians(xb, n_resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = ma / mb
    ratios = ratios[~np.isnan(ratios)]
    if ratios.size == 0:
        return (math.nan, math.nan)
    return _ends(ratios, confidence)


def bootstrap_mean_ratio_ci(a: Any, b: Any, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval ``(lo, hi)`` of ``mean(a) / mean(b)`` (``scipy.stats.bootstrap``);
    NaN when a side has fewer than 2 values or both are constant."""
    from scipy.stats import bootstrap

    xa, xb = _clean(a), _clean(b)
    if xa.size < 2 or xb.size < 2 or xa.std() + xb.std() == 0:
        return (math.nan, math.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ci = bootstrap(
            (xa, xb),
            lambda x, y, axis: x.mean(axis) / y.mean(axis),
            vectorized=True,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
    return (float(ci.low), float(ci.high))


def ratio_lower_bound_single_reference(
    sample: Any, reference: float, confidence: float = 0.95, n_resamples: int = 4000, seed: int | None = 0
) -> float:
    """One-sided lower bound of ``median(sample) / reference``, one reference measurement given the
    sample's relative spread (draws ``reference * x_j / median``) so a noisy reference cannot fail
    an identical build. NaN for an empty sample or a reference not positive and finite."""
    _check(confidence, n_resamples)
    x = _clean(sample)
    ref = float(reference) if reference is not None else math.nan
    if x.size == 0 or not math.isfinite(ref) or ref <= 0:
        return math.nan
    med = float(np.median(x))
    if x.size == 1 or med <= 0:
        return med / ref
    rng = np.random.default_rng(seed)
    meds = _bootstrap_medians(x, n_resamples, rng)
    refs = ref * x[rng.integers(0, x.size, n_resamples)] / med
    return float(np.quantile(meds / refs, 1.0 - confidence))


def mann_whitney(
    a: Any,
    b: Any,
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
    rel_threshold: float = 0.10,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Mann-Whitney U test of ``a`` against ``b``; below :data:`MIN_RANK_TEST_SAMPLES` a side a
    separation rule (docs/suite.md, "Investigations that are off by default"). Returns a dict:
    ``decision`` (``a slower``, ``b slower``, ``no difference``, ``inconclusive``), ``statistic``,
    ``pvalue``, ``note`` and the sides' counts and medians. Raises ValueError: bad ``alternative``."""
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    xa, xb = _clean(a), _clean(b)
    na, nb = int(xa.size), int(xb.size)
    med_a = float(np.median(xa)) if na else math.nan
    med_b = float(np.median(xb)) if nb else math.nan
    out: dict[str, Any] = {
        "statistic": None,
        "pvalue": None,
        "method": "insufficient-samples",
        "n_a": na,
        "n_b": nb,
        "note": "",
        "decision": "inconclusive",
        "a_slower": False,
        "median_a": med_a,
        "median_b": med_b,
        "alternative": alternative,
    }
    if na == 0 or nb == 0:
        out["note"] = f"empty sample (n_a={na}, n_b={nb}): nothing to compare"
        return out

    if na >= MIN_RANK_TEST_SAMPLES and nb >= MIN_RANK_TEST_SAMPLES:
        from scipy import stats as _sst

        res = _sst.mannwhitneyu(xa, xb, alternative=alternative)
        p = float(res.pvalue)
        a_wins, b_wins = p < alpha and med_a > med_b, p < alpha and med_b > med_a
        out.update(statistic=float(res.statistic), pvalue=p, method="mannwhitneyu")
        out["note"] = f"Mann-Whitney U ({alternative}), p={p:.3g} vs alpha={alpha}"
    else:
        sep_a = bool(xa.min() > xb.max())
        sep_b = bool(xb.min() > xa.max())
        a_wins = sep_a and med_a > med_b * (1.0 + rel_threshold)
        b_wins = sep_b and med_b > med_a * (1.0 + rel_threshold)
        out["note"] = (
            f"fewer than {MIN_RANK_TEST_SAMPLES} samples on a side (n_a={na}, n_b={nb}): no "
            f"p-value; rule: slower only with complete separation and a median difference "
            f"> {rel_threshold:.0%} (separated: a>b {sep_a}, b>a {sep_b}; "
            f"medians {med_a:.4g} vs {med_b:.4g})"
        )
    a_wins, b_wins = a_wins and alternative != "less", b_wins and alternative != "greater"
    out["decision"] = "a slower" if a_wins else "b slower" if b_wins else "no difference"
    out["a_slower"] = out["decision"] == "a slower"
    return out


def slope_per_index(y: Any) -> float:
    """Least-squares slope of ``y`` against its index, in units of ``y`` per step; NaN below 2
    finite points (non-finite values dropped with their index)."""
    arr = np.asarray(y, dtype=float).ravel()
    x = np.arange(arr.size, dtype=float)
    keep = np.isfinite(arr)
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(x[keep], arr[keep], 1)[0])


def slope_lower_bound(y: Any, confidence: float = 0.95) -> float:
    """One-sided lower bound of :func:`slope_per_index`'s slope (slope − t(n−2) · stderr), in units
    of ``y`` per step; 0 for a constant series, NaN below 3 finite points."""
    from scipy.stats import linregress, t

    arr = np.asarray(y, dtype=float).ravel()
    keep = np.isfinite(arr)
    if keep.sum() < 3:
        return math.nan
    x, y = np.arange(arr.size, dtype=float)[keep], arr[keep]
    if np.ptp(y) == 0:  # linregress's stderr is NaN
        return 0.0
    fit = linregress(x, y)
    return float(fit.slope - t.ppf(confidence, y.size - 2) * fit.stderr)


def relative_drift(first: float, last: float) -> float:
    """``last / first - 1``; NaN when ``first`` is 0 or either value is not finite."""
    f, l_ = float(first), float(last)
    if not (math.isfinite(f) and math.isfinite(l_)) or f == 0.0:
        return math.nan
    return l_ / f - 1.0


def quantile_bounded_from(q: float, confidence: float = 0.95) -> int:
    """Fewest samples that bound the ``q`` quantile from above at ``confidence`` (p99 at 95 %: 368)."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(q))


def quantile_ci(x: Any, q: float, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free (binomial) interval (low, high) of the ``q`` quantile from order
    statistics, in the units of ``x``; an end the samples cannot bound is NaN. Raises
    ValueError: ``q`` or ``confidence`` outside (0, 1)."""
    from scipy.stats import binom

    if not (0 < q < 1 and 0 < confidence < 1):
        raise ValueError(f"q and confidence must lie in (0, 1), got q={q}, confidence={confidence}")
    a = np.sort(_clean(x))
    n = a.size
    if n == 0:
        return math.nan, math.nan
    alpha = 1 - confidence
    # largest l with P(B < l) <= alpha/2, smallest u with P(B >= u) <= alpha/2 (1-based ranks)
    lo_rank = int(binom.ppf(alpha / 2, n, q))
    if binom.cdf(lo_rank, n, q) > alpha / 2:
        lo_rank -= 1
    hi_rank = int(binom.ppf(1 - alpha / 2, n, q)) + 1
    lo = float(a[lo_rank]) if lo_rank >= 0 else math.nan
    hi = float(a[hi_rank - 1]) if hi_rank <= n else math.nan
    return lo, hi


#: default decision threshold (fraction; docs/ab.md)
DEFAULT_THRESHOLD = 0.05
DEFAULT_CONFIDENCE = 0.95
#: decision words, worst first
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
    """Ratio B/A of the geometric means of per-launch values and its t interval (``low``/``high``
    NaN below 2 launches a side); ``se_log`` the log ratio's standard error, ``sd_log_a``/``_b``
    the sides' SD of log values."""

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
        """Two-sided p-value of the t-test of ratio 1 (se 0: 1 for ratio 1, else 0)."""
        from scipy.special import stdtr

        if not self.se_log > 0:
            return self.se_log if math.isnan(self.se_log) else float(self.ratio == 1.0)
        return float(2.0 * stdtr(self.df, -abs(math.log(self.ratio)) / self.se_log))


def ratio_interval(
    a: Iterable[float], b: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
) -> RatioInterval:
    """Welch t interval of the ratio B/A from one positive value per launch and side (others
    dropped): ``exp(d ± t · se)``, d the difference of mean logs. Raises ValueError: confidence
    outside (0, 1)."""
    la, lb = np.log(_positive(a)), np.log(_positive(b))
    return _interval(la, lb, confidence, _sd(la), _sd(lb))


def _sd(x: np.ndarray) -> float:
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


def _interval(la: np.ndarray, lb: np.ndarray, confidence: float, sa: float, sb: float) -> RatioInterval:
    na, nb, nan = la.size, lb.size, math.nan
    if na == 0 or nb == 0:
        _check(confidence)
        return RatioInterval(nan, nan, nan, na, nb, nan, nan, nan, nan, confidence)
    d, se, df, low, high = (
        float(v[0, 0]) for v in welch_log_intervals(la[None, :, None], lb[None, :, None], confidence)
    )
    if na < 2 or nb < 2:
        se = df = nan
    with np.errstate(over="ignore"):
        low, high = (float(v) for v in np.exp([low, high]))
    return RatioInterval(math.exp(d), low, high, na, nb, df, se, sa, sb, confidence)


# ---------------------------------------------------------------- many comparisons at once (numpy)
Side = tuple[np.ndarray, np.ndarray, np.ndarray]
#: above this many quantiles, :func:`t_quantiles` interpolates
SPLINE_MIN = 4096
#: knots of that interpolation a unit of log df (at least 64, at most 16,384 knots)
SPLINE_KNOTS = 1024


def t_quantiles(df: np.ndarray, q: float) -> np.ndarray:
    """``scipy.special.stdtrit(df, q)`` of an array of df (NaN or df <= 0: NaN); above
    :data:`SPLINE_MIN` finite df a cubic spline in log df (relative error below 1e-9)."""
    from scipy.special import stdtrit

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
        out[~ok] = stdtrit(df[~ok], q)
    out[ok] = CubicSpline(knots, stdtrit(np.exp(knots), q))(u)
    return out


def side_moments(x: np.ndarray) -> Side:
    """(count, var/count, mean), each (S, K), of one side's (S, n, K) log values along axis 1
    (NaN: not measured)."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        count = np.isfinite(x).sum(1)
        return count, np.nanvar(x, axis=1, ddof=1) / count, np.nanmean(x, axis=1)


def combine(a: Side, b: Side) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, df, bad) of the Welch comparison of :func:`side_moments` ``b`` with ``a``: ``df`` inf
    when se = 0; ``bad`` where a side has fewer than 2 values or ``d`` is not finite."""
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
    """(low, high) ``d ± t_df · se`` in log units (NaN where bad). Raises ValueError: ``confidence``
    outside (0, 1)."""
    _check(confidence)
    with np.errstate(invalid="ignore", over="ignore"):
        half = np.where(se > 0, t_quantiles(np.where(se > 0, df, 1.0), 0.5 + confidence / 2.0) * se, 0.0)
        low, high = d - half, d + half
    return np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def welch_log_intervals(
    xa: np.ndarray, xb: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Welch t intervals of mean(xb) − mean(xa) of (S draws, n launches, K metrics) log values
    along axis 1: (d, se, df, low, high), each (S, K)."""
    d, se, df, bad = combine(side_moments(xa), side_moments(xb))
    return (d, se, df, *log_ends(d, se, df, bad, confidence))


def paired_ratio_interval(
    a: Iterable[float], b: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
) -> RatioInterval:
    """Student's paired t interval of the ratio B/A from launch pairs ``(a[i], b[i])`` (a pair not
    positive and finite dropped whole); ``n_a == n_b`` the pairs used. Raises ValueError:
    confidence outside (0, 1); ``a`` and ``b`` of different lengths."""
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
    """Variance of log values between launches (σ_b²) and within them (σ_w²), one-way random
    effects; ``icc`` σ_b² / (σ_b² + σ_w²)."""

    between: float
    within: float
    icc: float
    launches: int
    requests_per_launch: float

    @property
    def cv_between(self) -> float:
        """√σ_b² (≈ CV of launch means beyond request noise, unitless; NaN when σ_b² < 0)."""
        return math.sqrt(self.between) if self.between >= 0 else math.nan

    @property
    def cv_within(self) -> float:
        """√σ_w² (≈ CV of requests inside a launch, unitless; NaN when σ_w² < 0)."""
        return math.sqrt(self.within) if self.within >= 0 else math.nan


def variance_split(
    values: Iterable[float], launches: Iterable[Any], sides: Iterable[Any] | None = None
) -> VarianceSplit:
    """One-way ANOVA variance components of log ``values`` by ``launches`` nested in ``sides``
    (their means removed first): σ_b² = max(0, (MSB − MSW) / m₀) (Searle, Casella & McCulloch,
    Variance Components, §3.5); NaN below 2 launches or no launch with 2 requests."""
    import pandas as pd

    df = pd.DataFrame({"x": np.asarray(list(values), dtype=float), "launch": list(launches)})
    df["side"] = list(sides) if sides is not None else "_"
    df = df[np.isfinite(df["x"]) & (df["x"] > 0)].assign(x=lambda d: np.log(d["x"]))
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
    """``regression`` / ``improvement``: the interval lies beyond 1 ± threshold; ``no change``:
    inside; ``not measured``: a side has no value; else ``inconclusive``."""
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
    """Launches a side that would decide a metric if the ratio and noise stay as measured (Kalibera
    & Jones 2013, "dimensioning"); None below 2 launches a side or past ``max_launches``."""
    if iv.n_a < 2 or iv.n_b < 2 or not (math.isfinite(iv.ratio) and math.isfinite(iv.se_log)):
        return None
    lr = math.log(iv.ratio)
    up, lo = math.log1p(threshold), math.log1p(-threshold)
    margin = abs(max(lr - up, lo - lr))  # to the nearest boundary
    if margin <= 0:
        return None
    if iv.se_log == 0:
        return max(iv.n_a, iv.n_b)
    from scipy.special import stdtrit

    k = 2.0 / (1.0 / iv.n_a + 1.0 / iv.n_b)
    for n in range(max(2, min(iv.n_a, iv.n_b)), max_launches + 1):
        df = n - 1 if paired else 2 * n - 2
        if float(stdtrit(df, 0.5 + iv.confidence / 2.0)) * iv.se_log * math.sqrt(k / n) < margin:
            return n
    return None


def requests_per_launch(split: VarianceSplit, launch_cost_s: float, request_cost_s: float) -> int | None:
    """Warm requests per launch that spend a fixed time best (``M*``, docs/choosing-n-m.md); None
    when σ_b² is 0 or unknown."""
    b, w = split.between, split.within
    if not (math.isfinite(b) and math.isfinite(w)) or b <= 0 or request_cost_s <= 0:
        return None
    return max(1, math.ceil(math.sqrt(launch_cost_s / request_cost_s * w / b)))


def interleaved_order(n: int | Mapping[str, int]) -> list[str]:
    """Launch order ``A B B A A B …`` for n a side, or for arm -> launches rounds forward and
    backward (``{"A": 2, "B": 2, "C": 1}``: ``A B C B A``). Raises ValueError: a count < 1."""
    counts = {"A": n, "B": n} if isinstance(n, int) else dict(n)
    if not counts or min(counts.values()) < 1:
        raise ValueError(f"launches per side must be >= 1, got {n}")
    out: list[str] = []
    for i in range(max(counts.values())):
        arms = [arm for arm, k in counts.items() if k > i]
        out += arms if i % 2 == 0 else arms[::-1]
    return out

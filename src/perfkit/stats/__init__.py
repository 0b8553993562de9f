"""perfkit's statistics, one surface: medians, bootstrap intervals, rank tests, slopes and
order-statistic quantile intervals of one series, and the launch-level Welch t ratio intervals
(the engine launch the unit of repetition: A/B, history's steps), their decisions and sizing
(Kalibera & Jones, ISMM 2013; why Welch t and not a bootstrap or a rank test:
docs/choosing-n-m.md).

Results are in the input unit (ms, MiB) unless said (ratios, fractions, drifts: unitless).
Inputs are array-likes; non-finite values are dropped first. Bootstraps are seeded and
vectorised. scipy is imported inside the functions that need it (the CLI starts without it)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Literal, Mapping

import numpy as np

#: Fewest samples per side for which :func:`mann_whitney` runs the rank test.
MIN_RANK_TEST_SAMPLES = 5

# elements of one resample matrix at most (chunks of rows above it): a long series allocates no GiB
_MAX_MATRIX_ELEMENTS = 4_000_000


def _clean(x: Any) -> np.ndarray:
    """1-D float array of the finite values of ``x``."""
    a = np.asarray(x, dtype=float).ravel()
    return a[np.isfinite(a)]


def median_iqr(x: Any) -> tuple[float, float, float]:
    """``(median, q1, q3)`` of a sample, in its unit (q1/q3: the 25th/75th percentiles, linear
    interpolation); all NaN for an empty sample."""
    a = _clean(x)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    q1, med, q3 = np.percentile(a, [25.0, 50.0, 75.0])
    return (float(med), float(q1), float(q3))


def _bootstrap_medians(a: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``n_resamples`` resamples (with replacement) of ``a``: shape ``(n_resamples,)``."""
    n = a.size
    if n == 1:
        return np.full(n_resamples, a[0])
    rows = max(1, _MAX_MATRIX_ELEMENTS // n)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):  # chunks of rows; one chunk for typical sizes
        stop = min(n_resamples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = np.median(a[idx], axis=1)
    return out


def _ends(v: np.ndarray, confidence: float) -> tuple[float, float]:
    """The two-sided percentile interval ``(lo, hi)`` of bootstrap statistics ``v``."""
    alpha = 1.0 - confidence
    lo, hi = np.quantile(v, [alpha / 2.0, 1.0 - alpha / 2.0])
    return (float(lo), float(hi))


def bootstrap_median_ci(
    x: Any, confidence: float = 0.95, n_resamples: int = 2000, seed: int | None = 0
) -> tuple[float, float]:
    """Percentile-bootstrap two-sided interval ``(lo, hi)`` of the median, in the unit of ``x``
    (the same seed and sample give the same interval). A single value gives ``(v, v)`` (no
    spread can be estimated from one sample); an empty sample gives ``(nan, nan)``. Raises
    ValueError: confidence outside (0, 1) or n_resamples < 1."""
    _check(confidence, n_resamples)
    a = _clean(x)
    if a.size == 0:
        return (math.nan, math.nan)
    return _ends(_bootstrap_medians(a, n_resamples, np.random.default_rng(seed)), confidence)


def bootstrap_ratio_ci(
    a: Any, b: Any, confidence: float = 0.95, n_resamples: int = 2000, seed: int | None = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of ``median(a) / median(b)``, ``a`` and ``b``
    resampled independently from one seeded Generator. A side with one value (a session's cold
    request) is held fixed, so the interval reflects the other side's spread alone; one value on
    both sides gives ``(r, r)``. Returns ``(lo, hi)``, unitless; ``(nan, nan)`` when either side
    is empty. Resamples whose denominator median is 0 give ±inf/NaN ratios; NaN ones are ignored."""
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
    """Percentile-bootstrap interval of ``mean(a) / mean(b)`` (``scipy.stats.bootstrap``, the two
    samples resampled independently, 9,999 resamples, seeded): ``(lo, hi)`` unitless; ``(nan,
    nan)`` when a side has fewer than 2 values or both are constant (no spread to resample). NaN
    ratios of degenerate resamples are left out."""
    from scipy.stats import bootstrap

    xa, xb = _clean(a), _clean(b)
    if xa.size < 2 or xb.size < 2 or xa.std() + xb.std() == 0:
        return (math.nan, math.nan)
    with warnings.catch_warnings():  # a degenerate resample: its NaN is dropped
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
    """One-sided lower confidence bound (``confidence`` 0.95: the 5th percentile) of
    ``median(sample) / reference``, ``reference`` one measurement with no spread of its own (the
    cold request): a percentile bootstrap whose reference draws ``reference * x_j / median(sample)``
    get the sample's relative spread, so a noisy reference cannot fail an identical build. The
    bound is unitless; NaN for an empty sample or a reference that is not a positive finite
    number; with one sample value, that value / reference."""
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
    """Mann-Whitney U rank test of ``a`` against ``b`` ("a slower": ``a``'s values tend to be
    larger; ``scipy.stats.mannwhitneyu``); with fewer than :data:`MIN_RANK_TEST_SAMPLES` values a
    side, no p-value but a separation rule (docs/suite.md, "Investigations that are off by
    default"). ``alternative`` ``"greater"`` reports only ``"a slower"``, ``"less"`` only ``"b
    slower"``; an empty side gives ``"inconclusive"``. Returns a dict with ``statistic`` (U of
    ``a``, or None), ``pvalue`` (or None), ``method``, ``n_a``, ``n_b``, ``note`` (the reason in
    words), ``decision`` (``"a slower"``, ``"b slower"``, ``"no difference"`` or
    ``"inconclusive"``), ``a_slower`` (bool), ``median_a``, ``median_b`` (input unit) and
    ``alternative``. Raises ValueError: ``alternative`` is not two-sided, greater or less."""
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
        from scipy import stats as _sst  # 0.6 s to import: only when a rank test runs

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
    """Least-squares slope of ``y`` against its index ``0..n-1``, in units of ``y`` per index
    step (e.g. host RSS MiB per request: a leak shows as a positive slope); NaN with fewer than
    2 finite points. Non-finite values are dropped *with* their index (the x positions of the
    remaining points are kept)."""
    arr = np.asarray(y, dtype=float).ravel()
    x = np.arange(arr.size, dtype=float)
    keep = np.isfinite(arr)
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(x[keep], arr[keep], 1)[0])


def slope_lower_bound(y: Any, confidence: float = 0.95) -> float:
    """One-sided lower confidence bound of :func:`slope_per_index`'s slope: the least-squares
    slope minus Student's t (``n - 2`` degrees of freedom, ``scipy.stats.t``) times its standard
    error (``scipy.stats.linregress``). A scatter around a flat line keeps it at or below 0; a
    steady rise lifts it above 0. The bound is in units of ``y`` per index step (0 for a
    constant series); NaN with fewer than 3 finite points (no spread to estimate). Non-finite
    values are dropped with their index; ``confidence`` is one-sided."""
    from scipy.stats import linregress, t

    arr = np.asarray(y, dtype=float).ravel()
    keep = np.isfinite(arr)
    if keep.sum() < 3:
        return math.nan
    x, y = np.arange(arr.size, dtype=float)[keep], arr[keep]
    if np.ptp(y) == 0:  # a constant series: slope 0, no spread (linregress's stderr is NaN)
        return 0.0
    fit = linregress(x, y)
    return float(fit.slope - t.ppf(confidence, y.size - 2) * fit.stderr)


def relative_drift(first: float, last: float) -> float:
    """Relative change from ``first`` to ``last``: ``last / first - 1`` (unitless; 0.25: 25 %
    above). NaN when ``first`` is 0 or either value is not finite."""
    f, l_ = float(first), float(last)
    if not (math.isfinite(f) and math.isfinite(l_)) or f == 0.0:
        return math.nan
    return l_ / f - 1.0


def quantile_bounded_from(q: float, confidence: float = 0.95) -> int:
    """Fewest samples whose order statistics bound the ``q`` quantile from above at
    ``confidence`` (:func:`quantile_ci`: q^n <= (1 - confidence) / 2; p99 at 95 %: 368)."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(q))


def quantile_ci(x: Any, q: float, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval of the ``q`` quantile from order statistics (the binomial
    method: ranks l < u with P(l <= B < u) >= ``confidence`` for B ~ Binomial(n, q), as
    narrow as possible around n·q): (low, high) in the units of ``x``; an end the samples
    cannot bound is NaN (p99 of 8 requests has no upper bound: (low, NaN), never the maximum).
    Raises ValueError: ``q`` or ``confidence`` outside (0, 1)."""
    from scipy.stats import binom

    if not (0 < q < 1 and 0 < confidence < 1):
        raise ValueError(f"q and confidence must lie in (0, 1), got q={q}, confidence={confidence}")
    a = np.sort(_clean(x))
    n = a.size
    if n == 0:
        return math.nan, math.nan
    alpha = 1 - confidence
    # largest l with P(B < l) <= alpha/2, smallest u with P(B >= u) <= alpha/2 (1-based ranks)
    lo_rank = int(binom.ppf(alpha / 2, n, q))  # P(B <= lo_rank) >= alpha/2
    if binom.cdf(lo_rank, n, q) > alpha / 2:
        lo_rank -= 1
    hi_rank = int(binom.ppf(1 - alpha / 2, n, q)) + 1
    lo = float(a[lo_rank]) if lo_rank >= 0 else math.nan  # rank lo_rank+1 is a[lo_rank]
    hi = float(a[hi_rank - 1]) if hi_rank <= n else math.nan
    return lo, hi


#: Default decision threshold (fraction; :func:`decide`), the smallest change the 2-core CPU
#: runner resolves at 4 launches a side (docs/ab.md).
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
    """Welch t interval of the ratio B/A from one value per launch and side (a launch median, or its
    single value such as its ready time; any positive unit; non-finite and non-positive values
    dropped): a :class:`RatioInterval`, ``ratio`` of the geometric means, [low, high] ``exp(d ±
    t_{df, (1+c)/2} · se)``, d the difference of mean logs, ``se = sqrt(s_a²/n_a + s_b²/n_b)``,
    Welch–Satterthwaite df; both sides constant (se = 0): the ratio itself; fewer than 2 launches
    on a side: NaN ends. Raises ValueError: confidence outside (0, 1)."""
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
    measured; var with ddof 1), each (S, K): what :func:`combine` needs of a side (a row's
    numbers depend on that row alone: ``perfkit.ab.power`` reduces a side once, then indexes)."""
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

"""perfkit's statistics, one surface: medians, bootstrap intervals, rank tests, slopes and
order-statistic quantile intervals of one series (here), and the launch-level Welch t ratio
intervals, decisions and sizing (:mod:`perfkit.stats.launches`, re-exported).

Results are in the input unit (ms, MiB) unless said (ratios, drifts: unitless). Inputs are
array-likes; non-finite values are dropped first. Bootstraps are seeded and vectorised. scipy is
imported inside the functions that need it (the CLI starts without it)."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from perfkit.stats.launches import *  # noqa: F403 (the surface: its public names)
from perfkit.stats.launches import _check

#: Fewest samples per side for which :func:`mann_whitney` runs the rank test.
MIN_RANK_TEST_SAMPLES = 5

# Cap on the number of elements of one resample matrix (rows are processed in chunks above it,
# each chunk still vectorised), so a long memory series does not allocate gigabytes.
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
    import warnings

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
    allow_a = alternative in ("two-sided", "greater")
    allow_b = alternative in ("two-sided", "less")
    out["decision"] = (
        "a slower" if allow_a and a_wins else "b slower" if allow_b and b_wins else "no difference"
    )
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

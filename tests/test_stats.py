"""Tests for perfkit.stats with real values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfkit import stats


def test_median_iqr_known_values():
    med, q1, q3 = stats.median_iqr([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (med, q1, q3) == (5.0, 3.0, 7.0)


def test_median_iqr_drops_nan_and_empty():
    assert stats.median_iqr([10.0, np.nan, 30.0])[0] == 20.0
    assert all(math.isnan(v) for v in stats.median_iqr([]))


WARM_MS = [312.0, 305.5, 298.7, 320.1, 310.4, 301.9, 315.2, 308.8]


def test_bootstrap_median_ci_contains_median_and_is_deterministic():
    lo, hi = stats.bootstrap_median_ci(WARM_MS, seed=7)
    med = float(np.median(WARM_MS))
    assert lo <= med <= hi
    assert min(WARM_MS) <= lo < hi <= max(WARM_MS)
    assert stats.bootstrap_median_ci(WARM_MS, seed=7) == (lo, hi)
    # a different seed gives a (generally) different but still valid interval
    lo2, hi2 = stats.bootstrap_median_ci(WARM_MS, seed=8)
    assert lo2 <= med <= hi2


def test_bootstrap_median_ci_narrower_at_lower_confidence():
    lo95, hi95 = stats.bootstrap_median_ci(WARM_MS, confidence=0.95)
    lo50, hi50 = stats.bootstrap_median_ci(WARM_MS, confidence=0.50)
    assert hi50 - lo50 <= hi95 - lo95


def test_bootstrap_median_ci_edge_cases():
    assert stats.bootstrap_median_ci([42.0]) == (42.0, 42.0)
    assert all(math.isnan(v) for v in stats.bootstrap_median_ci([np.nan]))
    with pytest.raises(ValueError):
        stats.bootstrap_median_ci(WARM_MS, confidence=1.5)


def test_bootstrap_median_ci_long_series_chunked():
    rng = np.random.default_rng(0)
    x = rng.normal(1000.0, 10.0, size=5000)  # 2000 x 5000 > chunk cap: exercised in chunks
    lo, hi = stats.bootstrap_median_ci(x, n_resamples=1000)
    assert lo < np.median(x) < hi
    assert hi - lo < 2.0


def test_bootstrap_ratio_ci_separated_samples_above_one():
    slow = [480.0, 495.0, 510.0, 470.0, 505.0]
    fast = [300.0, 310.0, 295.0, 305.0, 315.0]
    lo, hi = stats.bootstrap_ratio_ci(slow, fast, seed=1)
    assert 1.0 < lo <= hi
    assert lo <= np.median(slow) / np.median(fast) <= hi
    assert stats.bootstrap_ratio_ci(slow, fast, seed=1) == (lo, hi)


def test_bootstrap_ratio_ci_single_cold_sample():
    cold = [1900.0]
    lo, hi = stats.bootstrap_ratio_ci(cold, WARM_MS)
    # cold fixed: the interval is 1900 / (warm median CI), from resampling the warm side only
    wlo, whi = stats.bootstrap_median_ci(WARM_MS)
    assert lo < 1900.0 / np.median(WARM_MS) < hi
    assert lo == pytest.approx(1900.0 / whi, rel=0.02)
    assert hi == pytest.approx(1900.0 / wlo, rel=0.02)
    # both single: degenerate interval
    assert stats.bootstrap_ratio_ci([10.0], [5.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in stats.bootstrap_ratio_ci([], WARM_MS))


def test_mann_whitney_5_vs_5_separated():
    a = [410.0, 420.0, 415.0, 430.0, 425.0]
    b = [300.0, 305.0, 310.0, 298.0, 302.0]
    res = stats.mann_whitney(a, b)
    assert res["method"] == "mannwhitneyu"
    assert res["pvalue"] < 0.05
    assert res["statistic"] == 25.0
    assert (res["n_a"], res["n_b"]) == (5, 5)
    assert res["decision"] == "a slower" and res["a_slower"] is True
    one_sided = stats.mann_whitney(a, b, alternative="greater")
    assert one_sided["pvalue"] < res["pvalue"]
    assert stats.mann_whitney(b, a)["decision"] == "b slower"


def test_mann_whitney_overlapping_no_difference():
    a = [300.0, 310.0, 305.0, 299.0, 308.0, 302.0]
    b = [301.0, 309.0, 304.0, 300.0, 307.0, 303.0]
    res = stats.mann_whitney(a, b)
    assert res["pvalue"] > 0.05
    assert res["decision"] == "no difference" and not res["a_slower"]


def test_mann_whitney_small_sample_rule():
    warm = [300.0, 310.0, 305.0, 298.0]
    # single cold request, clearly separated and > 10 % slower
    res = stats.mann_whitney([1900.0], warm)
    assert res["method"] == "insufficient-samples"
    assert res["pvalue"] is None and res["statistic"] is None
    assert res["decision"] == "a slower" and res["a_slower"]
    assert "separation" in res["note"]
    # separated but only ~3 % slower: below the 10 % threshold
    res = stats.mann_whitney([320.0], warm)
    assert res["decision"] == "no difference" and not res["a_slower"]
    # ... passes with a smaller threshold
    assert stats.mann_whitney([320.0], warm, rel_threshold=0.02)["a_slower"]
    # much slower median but overlapping (no complete separation)
    res = stats.mann_whitney([290.0, 900.0, 950.0], warm)
    assert res["decision"] == "no difference"
    # alternative="less" cannot report "a slower"
    assert stats.mann_whitney([1900.0], warm, alternative="less")["decision"] == "no difference"
    assert stats.mann_whitney([], warm)["decision"] == "inconclusive"


def test_slope_per_index():
    assert stats.slope_per_index([0, 64, 128, 192]) == pytest.approx(64.0)
    assert stats.slope_per_index([5.0, 5.0, 5.0]) == pytest.approx(0.0)
    assert math.isnan(stats.slope_per_index([1.0]))
    assert math.isnan(stats.slope_per_index([]))
    # NaN dropped with its index kept
    assert stats.slope_per_index([0.0, np.nan, 20.0, 30.0]) == pytest.approx(10.0)


def test_relative_drift():
    assert stats.relative_drift(100.0, 125.0) == pytest.approx(0.25)
    assert stats.relative_drift(200.0, 150.0) == pytest.approx(-0.25)
    assert math.isnan(stats.relative_drift(0.0, 1.0))
    assert math.isnan(stats.relative_drift(float("nan"), 1.0))

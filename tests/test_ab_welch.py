"""The A/B statistics over many comparisons at once (`perfkit.stats`: Welch moments, interval
ends, t quantiles interpolated past SPLINE_MIN) against a frozen copy of the former per-draw
computation and against `ratio_interval`, one comparison at a time; and the slow launches' quiet
level against numpy's quantile. Floats are compared within a stated relative tolerance (RTOL), never bit for bit: numpy's
summation order follows the CPU's SIMD width."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import stdtrit

from perfkit import stats
from perfkit.ab import power
from perfkit.ab.decide import QUIET_QUANTILE, SLOW_FACTOR, slow_launches

POOL = Path(__file__).resolve().parents[1] / "examples/h200/ab-pool/sync-den2"
_log = st.floats(-3.0, 3.0, allow_nan=False)
#: relative tolerance of a recomputed float against another computation of it (a few ulps of
#: summation order, and the spline's 1e-9 on t quantiles)
RTOL = 1e-9


def _reference(xa: np.ndarray, xb: np.ndarray, confidence: float) -> tuple[np.ndarray, ...]:
    """``perfkit.stats.welch_log_intervals`` as it was before the fast paths (63e8193), verbatim."""
    from scipy.special import stdtrit

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        na, nb = np.isfinite(xa).sum(1), np.isfinite(xb).sum(1)
        va = np.nanvar(xa, axis=1, ddof=1) / na
        vb = np.nanvar(xb, axis=1, ddof=1) / nb
        d = np.nanmean(xb, axis=1) - np.nanmean(xa, axis=1)
        se = np.sqrt(va + vb)
        den = np.where(va > 0, va**2 / (na - 1), 0.0) + np.where(vb > 0, vb**2 / (nb - 1), 0.0)
        df = np.where(den > 0, (va + vb) ** 2 / np.where(den > 0, den, 1.0), np.inf)
        half = np.where(se > 0, stdtrit(df, 0.5 + confidence / 2.0) * se, 0.0)
        low, high = d - half, d + half
    bad = (na < 2) | (nb < 2) | ~np.isfinite(d)
    low[bad] = np.nan
    high[bad] = np.nan
    return d, se, df, low, high


def _close(got, want, rtol=RTOL, atol=1e-12):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def _same(xa: np.ndarray, xb: np.ndarray, conf: float) -> None:
    want = _reference(xa, xb, conf)
    got = stats.welch_log_intervals(xa, xb, conf)
    for g, w in zip(got[:3], want[:3]):  # d, se, df
        _close(g, w)
    for g, w in zip(got[3:], want[3:]):  # the ends (log units): 1e-9 absolute where they cross 0
        _close(g, w, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 6),
    k=st.integers(1, 3),
    conf=st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999]),
)
def test_intervals_of_many_draws_are_the_per_draw_formula(data, n, k, conf):
    s = data.draw(st.integers(1, 20))
    vals = st.one_of(_log, st.just(float("nan")), st.just(0.0), st.just(0.01))
    xa = np.array(data.draw(st.lists(vals, min_size=s * n * k, max_size=s * n * k))).reshape(s, n, k)
    xb = np.array(data.draw(st.lists(vals, min_size=s * n * k, max_size=s * n * k))).reshape(s, n, k)
    _same(xa, xb, conf)


@pytest.mark.parametrize("conf", [0.95, 0.99])
def test_intervals_of_20000_draws_through_the_spline(conf):
    rng = np.random.default_rng(7)
    xa = rng.normal(0.0, 0.03, (20000, 4, 3))
    xb = rng.normal(0.02, 0.03, (20000, 4, 3)) * rng.choice([1.0, 0.1, 5.0], (20000, 1, 3))
    xa[::97, 0, 1] = np.nan  # a side with fewer values; some with fewer than 2
    xa[::89, :3, 2] = np.nan
    assert np.isfinite(xa).all(axis=1).sum() > stats.SPLINE_MIN  # the interpolated path
    _same(xa, xb, conf)


@pytest.mark.parametrize("lo, hi", [(1.0, 6.0), (1.0, 400.0), (2.5, 2.6), (1.0, 1e6)])
def test_t_quantiles_past_spline_min_within_1e9_of_stdtrit(lo, hi):
    df = np.geomspace(lo, hi, 3 * stats.SPLINE_MIN)
    df[::1000] = np.nan
    df[1::1000] = np.inf
    df[2::1000] = -1.0
    for q in (0.75, 0.975, 0.995, 0.9995):
        _close(stats.t_quantiles(df, q), stdtrit(df, q), rtol=1e-9, atol=0)


def test_log_ends_refuse_a_confidence_outside_0_1():
    z = np.zeros((1, 1))
    with pytest.raises(ValueError, match="confidence must be in"):
        stats.log_ends(z, z + 1, z + 3, z.astype(bool), 1.0)


@settings(max_examples=150, deadline=None)
@given(
    la=st.lists(st.floats(-8.0, 12.0, allow_nan=False), min_size=2, max_size=20),
    lb=st.lists(st.floats(-8.0, 12.0, allow_nan=False), min_size=2, max_size=20),
    conf=st.sampled_from([0.5, 0.95, 0.99, 0.9983]),
)
def test_one_comparison_is_the_many_draws_formula(la, lb, conf):
    # the logs ratio_interval sees (exp(1e-72) is 1.0: a side that differs below that is constant)
    a, b = np.log(np.exp(la)), np.log(np.exp(lb))
    many = stats.welch_log_intervals(a[None, :, None], b[None, :, None], conf)
    _, se, df, low, high = (float(v[0, 0]) for v in many)
    iv = stats.ratio_interval(np.exp(a), np.exp(b), conf)
    if se == 0.0:
        # no spread: the interval is the ratio itself (to 1e-12 relative: exp(mean(log)) rounds)
        assert iv.se_log == 0.0
        _close([iv.low, iv.high], [iv.ratio] * 2, rtol=1e-12, atol=0)
        return
    _close([iv.se_log, iv.df, iv.sd_log_a, iv.sd_log_b], [se, df, a.std(ddof=1), b.std(ddof=1)])
    if high < 700:  # exp(high) is a float (past ~709 both are inf)
        _close([np.log(iv.low), np.log(iv.high)], [low, high], atol=1e-9)


def test_slow_launches_marks_as_np_quantile_says():
    """The quiet level (the stdlib's quantiles) is numpy's: sides of 0 to 40 requests, one with a NaN."""
    rng = np.random.default_rng(4)
    for t in range(300):
        req = {f"L{i}": rng.lognormal(6.0, rng.choice([0.01, 0.05]), rng.integers(0, 6)) for i in range(8)}
        if t == 7:
            req["L0"] = np.array([1.0, np.nan, 500.0])
        every = np.concatenate([v for v in req.values() if v.size] or [np.empty(0)])
        quiet = float(np.quantile(every, QUIET_QUANTILE)) if every.size else 0.0
        want = [k for k, v in req.items() if v.size and float(np.mean(v > SLOW_FACTOR * quiet)) >= 0.5]
        assert slow_launches(req) == want


@pytest.mark.parametrize("n, max_exact", [(2, power.MAX_EXACT), (3, 100)])
def test_power_moments_by_launch_group_are_the_per_draw_moments(monkeypatch, n, max_exact):
    monkeypatch.setattr(power, "MAX_EXACT", max_exact)  # 100: random draws, not every way
    pool = power.load_pool(POOL)
    la, lb = (power.log_medians(pool.values[s], 5).to_numpy() for s in ("A", "B"))
    rng = np.random.default_rng(2)
    for ways, xb in (
        (power._aa_ways(rng, len(la), n, 300), la),
        (power._ab_ways(rng, len(la), len(lb), n, 300), lb),
    ):
        ga, pa, gb, pb, exact = ways
        assert exact == (max_exact > 1000)
        x = np.concatenate([la[ga[pa]], xb[gb[pb]]], axis=1)  # the draws as the table built them before
        got = power._moments(la, xb, ways)[0]
        want = _reference(x[:, :n], x[:, n:], 0.95)[:3]
        for g, w in zip(got, want):
            _close(g, w)

"""The A/B power and replay fast paths give the very numbers of the code they replaced: the power
table's decisions without a t quantile a draw (`perfkit.ab.welch.low_above`) and its moments
reduced once per launch group, one comparison in plain floats (`stats._welch_one`) and the slow
launches' quiet level, each against a frozen copy of the former computation."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfkit.ab import power
from perfkit.ab.slow import QUIET_QUANTILE, SLOW_FACTOR, _quantile_linear, slow_launches
from perfkit.ab.stats import _np_sum, _welch_one
from perfkit.ab.welch import low_above, welch_log_intervals, welch_moments

POOL = Path(__file__).resolve().parents[1] / "examples/h200/ab-pool/sync-den2"
_log = st.floats(-3.0, 3.0, allow_nan=False)


def _reference(xa: np.ndarray, xb: np.ndarray, confidence: float) -> tuple[np.ndarray, ...]:
    """``perfkit.ab.stats.welch_log_intervals`` as it was before the fast paths (63e8193), verbatim."""
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


def _same(xa: np.ndarray, xb: np.ndarray, conf: float, c: float) -> None:
    _, _, _, low, high = _reference(xa, xb, conf)
    d, se, df, bad = welch_moments(xa, xb)
    for got, want in zip(welch_log_intervals(xa, xb, conf), _reference(xa, xb, conf)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(low_above(d, se, df, bad, conf, c), low > c)
    np.testing.assert_array_equal(low_above(-d, se, df, bad, conf, -c), high < c)
    np.testing.assert_array_equal(~bad, np.isfinite(low))  # what the power rates count as drawn


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 6),
    k=st.integers(1, 3),
    conf=st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999]),
    c=st.sampled_from([0.0, 0.01, 0.05, -0.02]),
)
def test_low_above_is_the_quantile_path(data, n, k, conf, c):
    s = data.draw(st.integers(1, 20))
    vals = st.one_of(_log, st.just(float("nan")), st.just(0.0), st.just(0.01))
    xa = np.array(data.draw(st.lists(vals, min_size=s * n * k, max_size=s * n * k))).reshape(s, n, k)
    xb = np.array(data.draw(st.lists(vals, min_size=s * n * k, max_size=s * n * k))).reshape(s, n, k)
    _same(xa, xb, conf, c)


@pytest.mark.parametrize("conf", [0.95, 0.99])
def test_low_above_on_many_draws_and_at_the_edge(conf):
    rng = np.random.default_rng(7)
    xa = rng.normal(0.0, 0.03, (20000, 4, 3))
    xb = rng.normal(0.02, 0.03, (20000, 4, 3)) * rng.choice([1.0, 0.1, 5.0], (20000, 1, 3))
    xa[::97, 0, 1] = np.nan  # a side with fewer values; some with fewer than 2
    xa[::89, :3, 2] = np.nan
    _same(xa, xb, conf, 0.01)
    # c set to draws' own low ends: the comparison at exactly the end (False) and just below it
    low = _reference(xa, xb, conf)[3]
    d, se, df, bad = welch_moments(xa, xb)
    for j in range(0, 20000, 1999):
        c = float(low[j, 0])
        if np.isfinite(c):
            got = low_above(d[j : j + 1], se[j : j + 1], df[j : j + 1], bad[j : j + 1], conf, c)
            assert not got[0, 0]
            below = np.nextafter(c, -np.inf)
            got = low_above(d[j : j + 1], se[j : j + 1], df[j : j + 1], bad[j : j + 1], conf, below)
            assert got[0, 0]


def test_low_above_refuses_a_confidence_outside_0_1():
    z = np.zeros((1, 1))
    with pytest.raises(ValueError, match="confidence must be in"):
        low_above(z, z + 1, z + 3, z.astype(bool), 1.0, 0.0)


@settings(max_examples=150, deadline=None)
@given(
    la=st.lists(st.floats(-8.0, 12.0, allow_nan=False), min_size=2, max_size=20),
    lb=st.lists(st.floats(-8.0, 12.0, allow_nan=False), min_size=2, max_size=20),
    conf=st.sampled_from([0.5, 0.95, 0.99, 0.9983]),
)
def test_one_comparison_in_plain_floats_is_the_numpy_path(la, lb, conf):
    a, b = np.array(la), np.array(lb)
    _, se, df, low, high = (
        float(v[0, 0]) for v in welch_log_intervals(a[None, :, None], b[None, :, None], conf)
    )
    want = (float(a.std(ddof=1)), float(b.std(ddof=1)), se, df, low, high)
    assert _welch_one(la, lb, conf) == want


def test_one_comparison_on_many_random_launch_sets():
    rng = np.random.default_rng(3)
    for _ in range(3000):
        na, nb = rng.integers(2, 13, 2)
        a = rng.normal(rng.normal(5, 2), rng.choice([1e-9, 0.02, 1.0]), na)
        b = rng.normal(rng.normal(5, 2), rng.choice([1e-9, 0.02, 1.0]), nb)
        conf = float(rng.choice([0.95, 0.99, 0.9983]))
        got = _welch_one(a.tolist(), b.tolist(), conf)
        _, se, df, low, high = (
            float(v[0, 0]) for v in welch_log_intervals(a[None, :, None], b[None, :, None], conf)
        )
        assert got == (float(a.std(ddof=1)), float(b.std(ddof=1)), se, df, low, high)
        assert _np_sum(a.tolist()) == float(np.add.reduce(a))


@settings(max_examples=150, deadline=None)
@given(
    xs=st.lists(st.floats(0.0, 1e5, allow_nan=False), min_size=1, max_size=60),
    q=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]),
)
def test_quiet_level_in_plain_floats_is_np_quantile(xs, q):
    assert _quantile_linear(sorted(xs), q) == float(np.quantile(np.array(xs), q))


def test_slow_launches_marks_as_before():
    rng = np.random.default_rng(4)
    for _ in range(300):
        req = {f"L{i}": rng.lognormal(6.0, rng.choice([0.01, 0.05]), rng.integers(0, 6)) for i in range(8)}
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
        got = power._moments(la, xb, ways)
        want = _reference(x[:, :n], x[:, n:], 0.95)[:3]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

"""``perfkit ab --paired`` without an engine: the paired t interval (against scipy's), the
turnstile that makes two launches take turns, the sequential procedure's false alarms and
power on a host whose speed drifts between launches (seeded simulation), and the options."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from scipy import stats as sps

from perfkit import stats
from perfkit.ab.ab_command import AbInputError, design_for
from perfkit.ab.driver import Alternation, run_pair
from perfkit.ab.sequential import Design, Walker


def test_paired_interval_is_scipys_paired_t_interval_on_logs():
    rng = np.random.default_rng(3)
    state = rng.uniform(1.0, 2.5, 6)  # the host's speed, shared by a pair
    a = 70.0 * state * rng.lognormal(0, 0.03, 6)
    b = 91.0 * state * rng.lognormal(0, 0.03, 6)
    iv = stats.paired_ratio_interval(a, b, 0.95)
    ref = sps.ttest_rel(np.log(b), np.log(a)).confidence_interval(0.95)
    assert (iv.n_a, iv.n_b, iv.df) == (6, 6, 5.0)
    assert iv.low == pytest.approx(np.exp(ref.low)) and iv.high == pytest.approx(np.exp(ref.high))
    assert iv.ratio == pytest.approx(np.exp(np.mean(np.log(b / a))))
    # the shared state cancels: the paired interval is far narrower than Welch's on the same values
    welch = stats.ratio_interval(a, b, 0.95)
    assert 1.2 < iv.low < iv.high < 1.4 and welch.high - welch.low > 5 * (iv.high - iv.low)


def test_paired_interval_edge_cases():
    assert np.isnan(stats.paired_ratio_interval([], []).ratio)
    one = stats.paired_ratio_interval([10.0], [12.0])
    assert one.ratio == pytest.approx(1.2) and np.isnan(one.low) and one.n_a == 1
    # a pair with a missing (NaN) or zero value is dropped whole, not half
    iv = stats.paired_ratio_interval([10.0, np.nan, 10.0, 0.0], [11.0, 50.0, 11.0, 30.0])
    assert iv.n_a == iv.n_b == 2 and iv.low == iv.high == pytest.approx(1.1)
    with pytest.raises(ValueError, match="one B per A: 2 A values, 3 B values"):
        stats.paired_ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="confidence"):
        stats.paired_ratio_interval([1.0, 2.0], [1.0, 2.0], 1.0)


def test_alternation_takes_turns_and_a_side_that_ends_frees_the_other():
    def measure(side: str, turn) -> int:
        n = 3 if side == "A" else 6  # A ends early: B runs on alone
        for i in range(n):
            with turn(i):
                time.sleep(0.002 if side == "A" else 0.0)  # B would race ahead without the turns
        return n

    got, ran = run_pair("B", "A", measure)
    assert got == {"A": 3, "B": 6}
    assert ran == [("B", 0), ("A", 0), ("B", 1), ("A", 1), ("B", 2), ("A", 2), ("B", 3), ("B", 4), ("B", 5)]


def test_a_side_that_raises_ends_the_pair_and_the_error_reaches_the_caller():
    def measure(side: str, turn) -> None:
        with turn(0):
            pass
        if side == "B":
            raise RuntimeError("B's launch broke")
        for i in range(1, 4):
            with turn(i):
                pass

    with pytest.raises(RuntimeError, match="B's launch broke"):
        run_pair("A", "B", measure)
    alt = Alternation("A", "B")
    with pytest.raises(KeyError):
        with alt.turn("C", 0):
            pass
    assert threading.active_count() >= 1


def _drifting_host(rng: np.random.Generator, pairs: int, effect: float) -> tuple[dict, dict]:
    """Launch medians (log) of a paired A/B on a host with two speeds: each pair runs in one
    state (x1 or x1.9, as the 2-core CI VM), shared by its A and its B; 3 % noise apart from it."""
    logmed: dict[str, dict[str, np.ndarray]] = {"A": {}, "B": {}}
    for i in range(pairs):
        state = np.log(1.9) * rng.integers(0, 2) + rng.normal(0, 0.1)
        for side, eff in (("A", 0.0), ("B", effect)):
            logmed[side][f"{side}{i:02d}"] = np.array([np.log(70.0) + state + eff + rng.normal(0, 0.03)])
    return logmed, {"A": {}, "B": {}}


def _order(pairs: int) -> list[tuple[str, str]]:
    sides = [("A", "B"), ("B", "A")]
    return [(s, f"{s}{i:02d}") for i in range(pairs) for s in sides[i % 2]]


def test_paired_procedure_on_a_drifting_host_decides_30_percent_and_keeps_aa_false_alarms_low():
    design = Design(min_launches=2, max_launches=5, slow_rule="keep", paired=True)
    unpaired = Design(min_launches=2, max_launches=5, slow_rule="keep")
    rng = np.random.default_rng(39)
    runs = 400
    stops = {"aa": [], "ab": [], "ab_unpaired": []}
    for _ in range(runs):
        for key, eff, d in (
            ("aa", 0.0, design),
            ("ab", np.log(1.3), design),
            ("ab_unpaired", np.log(1.3), unpaired),
        ):
            logmed, slow = _drifting_host(rng, 5, eff)
            w = Walker(logmed, slow, ["DenoisingStage"], [0.05], d).feed(_order(5))
            stops[key].append((w.stop, w.final.n if w.final else None))
    aa_regressions = sum(s == "regression" for s, _ in stops["aa"]) / runs
    ab_decided = [n for s, n in stops["ab"] if s == "regression"]
    unpaired_decided = sum(s == "regression" for s, _ in stops["ab_unpaired"]) / runs
    assert aa_regressions <= 0.025  # alpha spending's bound, one-sided
    assert len(ab_decided) / runs >= 0.95 and np.median(ab_decided) <= 3
    assert unpaired_decided < 0.5  # what pairing buys on such a host


def test_paired_options():
    d = design_for(2, 5, None, None, None, paired=True)
    assert d.paired and d.slow_rule == "keep"
    assert not design_for(2, 5, None, None, None).paired
    with pytest.raises(AbInputError, match="keeps every launch.*leave --slow-spells out") as e:
        design_for(2, 5, None, None, "replace", paired=True)
    assert e.value.option == "--paired"
    with pytest.raises(ValueError, match="slow_rule must be 'keep' when paired"):
        Design(paired=True)
    assert Design.from_dict(Design(slow_rule="keep", paired=True).to_dict()).paired


def test_the_library_replays_a_paired_recording_paired(tmp_path):
    """perfkit.run_ab(replay=True) reads the recorded pairing, as `perfkit ab --replay` does."""
    import json
    import shutil
    from pathlib import Path

    import perfkit

    src = Path(__file__).resolve().parents[1] / "examples/h200/ab-live/ab-2pct"
    for side in "ab":
        shutil.copytree(src / side, tmp_path / side)
        meta = json.loads((tmp_path / side / "meta.json").read_text())
        meta["ab"]["sequential"].update(paired=True, slow_rule="keep")
        (tmp_path / side / "meta.json").write_text(json.dumps(meta))
    paired = perfkit.run_ab(tmp_path / "a", tmp_path / "b", replay=True, threshold=0.01)
    design = paired.meta["sequential"]["design"]
    assert (design["paired"], design["slow_rule"]) == (True, "keep")
    unpaired = perfkit.run_ab(src / "a", src / "b", replay=True, threshold=0.01)
    assert unpaired.meta["sequential"]["design"]["paired"] is False

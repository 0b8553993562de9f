"""The sequential `perfkit ab` (`perfkit.ab.sequential`): alpha spending over the looks, the
walk over launches (interleaving, slow-spell replacement, the maximum), its false-alarm rate
under repeated looks (synthetic, seeded), and its replay on the recorded H200 pools (issue 39's
targets)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfkit import stats
from perfkit.ab import power
from perfkit.ab import sequential as sq

ROOT = Path(__file__).resolve().parents[1]
QUIET = ROOT / "examples/h200/ab-pool/h200-dec01"
NOISY = ROOT / "examples/h200/ab-pool/h200-1gpu"


@pytest.mark.parametrize("spending", sq.SPENDINGS)
def test_the_looks_spend_exactly_alpha(spending):
    d = sq.Design(3, 10, 0.95, spending)
    shares = [1 - d.look_confidence(n) for n in range(3, 11)]
    assert sum(shares) == pytest.approx(0.05) and all(s > 0 for s in shares)
    assert sq.spent_alpha(1.0, 0.05, spending) == pytest.approx(0.05)
    # one look (min == max) is the fixed-N A/B at its nominal confidence
    assert sq.Design(4, 4, 0.95, spending).look_confidence(4) == pytest.approx(0.95)
    # Pocock spends more early than O'Brien-Fleming
    assert sq.spent_alpha(0.3, 0.05, "pocock") > sq.spent_alpha(0.3, 0.05, "obrien-fleming")


def test_bad_designs_are_refused_naming_the_field():
    for kw, word in (
        ({"min_launches": 1}, "min_launches"),
        ({"min_launches": 5, "max_launches": 4}, "max_launches"),
        ({"confidence": 1.0}, "confidence"),
        ({"spending": "bonferroni"}, "spending"),
        ({"slow_rule": "drop"}, "slow_rule"),
    ):
        with pytest.raises(ValueError, match=word):
            sq.Design(**kw)


def _synthetic(rng, n, sd=0.02, shift=0.0, slow_at=()):
    """side -> label -> log median of one metric, and the warm requests (ms) of each launch."""
    logmed, slow = {}, {}
    for side, mu in (("A", 0.0), ("B", shift)):
        x = rng.normal(mu, sd, n)
        logmed[side] = {f"{side}{i:02d}": np.array([v]) for i, v in enumerate(x)}
        slow[side] = {
            f"{side}{i:02d}": np.full(5, 100.0 * (1.2 if f"{side}{i:02d}" in slow_at else 1.0))
            for i in range(n)
        }
    return logmed, slow


def _drive(walker, n):
    w = walker.w
    while w.stop is None:
        side = w.next_arm
        w = walker.add(side, f"{side}{len(w.run[side]):02d}")
    return w


def test_the_walk_interleaves_and_stops_on_a_clear_regression():
    rng = np.random.default_rng(1)
    logmed, slow = _synthetic(rng, 10, sd=0.01, shift=math.log(1.3))
    order = []
    walker = sq.Walker(logmed, slow, ["DenoisingStage"], [0.05], sq.Design(3, 10))
    w = walker.w
    while w.stop is None:
        side = w.next_arm
        order.append(side)
        w = walker.add(side, f"{side}{len(w.run[side]):02d}")
    assert w.stop == "regression" and w.looks[-1].metrics["DenoisingStage"]["decision"] == "regression"
    assert order == stats.interleaved_order(w.looks[-1].n)  # A B B A A B
    assert "decided a regression at 3 launches a side (look 1" in w.reason
    # the same launches replayed in that order give the same walk
    again = sq.Walker(logmed, slow, ["DenoisingStage"], [0.05], sq.Design(3, 10)).feed(
        [(s, f"{s}{order[:i].count(s):02d}") for i, s in enumerate(order)]
    )
    assert again.stop == "regression" and again.used == len(order)


def test_undecided_at_the_maximum_and_a_slow_spell_launch_is_replaced_and_counted():
    rng = np.random.default_rng(2)
    logmed, slow = _synthetic(rng, 10, sd=0.05, slow_at={"A01"})
    w = _drive(sq.Walker(logmed, slow, ["DenoisingStage"], [0.01], sq.Design(2, 4)), 4)
    assert w.stop == "maximum" and w.undecided == ["DenoisingStage"] and w.next_arm is None
    assert w.replaced["A"] == ["A01"] and "A01" not in w.looks[-1].launches["A"]
    assert len(w.run["A"]) == 4  # the replacement counted against the maximum
    assert "maximum reached (4 launches run a side)" in w.reason
    # kept: every launch counts
    w = _drive(sq.Walker(logmed, slow, ["DenoisingStage"], [0.01], sq.Design(2, 4, slow_rule="keep")), 4)
    assert w.replaced == {"A": [], "B": []} and "A01" in w.looks[-1].launches["A"]
    # half or more of a side in a "spell" is the host's state: nothing replaced
    logmed, slow = _synthetic(rng, 10, sd=0.05, slow_at={"A00", "A01"})
    w = _drive(sq.Walker(logmed, slow, ["DenoisingStage"], [0.01], sq.Design(2, 4)), 4)
    assert "A" in w.spell_kept and not w.replaced["A"]


def test_aa_false_alarms_hold_under_repeated_looks():
    """Seeded synthetic A/As (log-normal launch values, CV 2 %): with alpha spending, being looked
    at after every pair up to 10 a side calls a regression (threshold ~0) in at most α/2 = 2.5 %;
    looking at a plain 95 % interval every time does not hold that."""
    rng = np.random.default_rng(0)
    sims, alarms = 600, 0
    xs = {"A": [], "B": []}
    for _ in range(sims):
        logmed, slow = _synthetic(rng, 10)
        w = _drive(sq.Walker(logmed, slow, ["m"], [1e-9], sq.Design(2, 10, slow_rule="keep")), 10)
        alarms += w.stop == "regression"
        for s in "AB":
            xs[s].append([logmed[s][f"{s}{i:02d}"][0] for i in range(10)])
    xa, xb = (np.array(xs[s])[:, :, None] for s in "AB")
    naive = np.zeros(sims, dtype=bool)
    for n in range(2, 11):  # a plain 95 % interval at every look
        naive |= stats.welch_log_intervals(xa[:, :n], xb[:, :n], 0.95)[3][:, 0] > 0
    assert alarms / sims <= 0.025, alarms
    assert naive.mean() > 0.04, naive.mean()  # the reason for the spending


def test_replayed_on_the_recorded_h200_pools_it_meets_issue_39s_targets():
    design = sq.Design(3, 10, 0.95)
    quiet = sq.replay_summary(sq.replay_pool(power.load_pool(QUIET), design, threshold=0.01, sims=200))
    q = quiet.set_index("kind")
    assert q.loc["A/A", "regression"] <= 0.01 and q.loc["A/A", "max_launches"] == 5  # half of 10 A launches
    assert q.loc["B", "caught"] >= 0.95 and q.loc["B", "median_launches"] <= 5
    noisy = sq.replay_summary(sq.replay_pool(power.load_pool(NOISY), design, threshold=0.01, sims=200))
    n = noisy.set_index("kind")
    assert n.loc["A/A", "regression"] <= 0.01
    # the noisy occasion: +2 % is caught within the maximum or the run ends undecided, never exit 0
    assert n.loc["B", "decided"] == 0 and n.loc["B", "regression"] + n.loc["B", "undecided"] == pytest.approx(
        1
    )
    assert n.loc["B", "undecided"] > 0.9
    with pytest.raises(ValueError, match="fewer than the first look's 6"):
        sq.replay_pool(power.load_pool(QUIET), sq.Design(6, 10), sims=1)


def test_a_replay_says_what_it_held_its_real_confidence_and_why_a_gated_metric_stayed_open(tmp_path):
    """Issue 51's A/B page findings on a recorded CPU pool (A 10, B 8 launches; B +30 %
    DenoisingStage), gated on DenoisingStage and warm_e2e: the header says what the bundles hold,
    the confidence is the look's own (never rounded to 100 %), and warm_e2e, left inconclusive
    when DenoisingStage's regression ended the A/B, is said, with the launches it would need."""
    from click.testing import CliRunner

    from perfkit.ab.decide import AbResult
    from perfkit.bundle import ResultBundle
    from perfkit.cli import cli
    from perfkit.common.numfmt import confidence_text

    pool, out = ROOT / "examples/ab/pool-cpu-2", tmp_path / "r"
    args = ["ab", "--replay", str(pool / "a"), str(pool / "b"), "--out", str(out), "-q"]
    res = CliRunner().invoke(cli, [*args, "--gate-metrics", "DenoisingStage,warm_e2e"])
    assert res.exit_code == 1, res.output
    r = AbResult.load(out)
    held = {s: len(ResultBundle.load(pool / s.lower()).launches) for s in "AB"}
    md = (out / "summary.md").read_text()
    assert held == {"A": 10, "B": 8} and md.splitlines()[2].startswith("A: 10, B: 8 launches, 5 warm")
    # the last look's confidence: look 3 (5 a side) of a 3..8 Pocock design, split over 2 metrics
    share = 1 - sq.Design(3, 8).look_confidence(5)
    assert r.confidence == pytest.approx(1 - share / 2, abs=1e-12) and 0.997 < r.confidence < 0.9975
    assert confidence_text(r.confidence) == "99.73 %" and "100 %" not in md
    html = (out / "report.html").read_text()
    assert "with a 99.73 % Welch t interval" in html and "the last look's 99.73 %)" in md
    # DenoisingStage decided first; warm_e2e's decision is explained, with its launches needed
    seq = r.meta["sequential"]
    assert seq["stop"] == "regression" and r.decisions["DenoisingStage"] == "regression"
    assert r.decisions["warm_e2e"] == "inconclusive" and r.exit_code == 1
    assert "warm_e2e left inconclusive: one gated regression ends the A/B" in md
    n = seq["launches_needed"]["warm_e2e"]
    row = r.table.set_index("metric").loc["warm_e2e"]
    assert n == row["launches_needed"] and n >= row["n_a"] == 5
    assert "still inconclusive (with the launches a side that would decide it" in md
    assert f"warm_e2e (B/A {(row['ratio'] - 1) * 100:+.1f} %: about {n} launches a side)" in md
    # the looks table: a row a gated metric, a column a look
    looks = md.split("Looks (")[1]
    assert "| metric | look 1: 3 a side, " in looks and "| DenoisingStage |" in looks

"""Power of `perfkit ab` from a recorded pool (`perfkit.ab.power`, `perfkit figures kind=ab-power`):
the vectorised intervals are `ratio_interval`'s, the rates come out of the committed H200 pool,
bad pools are named errors, and a live three-arm pool of the tiny engine is recorded in one
interleaved order (real engine processes)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from perfkit import stats
from perfkit.ab import power
from perfkit.ab.decide import slow_spells
from perfkit.ab.driver import run_arms
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.params import load_yaml
from perfkit.report.figures import FiguresError, update_text

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples/h200/ab-pool/sync-den2"


def test_interleaved_order_over_several_arms():
    assert stats.interleaved_order({"A": 2, "B": 2, "C": 1}) == ["A", "B", "C", "B", "A"]
    assert stats.interleaved_order({"A": 2, "B": 2}) == stats.interleaved_order(2)
    order = stats.interleaved_order({"A": 10, "B": 10, "C": 8})
    assert [order.count(x) for x in "ABC"] == [10, 10, 8]
    with pytest.raises(ValueError, match="launches per side"):
        stats.interleaved_order({"A": 2, "B": 0})
    with pytest.raises(ValueError, match="launches per side"):
        stats.interleaved_order({})


def test_vectorised_intervals_are_ratio_interval():
    pool = power.load_pool(POOL)
    a = power.log_medians(pool.values["A"], 5)["DenoisingStage"].to_numpy()
    b = power.log_medians(pool.values["B"], 5)["DenoisingStage"].to_numpy()
    rng = np.random.default_rng(1)
    for conf in (0.95, 0.99):
        for n in (2, 3, 5):
            ia, ib = rng.choice(len(a), n, replace=False), rng.choice(len(b), n, replace=False)
            iv = stats.ratio_interval(np.exp(a[ia]), np.exp(b[ib]), conf)
            low, high = stats.welch_log_intervals(a[ia][None, :, None], b[ib][None, :, None], conf)[3:]
            assert math.isclose(math.exp(low[0, 0]), iv.low, rel_tol=1e-12)
            assert math.isclose(math.exp(high[0, 0]), iv.high, rel_tol=1e-12)


def test_rates_from_the_committed_h200_pool():
    pool = power.load_pool(POOL)
    assert pool.arms == {"B": {"DenoisingStage_pct": 2.0, "target": "DenoisingStage"}}
    assert pool.warm == 5 and len(pool.launches("A")) == len(pool.launches("B")) == 10
    var = power.variance_table(pool).set_index("metric")
    # this pool's B overshot (+9.7 %, examples/h200/ab-pool/README.md): the measured change says so
    assert 9.0 < var.loc["DenoisingStage", "B_pct"] < 10.5
    assert 0.015 < var.loc["DenoisingStage", "cv_between"] < 0.03
    t = power.power_table(pool, n=[2, 5, 6], m=[5], settings=[(0.01, 0.95), (0.05, 0.95)], sims=500)
    assert len(t) == 6 and set(t["launches_a"]) == {10}
    row = t[(t["n"] == 5) & (t["threshold"] == 0.01)].iloc[0]
    assert row["detect_DenoisingStage"] == 1.0 and row["aa_alarm_DenoisingStage"] == 0.0
    assert row["aa_covers"] >= 0.95
    # the 5 % default threshold misses much of a +9.7 % change at N = 5; N = 2 misses most at 1 %
    assert t[(t["n"] == 5) & (t["threshold"] == 0.05)].iloc[0]["detect_DenoisingStage"] < 0.9
    assert t[(t["n"] == 2) & (t["threshold"] == 0.01)].iloc[0]["detect_DenoisingStage"] < 0.5
    # A/A needs 2N = 12 distinct A launches: not a rate of 0, no rate
    assert math.isnan(t[t["n"] == 6].iloc[0]["aa_alarm_any"])
    again = power.power_table(pool, n=[2, 5, 6], m=[5], settings=[(0.01, 0.95), (0.05, 0.95)], sims=500)
    assert again.equals(t)
    rec = power.recommend(t, 0.95, 0.01)
    assert list(rec[["n", "threshold"]].iloc[0]) == [5, 0.01]
    with pytest.raises(ValueError, match="detect_min must be a fraction in"):
        power.recommend(t, 95, 0.01)  # a percent where a fraction belongs
    with pytest.raises(ValueError, match=">= 2"):
        power.power_table(pool, n=[1])


def test_slow_spells_of_the_second_h200_pool():
    # the pool alone on one H200 (examples/h200/README.md, "Gate power"): spells in 8 of 10 A launches
    pool = power.load_pool(ROOT / "examples/h200/ab-pool/h200-1gpu")
    assert pool.arms["C"] == {"DenoisingStage_pct": 5.85, "target": "warm_e2e"}
    sp = slow_spells(pool.values, pool.bundles).set_index("arm")
    assert list(sp.loc["A", ["requests", "slow_requests", "launches", "slow_launches"]]) == [60, 24, 10, 8]
    # quiet, the injected shares are where they were asked: B +2 %, C +4-6 %
    assert 1.015 < sp.loc["B", "quiet_ms"] / sp.loc["A", "quiet_ms"] < 1.025
    assert 1.03 < sp.loc["C", "quiet_ms"] / sp.loc["A", "quiet_ms"] < 1.07
    t = power.power_table(pool, n=[5], m=[6], settings=[(0.01, 0.99)], sims=500)
    assert (t["detect_DenoisingStage"] < 0.1).all() and (t["aa_covers"] >= 0.95).all()


def test_the_quiet_h200_pool_meets_the_gate_targets_at_n5_m5():
    # issue 23's target from the committed third pool (examples/h200/README.md, "Gate power"),
    # exact over every way to pick the launches: at N = 5, M = 5, a 1 % threshold and 95 %
    # confidence, with the exit code gated on DenoisingStage and warm e2e, both slowdowns exit 1
    # in every draw and no A/A split does; with every metric gating the A/A exits 1 in 11 of 252
    pool = power.load_pool(ROOT / "examples/h200/ab-pool/h200-dec01")
    assert pool.warm == 6 and [len(pool.launches(a)) for a in "ABC"] == [10, 10, 8]
    assert slow_spells(pool.values, pool.bundles)["slow_requests"].sum() == 0
    assert power.arm_warnings(pool) == {}
    t = power.power_table(pool, n=[4, 5], m=[3, 5], settings=[(0.01, 0.95), (0.01, 0.99)])
    assert t["aa_exact"].all() and t["ab_exact"].all()
    at = t[(t["n"] == 5) & (t["m"] == 5)].set_index(["confidence", "arm"])
    assert set(at["aa_ways"]) == {252} and at.loc[(0.95, "B"), "ab_ways"] == 252 * 252
    assert at.loc[(0.95, "C"), "ab_ways"] == 252 * 56
    assert (at["detect_gate"] == 1.0).all() and (at["aa_alarm_gate"] == 0.0).all()
    assert at.loc[(0.95, "B"), "aa_alarm_any"] * 252 == pytest.approx(11)
    assert at.loc[(0.99, "B"), "aa_alarm_any"] * 252 == pytest.approx(3)  # 1.2 %: over the 1 % bound
    # warm e2e itself moved only ~+3 % in C (its text encoder ran faster by chance)
    assert (
        0.95 < at.loc[(0.95, "C"), "detect_warm_e2e"] < 0.99
        and 0.4 < at.loc[(0.99, "C"), "detect_warm_e2e"] < 0.6
    )
    loose = t[t["confidence"] == 0.95]
    assert list(power.recommend(loose, alarm="gate")[["n", "m"]].iloc[0]) == [4, 5]  # N = 4, M = 3: 1.3 %
    assert list(power.recommend(loose, alarm="key")[["n", "m"]].iloc[0]) == [5, 5]
    assert power.recommend(loose, alarm="any").empty
    assert power.recommend(t[t["confidence"] == 0.99], alarm="any").empty
    # the same table again is the same (exact: no seed in it)
    assert (
        power.power_table(pool, n=[5], m=[5], settings=[(0.01, 0.95)], seed=7)["aa_alarm_any"].iloc[0]
        == (at.loc[(0.95, "B"), "aa_alarm_any"])
    )
    with pytest.raises(ValueError, match="alarm must be one of"):
        power.recommend(t, alarm="exit")
    with pytest.raises(ValueError, match=r"lacks \['detect_gate'\]"):
        power.recommend(t.drop(columns=["detect_gate"]), alarm="gate")
    with pytest.raises(ValueError, match="alarm_max must be a fraction"):
        power.recommend(t, 0.95, -0.1)


def test_slow_spells_read_the_clocks_the_sampler_recorded(tmp_path):
    # the committed pool predates clock sampling: give arm A's memory samples clocks, slower and at
    # the power cap inside its slow requests, and the spells say so
    shutil.copytree(ROOT / "examples/h200/ab-pool/h200-1gpu", tmp_path / "p")
    a = ResultBundle.load(tmp_path / "p" / "a")
    pool = power.load_pool(tmp_path / "p")
    sp = slow_spells(pool.values, pool.bundles).set_index("arm")
    assert math.isnan(sp.loc["A", "slow_sm_mhz"])  # not recorded
    x = pool.values["A"]
    x = x[(x["metric"] == "DenoisingStage") & (x["index"] > 0)]
    slow = x[x["value"] > 1.05 * x["value"].quantile(0.10)][["launch", "index"]]
    req = a.requests.merge(slow, on=["launch", "index"])
    mem = a.memory.copy()
    mem["sm_clock_mhz"], mem["power_w"], mem["clock_event_reasons"] = 1900.0, 600.0, 0
    for r in req.itertuples():
        inside = (mem["launch"] == r.launch) & mem["t_s"].between(r.t_start_s, r.t_end_s)
        assert inside.sum() >= 3, r  # the sampler ran during every request
        mem.loc[inside, ["sm_clock_mhz", "clock_event_reasons"]] = [1600.0, 0x4]
    a.tables["memory"] = mem
    a.save(tmp_path / "p" / "a")
    pool = power.load_pool(tmp_path / "p")
    sp = slow_spells(pool.values, pool.bundles).set_index("arm")
    assert (sp.loc["A", "slow_sm_mhz"], sp.loc["A", "quiet_sm_mhz"]) == (1600.0, 1900.0)
    assert (sp.loc["A", "slow_power_capped"], sp.loc["A", "quiet_power_capped"]) == (1.0, 0.0)
    assert math.isnan(sp.loc["B", "slow_sm_mhz"])
    text = update_text(
        f"<!-- perfkit:figures src={tmp_path / 'p'} kind=ab-power -->\n<!-- perfkit:end -->", ROOT
    )
    assert (
        "SM clock 1600 MHz slow vs 1900 MHz quiet, at a power limit in 100 % vs 0 % of their samples" in text
    )


def test_bad_pools_are_named_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no a/meta.json"):
        power.load_pool(tmp_path)
    shutil.copytree(POOL / "a", tmp_path / "p" / "a")
    with pytest.raises(FileNotFoundError, match="no B arm"):
        power.load_pool(tmp_path / "p")
    shutil.copytree(POOL / "b", tmp_path / "p" / "b")
    (tmp_path / "p" / power.POOL_FILE).write_text(json.dumps({"arms": {"C": {"DenoisingStage_pct": 5}}}))
    with pytest.raises(ValueError, match=r"pool.json: arms \['C'\] have no bundle"):
        power.load_pool(tmp_path / "p")
    for doc, said in (
        ("{not json", r"bad pool description \(\(top\): Invalid JSON"),
        ('{"arms": null}', r"arms: Input should be an object"),
        ('{"arms": {"B": 5}}', r"arms\.B: Input should be an object"),
        (
            '{"arms": {"B": {"DenoisingStage_pct": "2"}}}',
            r"arms\.B\.DenoisingStage_pct: Input should be a valid number",
        ),
        (
            '{"arms": {"B": {"DenoisingStage_pct": 2, "target": "warm_e2e_typo"}}}',
            r"arms\.B\.target: Input should be",
        ),
        ('{"arms": {"B": {"target": "warm_e2e"}}}', r"arms\.B\.DenoisingStage_pct: Field required"),
        (
            '{"arms": {"b": {"DenoisingStage_pct": 2}}}',
            r"arm names are upper-case letters \(B, C, …\), got \['b'\]",
        ),
        ('{"arms": {}}', r"describes no arm, yet B have bundles"),
    ):
        (tmp_path / "p" / power.POOL_FILE).write_text(doc)
        with pytest.raises(ValueError, match=said):
            power.load_pool(tmp_path / "p")
    (tmp_path / "p" / power.POOL_FILE).unlink()
    # a launch whose warm requests are gone (a crash, a cut-short run) is named, not averaged in
    import pandas as pd

    for table in ("requests", "stages"):
        f = tmp_path / "p" / "a" / f"{table}.parquet"
        df = pd.read_parquet(f)
        df[df["launch"] != "A03"].to_parquet(f)
    with pytest.raises(ValueError, match=r"a: launches \['A03'\] have no completed warm request"):
        power.load_pool(tmp_path / "p")
    (tmp_path / "p" / "a" / "requests.parquet").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"a/requests.parquet: missing \(arm A of the pool has no requests.parquet\)"
    ):
        power.load_pool(tmp_path / "p")


def test_a_side_too_small_for_n_is_no_rate_not_zero(tmp_path):
    # A cut to its first 3 launches: N = 5 draws nothing from A, so no rate (NaN), never 0 %
    shutil.copytree(POOL, tmp_path / "p")
    a = ResultBundle.load(tmp_path / "p" / "a")
    keep = ["A00", "A01", "A02"]
    for name in ("requests", "stages", "steps", "memory", "launches"):
        df = a.table(name)
        a.tables[name] = df[df["launch"].isin(keep)]
    a.save(tmp_path / "p" / "a")
    pool = power.load_pool(tmp_path / "p")
    t = power.power_table(pool, n=[2, 3, 5], m=[5], settings=[(0.01, 0.95)], sims=200).set_index("n")
    assert t.loc[5, ["detect_DenoisingStage", "detect_warm_e2e", "alarm_untouched"]].isna().all()
    assert math.isnan(t.loc[2, "aa_covers"])  # A/A needs 4 distinct A launches
    assert t.loc[3, "detect_DenoisingStage"] > 0.5  # +9.7 % at 3 a side, from the 3 there are
    assert power.recommend(t.reset_index(), 0.0, 1.0).empty  # no A/A rate anywhere: nothing recommended
    with pytest.raises(ValueError, match=r"M \[6\]: the pool has 1 to 5 warm requests"):
        power.power_table(pool, n=[2], m=[6])
    with pytest.raises(ValueError, match="sims must be >= 1"):
        power.power_table(pool, n=[2], sims=0)
    # the figures say why a cell has no rate
    from perfkit.report.ab import power_markdown

    md = power_markdown(tmp_path / "p", 0.01, 0.95)
    assert (
        "- No A/A rate (–) at N = 2, 3, 4, 5: an A/A needs 2N distinct A launches and the pool has 3." in md
    )
    assert (
        "- No rate for B (–) at N = 4, 5: it needs N launches of A and of B; the pool has 3 of A and 10 of B."
        in md
    )


def test_ab_power_figures_block(tmp_path):
    block = f"<!-- perfkit:figures src={POOL.relative_to(ROOT)} kind=ab-power threshold=0.01 confidence=0.95 -->\n"
    text = update_text(block + "<!-- perfkit:end -->", ROOT)
    assert "| DenoisingStage | 2.2 % | 1.9 % | 0.57 |" in text
    assert "Decided as `perfkit ab --threshold 0.01 --confidence 0.95`" in text
    assert "| 5 | 5 | 100.0 % | 0.0 % | 0.0 % |" in text
    # its B overshot (+9.7 % for 2 % asked): its rates are not a 2 % change's, so nothing is recommended
    assert "- **Off its asked change:** arm B measured +9.7 % on DenoisingStage against +2 % asked" in text
    assert "Cheapest N and M" not in text
    for good, bad, said in (
        ("threshold=0.01", "threshold=x", "not a number"),
        ("confidence=0.95", "confidence=1.5", r"fraction in \(0, 1\)"),
    ):
        with pytest.raises(FiguresError, match=said):
            update_text(block.replace(good, bad) + "<!-- perfkit:end -->", ROOT)
    with pytest.raises(FiguresError, match="threshold given twice"):
        update_text(
            block.replace("threshold=0.01", "threshold=0.01 threshold=0.5") + "<!-- perfkit:end -->", ROOT
        )
    with pytest.raises(FiguresError, match="ab-power nowhere: .*no a/meta.json"):
        update_text("<!-- perfkit:figures src=nowhere kind=ab-power -->\n<!-- perfkit:end -->", ROOT)


@pytest.mark.slow  # not `timing`: it checks the order, the arms' settings and the table's gaps, no time
def test_live_three_arm_pool_of_the_tiny_engine(tmp_path):
    data = load_yaml((ROOT / "examples/ab/tiny-cpu.yaml").read_text())
    a = EngineSpec.from_dict(data)
    specs = {
        "A": a,
        "B": a.replace(debug_stage_delay={"DenoisingStage": 30.0}),
        "C": a.replace(debug_stage_delay={"DenoisingStage": 60.0}),
    }
    out = run_arms(specs, VideoRequestSpec(num_frames=9), {"A": 2, "B": 1, "C": 1}, 2, tmp_path)
    assert set(out) == {"A", "B", "C"}
    meta = ResultBundle.load(tmp_path / "c").meta["ab"]
    assert meta["order"] == ["A00", "B00", "C00", "A01"]
    assert meta["launches_per_side"] == {"A": 2, "B": 1, "C": 1} and meta["warm_per_launch"] == 2
    for arm, pct in (("b", 30.0), ("c", 60.0)):
        rec = json.loads(ResultBundle.load(tmp_path / arm).records[f"{arm.upper()}00"][-1])
        assert rec["perfkit"]["debug_stage_delay_pct"] == {"DenoisingStage": pct}
    pool = power.load_pool(tmp_path)
    assert set(pool.arms) == {"B", "C"} and pool.arms["C"]["DenoisingStage_pct"] == 60.0
    t = power.power_table(pool, n=[2], m=[1, 2], sims=50)
    # one launch of B: no draw of two, no rate (never 0)
    assert t["detect_DenoisingStage"].isna().all() and (t["aa_covers"].isna()).all()
    with pytest.raises(ValueError, match="launch counts for arms"):
        run_arms(specs, VideoRequestSpec(num_frames=9), {"A": 1}, 1, tmp_path / "x")


def test_ab_replay_of_a_noisy_pool_names_its_slow_spells(tmp_path):
    from click.testing import CliRunner

    from perfkit.cli import cli

    pool = ROOT / "examples/h200/ab-pool/h200-1gpu"
    out = tmp_path / "ab"
    res = CliRunner().invoke(
        cli,
        ["ab", "--replay", str(pool / "a"), str(pool / "b"), "--out", str(out), "-q", "--threshold", "0.01"],
    )
    # +2 % hidden under the spells: not a regression, and not a pass either (issue 39): every metric
    # gates, and what is still inconclusive over the recorded launches is undecided, exit 1
    assert res.exit_code == 1, res.output
    md = (out / "summary.md").read_text()
    assert md.startswith("## perfkit ab: undecided (exit code 1)")
    assert "DenoisingStage" in json.loads((out / "ab.json").read_text())["meta"]["sequential"]["undecided"]
    assert "10 launches a side, 6 warm requests a launch" in md  # what the two sides replayed hold
    assert "- slow spells (DenoisingStage more than 5 % above the side's quiet level" in md
    assert "A: 24 of 60 warm requests in 8 of 10 launches (quiet level 715 ms, worst +43 %)" in md
    html = (out / "report.html").read_text()
    assert "<b>Host noise:</b> Slow spells" in html
    spells = json.loads((out / "ab.json").read_text())["meta"]["slow_spells"]
    assert [s["arm"] for s in spells] == ["A", "B"] and spells[0]["slow_sm_mhz"] is None  # not recorded


def test_ab_power_refuses_to_record_over_a_directory_that_is_not_a_pool(tmp_path):
    import subprocess
    import sys

    (tmp_path / "notes.txt").write_text("not a pool")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/ab_power.py"), "--pool-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "not a recorded pool (no a/meta.json) and not empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written, nothing launched

"""Issue 51's load figures on two real recorded load bundles: the tiny reference engine on a
loaded 2-core CPU runner (``tests/fixtures/load-ci-cpu``: ``perfkit measure --params
params/ci-cpu.yaml --only load --set load.enabled=true --out DIR`` at load average 7, with this
branch's code: the open loop's rate was asked live) and the H200 (``examples/h200/load``). Each
figure is recomputed from the per-request rows (no engine), and the command-line half (``--set``,
``--only`` of a disabled investigation) runs the real CLI; one suite replay of the CPU bundle."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import inprocess_cli
from perfkit.bundle import ResultBundle
from perfkit.investigations import load as L
from perfkit.investigations.load_stats import quantile_row
from perfkit.stats import quantile_ci

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests/fixtures/load-ci-cpu"
H200 = REPO / "examples/h200/load/bundles/load"
#: the command params/ci-cpu.yaml's load comment gives
COMMAND = "perfkit suite --params params/ci-cpu.yaml --only load --set load.enabled=true"


def _summary(path: Path, results: dict | None = None) -> dict:
    b = ResultBundle.load(path)
    r = copy.deepcopy(results if results is not None else b.results)
    r.update(L.summarise(r, b.memory))
    return r


def test_capacity_is_the_largest_throughput_delivered_and_the_open_loop_asked_3x_it():
    r = _summary(TINY / L.NAME)
    rows = [x for x in r["per_request"] if x["phase"] == "closed"]
    delivered = {}
    for k in (1, 2, 4):  # completed / (first submit to last result), counted here again
        mine = [x for x in rows if x["level"] == k]
        span = max(x["t_end_s"] for x in mine) - min(x["t_submit_s"] for x in mine)
        delivered[k] = sum(x["status"] == "completed" for x in mine) / span
    best = max(delivered, key=delivered.get)
    assert r["capacity_rps"] == pytest.approx(delivered[best], rel=1e-9)
    assert r["capacity_at"] == f"concurrency {best}"
    # run_phases asked rate_over_capacity (3.0) x the same capacity while measuring
    assert r["open_loop"]["rate_rps"] == pytest.approx(3.0 * r["capacity_rps"], rel=1e-9)
    assert f"capacity {r['capacity_rps']:.2f}/s, delivered at concurrency {best}" in L.reading(r)
    # the H200's levels deliver 1.197/s; 1 / median service time said 1.2195/s
    h = _summary(H200)
    assert h["capacity_rps"] == pytest.approx(max(lv["throughput_vpm"] for lv in h["levels"]) / 60, rel=1e-9)
    assert h["capacity_rps"] == pytest.approx(1.197, abs=0.001)


def test_the_slo_base_leaves_out_the_warm_up_request_that_recompiled_and_says_so():
    b = ResultBundle.load(TINY / L.NAME)
    warm = [x for x in b.results["per_request"] if x["phase"] == "warmup"]
    assert [x["compiles"] for x in warm] == [1, 0, 0]  # the 25-frame request after a 17-frame warmup
    r = _summary(TINY / L.NAME)
    steady = float(np.median([x["e2e_ms"] for x in warm[1:]]))
    assert r["slo_ms"] == pytest.approx(3.0 * steady, rel=1e-9)
    assert r["slo_ms"] < 0.95 * 3.0 * float(np.median([x["e2e_ms"] for x in warm]))
    assert "the 2 of 3 warm-up requests that compiled nothing" in r["slo_source"]
    assert r["slo_source"] in L.reading(r)
    # an engine that reports no compiles (sglang): every warm-up request, and the text says so
    res = copy.deepcopy(b.results)
    for x in res["per_request"]:
        x["compiles"] = None
    r = _summary(TINY / L.NAME, res)
    assert "3 warm-up requests (compiles not reported)" in r["slo_source"]
    # every warm-up request compiled: no SLO, never one made of recompilations
    for x in res["per_request"]:
        x["compiles"] = 1 if x["phase"] == "warmup" else 0
    r = _summary(TINY / L.NAME, res)
    assert r["slo_ms"] is None and "each of the 3 warm-up requests compiled" in r["slo_source"]
    assert all(lv["slo_attainment"] is None for lv in r["levels"])


def test_a_p99_is_quoted_with_its_count_and_interval_and_headlined_only_when_bounded():
    r = _summary(TINY / L.NAME)
    heads = {k.label: k.text for k in L.key_numbers(r)}
    for k in (1, 4):
        lv = next(x for x in r["levels"] if x["concurrency"] == k)
        assert lv["completed"] == 8 and lv["p99_ci"][1] is None
        text = heads[f"p99 e2e at concurrency {k}"]
        assert text.startswith("not bounded by 8 requests (368 needed); p50 ")
        assert f"{lv['p99_ms']:,.0f}" not in text
    table = L.summary_table(r)
    assert table["p99_interval_ms"].str.endswith("unbounded]").all() and (table["completed"] > 0).all()
    # 368 requests bound it: quantile_ci's upper rank then lies inside the sample
    assert (
        np.isnan(quantile_ci(np.arange(367.0), 0.99)[1]) and quantile_ci(np.arange(368.0), 0.99)[1] == 367.0
    )
    lv = {"completed": 400, **quantile_row([float(x) for x in range(400)])}
    lo, hi = quantile_ci(np.arange(400.0), 0.99)
    assert L.p99_text(lv) == f"{lv['p99_ms']:,.0f} ms [{lo:,.0f}, {hi:,.0f}] of 400 requests"


def _slowed(results: dict, k: int, factor: float) -> dict:
    """The H200 results with level ``k``'s requests taking ``factor`` x as long (service, queue,
    e2e, and their results spread over ``factor`` x the level's wall time)."""
    res = copy.deepcopy(results)
    mine = [x for x in res["per_request"] if x["phase"] == "closed" and x["level"] == k]
    t0 = min(x["t_submit_s"] for x in mine)
    for x in mine:
        x["t_submit_s"] = t0 + factor * (x["t_submit_s"] - t0)
        x["t_end_s"] = t0 + factor * (x["t_end_s"] - t0)
        for key in ("e2e_ms", "service_ms", "queue_wait_ms"):
            x[key] *= factor
    return res


def test_a_throughput_fall_or_service_rise_with_concurrency_is_a_finding_only_beyond_noise():
    h = _summary(H200)
    assert h["findings"] == []  # one request at a time: flat throughput, flat service time
    c4 = h["levels"][-1]
    assert c4["throughput_ratio_ci"][0] < 1.0 < c4["throughput_ratio_ci"][1]
    assert {k.label: k.text for k in L.key_numbers(h)}["concurrency findings"] == "none beyond noise"
    slow = _summary(H200, _slowed(ResultBundle.load(H200).results, 4, 3.0))
    (finding,) = slow["findings"]
    assert finding.startswith("At concurrency 4 throughput fell to 0.33 x concurrency 1's")
    assert "median service time rose from 820 to 2,505 ms (3.05 x" in finding
    c4 = slow["levels"][-1]
    assert c4["throughput_ratio_ci"][1] < 0.85 and c4["service_ratio_ci"][0] > 1.15
    assert finding in L.reading(slow)
    # the loaded CPU runner: throughput 0.75 x and service 1.4 x at 4 in flight, inside the noise
    # of 8 requests (the intervals reach 0.85 and 1.15): said as numbers, not as a finding
    t = _summary(TINY / L.NAME)
    c4 = t["levels"][-1]
    assert c4["throughput_ratio"] == pytest.approx(0.754, abs=0.001) and c4["throughput_ratio_ci"][1] >= 0.85
    assert c4["service_ratio_ci"][0] <= 1.15 and t["findings"] == []


def test_only_of_a_disabled_investigation_is_refused_and_set_is_validated_naming_the_key(tmp_path):
    params = REPO / "params/ci-cpu.yaml"
    assert COMMAND in params.read_text()  # the comment's command is the one run below
    out = tmp_path / "run"
    res = inprocess_cli.perfkit("suite", "--params", str(params), "--only", "load", "--out", str(out))
    assert res.returncode == 2 and not out.exists()
    assert "--only load: load.enabled is false in the params (add --set load.enabled=true)" in res.stderr
    res = inprocess_cli.perfkit(
        "suite", "--params", str(params), "--only", "load", "--set", "load.enabld=true", "--out", str(out)
    )
    assert res.returncode == 2 and not out.exists()
    assert "unknown key 'enabld' in load (did you mean 'enabled'?)" in res.stderr
    res = inprocess_cli.perfkit(
        "measure", "--params", str(params), "--only", "load", "--out", str(out),
        "--set", "load.enabled=true", "--set", "load.concurrency=[0, 2]",
    )  # fmt: skip
    assert res.returncode == 2 and not (out / L.NAME).exists()
    assert re.search(r"with --set .*: load\.concurrency: levels must be distinct integers >= 1", res.stderr)
    res = inprocess_cli.perfkit("measure", "--params", str(params), "--only", "load", "--out", str(out))
    assert res.returncode == 2 and "add --set load.enabled=true" in res.stderr


def test_the_comments_command_replays_the_cpu_bundle_with_load_enabled_by_set(tmp_path):
    """The params comment's command, on the recorded bundle (--replay: no engine launched)."""
    from perfkit.suite import run_suite

    res = run_suite(
        REPO / "params/ci-cpu.yaml", tmp_path / "run", replay=TINY, only=["load"],
        sets=["load.enabled=true"], screenshot=False, progress=False,
    )  # fmt: skip
    run = tmp_path / "run"
    assert res.exit_code == 0, (run / "summary.md").read_text()
    assert json.loads((run / "run.json").read_text())["params_set"] == ["load.enabled=true"]
    assert yaml.safe_load((run / "params.yaml").read_text())["load"]["enabled"] is True
    verdict = json.loads((run / L.NAME / "verdict.json").read_text())
    assert {(x["metric"], x["status"]) for x in verdict["rows"] if x["case"] == L.NAME} == {
        ("memory_growth_mib", "pass"),
        ("failed_requests", "pass"),
    }
    assert "| concurrency findings | none beyond noise |" in (run / "summary.md").read_text()

"""`perfkit baseline update` on the real H200 bundles in examples/h200: the steady state, one
hardware per file, and agreement with the suite's gate."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import inprocess_cli
from floats import close
from perfkit.bundle import ResultBundle
from perfkit.gate import baseline as bl
from perfkit.gate.run import bundle_cases, gate
from perfkit.gate.verdicts import exit_code, gate_result, write_verdict
from perfkit.params import load_params

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ROOT / "examples" / "h200" / "bundles"
H200 = ROOT / "baselines" / "h200.json"


def _update(*args: str) -> subprocess.CompletedProcess:
    """``perfkit baseline update ARGS``, in this process (tests/inprocess_cli.py)."""
    return inprocess_cli.perfkit("baseline", "update", *args)


@pytest.fixture
def copy(tmp_path):
    p = tmp_path / "h200.json"
    shutil.copy(H200, p)
    return p


def test_update_keeps_the_steady_state_not_the_uncovered_cold_request(copy):
    case = "ltx-2b_25f_512x768_30s_w17"
    r = _update(
        "--bundle",
        str(BUNDLES / "cold_warm"),
        "--baseline",
        str(copy),
        "--case",
        case,
        "--hardware",
        "NVIDIA H200",
    )
    assert r.returncode == 0, r.stderr
    got = bl.load_baseline(copy)["scenarios"][case]
    want = bl.load_baseline(H200)["scenarios"][case]
    # the cold request recompiled for 58 s; the baseline holds the warm requests (~1 s)
    # recomputed medians rounded to 0.01 ms: within one rounding step of the committed ones
    assert (
        close(got["expected_e2e_ms"], want["expected_e2e_ms"], abs_tol=0.0101)
        and got["expected_e2e_ms"] < 2000
    )
    assert close(got["denoise_step_ms"], want["denoise_step_ms"], abs_tol=0.0101)
    assert "git commit" in bl.load_baseline(copy)["metadata"]["description"]


def test_update_refuses_another_hardware(copy):
    before = copy.read_bytes()
    r = _update(
        "--bundle",
        str(BUNDLES / "cold_warm"),
        "--baseline",
        str(copy),
        "--case",
        "x",
        "--hardware",
        "ci-cpu-2core",
    )
    assert r.returncode == 2 and "NVIDIA H200" in r.stderr
    assert copy.read_bytes() == before


def test_update_of_a_multi_launch_bundle_names_the_launch(copy):
    r = _update("--bundle", str(BUNDLES / "warmup_shapes"), "--baseline", str(copy), "--case", "x")
    assert r.returncode == 2 and "warmup17" in r.stderr and "--launch" in r.stderr
    case = "ltx-2b_25f_512x768_30s_w25_shapes"
    r = _update(
        "--bundle",
        str(BUNDLES / "warmup_shapes"),
        "--baseline",
        str(copy),
        "--case",
        case,
        "--launch",
        "warmup25",
        "--num-frames",
        "25",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(copy.read_text())["scenarios"][case] == bl.load_baseline(H200)["scenarios"][case]


TRACES = ROOT / "examples" / "h200" / "sglang-traces" / "bundles"
UNLIMITED = "ltx-2b_25f_512x768_30s_w17_cap-unlimited"
OFF = "baseline measured with compile off, this run compile on: not compared"


def test_update_records_what_the_engine_ran(copy):
    """The committed memory_budget bundle predates the launches' config columns: its records say
    compile off; the 2026-12-04 bundle's launches table says compile on with inductor; each
    update writes its own (the old key is replaced, not kept), every number as derived."""
    args = ("--baseline", str(copy), "--case", UNLIMITED, "--launch", "cap0")
    assert _update("--bundle", str(BUNDLES / "memory_budget"), *args).returncode == 0
    got = bl.load_baseline(copy)["scenarios"][UNLIMITED]
    assert got["perfkit_engine"] == {"compile_active": False, "dtype": "bfloat16", "device": "cuda:0"}
    assert got == bl.load_baseline(H200)["scenarios"][UNLIMITED]
    assert _update("--bundle", str(TRACES / "memory_budget"), *args).returncode == 0
    got = bl.load_baseline(copy)["scenarios"][UNLIMITED]
    assert got["perfkit_engine"] == {
        "compile_active": True,
        "compile_backend": "inductor",
        "dtype": "bfloat16",
        "device": "cuda:0",
    }


def _entries(investigation: str) -> dict:
    """Case -> entry of one investigation of the 2026-12-04 run, as its gate derives them."""
    p = load_params(ROOT / "params/h200-sglang-traces.yaml")
    b = {investigation: ResultBundle.load(TRACES / investigation)}
    cases = bundle_cases(b, p.engine.model_dump(), p.request.model_dump())
    return {c: bl.from_bundle(sb, c) for c, sb in cases.items()}


def test_same_engine_compares_as_without_the_key_and_another_is_not_compared(tmp_path):
    """cold_warm (compiled on both sides): the same rows as with the key removed from both;
    memory_budget (baseline uncompiled): every row skipped naming both, none pass or fail, and a
    verdict of nothing else is not a pass; another dtype is named the same way."""
    ref = bl.load_baseline(H200)
    run = _entries("cold_warm")
    rows = bl.compare(run, ref)
    assert {r.status for r in rows} >= {"pass", "improved"} and "not compared" not in str(rows)
    bare_ref, bare_run = json.loads(json.dumps(ref)), json.loads(json.dumps(run))
    for e in [*bare_ref["scenarios"].values(), *bare_run.values()]:
        e.pop("perfkit_engine")
    assert bl.compare(bare_run, bare_ref) == rows

    budget = bl.compare(_entries("memory_budget"), ref)
    assert len(budget) == 36 and {(r.status, r.reason) for r in budget} == {("skipped", OFF)}
    doc = write_verdict(tmp_path, "baseline_gate", budget)
    assert doc["status"] == "skipped" and gate_result("ok", doc) == "not gated"
    assert exit_code("not gated", doc) == 2

    other = json.loads(json.dumps(ref))
    other["scenarios"]["ltx-2b_25f_512x768_30s_w17"]["perfkit_engine"]["dtype"] = "float16"
    (r,) = {r.reason for r in bl.compare(run, other)}
    assert r == "baseline measured with dtype float16, this run dtype bfloat16: not compared"


def test_a_malformed_engine_key_names_the_file_and_key(tmp_path):
    doc = json.loads(H200.read_text())
    doc["scenarios"][UNLIMITED]["perfkit_engine"]["compile_active"] = "false"
    p = tmp_path / "h200.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(bl.BaselineError, match=f"scenarios.{UNLIMITED}.perfkit_engine"):
        bl.load_baseline(p)


def test_the_committed_h200_replay_keeps_its_verdict(tmp_path):
    """params/h200.yaml on examples/h200/bundles: every case's engine ran as its baseline entry
    says, so each baseline row is the committed report's (examples/h200/report), still a pass."""
    for d in BUNDLES.iterdir():
        (tmp_path / d.name).symlink_to(d)
    p = load_params(ROOT / "params/h200.yaml")
    res = gate(
        tmp_path,
        engine=p.engine.model_dump(),
        request=p.request.model_dump(),
        baseline_file=H200,
        profile=p.baseline.profile,
        hardware=p.baseline.hardware,
        invariants=p.invariants_all(),
    )
    verdict = json.loads((ROOT / "examples/h200/report/baseline_gate/verdict.json").read_text())
    assert verdict["status"] == "pass" and not [r for r in res.rows if r.status == "fail"]
    cases = set(bl.load_baseline(H200)["scenarios"])
    committed = sorted(
        (r["case"], r["metric"], r["status"], r["reason"]) for r in verdict["rows"] if r["case"] in cases
    )
    assert len(committed) == 90
    assert sorted((r.case, r.metric, r.status, r.reason) for r in res.baseline_rows) == committed


@pytest.mark.parametrize(
    "ms, says",
    [(None, "column ms is null for stage"), ("827.07", "column 'ms' holds '827.07'"), ("fast", "'fast'")],
)
def test_update_refuses_stage_ms_that_is_not_a_number(tmp_path, ms, says):
    """Issue 54: a stages.parquet ``ms`` all null wrote every stage as 0.0 (exit 0); as text, it
    was coerced. Now exit 2 naming the file and column, and no baseline written."""
    import pandas as pd

    b = tmp_path / "b"
    shutil.copytree(BUNDLES / "cold_warm", b)
    df = pd.read_parquet(b / "stages.parquet")
    df["ms"] = pd.Series([ms] * len(df), dtype=object)
    df.to_parquet(b / "stages.parquet", index=False)
    out = tmp_path / "x.json"
    r = _update("--bundle", str(b), "--baseline", str(out), "--case", "c1")
    assert r.returncode == 2 and f"{b}/stages.parquet" in r.stderr and says in r.stderr, r.stderr
    assert not out.exists()

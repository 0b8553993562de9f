"""The suite: papermill notebooks, gate, outputs and exit codes.

Replay tests run the real notebooks through papermill on synthetic bundles (no engine); the
end-to-end test runs ``perfkit suite --params params/ci-cpu.yaml`` for real on the tiny
reference engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from perfkit import suite
from perfkit.bundle import ResultBundle
from perfkit.gate import baseline as bl
from perfkit.gate import run as gate_run
from perfkit.gate import verdicts
from perfkit.investigations import registry
from perfkit.params import load_params

sys.path.insert(0, str(Path(__file__).parent))
import synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"


def perfkit(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# --------------------------------------------------------------------------- notebooks


@pytest.mark.parametrize("name", verdicts.notebooks())
def test_notebook_committed_clean_with_parameters_cell(name):
    nb = nbformat.read(str(NB_DIR / f"{name}.ipynb"), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    src = tagged[0].source
    assert "run_dir: str =" in src and "engine: dict =" in src and "request: dict =" in src
    assert "fail_on: str = 'gate'" in src
    if name != verdicts.GATE:
        assert 'bundle_dir: "Optional[str]" = None' in src
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None, f"{name}: outputs committed"


def test_notebooks_match_generator():
    proc = subprocess.run(
        [sys.executable, str(NB_DIR / "make_notebooks.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def test_notebook_parameters_parse_with_papermill():
    """Every parameter the suite passes is declared in the notebook's parameters cell."""
    from papermill.inspection import inspect_notebook

    from perfkit.params import load_params

    p = load_params(ROOT / "params" / "ci-cpu.yaml")
    for name in verdicts.notebooks():
        declared = set(inspect_notebook(str(NB_DIR / f"{name}.ipynb")))
        passed = set(suite.notebook_parameters(name, p, Path("/tmp/x")))
        assert passed <= declared, f"{name}: undeclared {passed - declared}"


# --------------------------------------------------------------------------- helpers


def test_case_ids():
    eng = {"kind": "reference", "preset": "tiny", "warmup_frames": 17}
    req = {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4}
    assert gate_run.case_id(eng, req) == "tiny_25f_64x64_4s_w17"
    assert gate_run.case_id(eng, req, warmup_frames=25, suffix="_shapes") == "tiny_25f_64x64_4s_w25_shapes"
    # the two-stage pipeline and a multi-GPU engine are other cases of the same shape
    two = {**eng, "two_stage": True, "num_gpus": 2}
    assert gate_run.case_id(two, req) == "tiny_25f_64x64_4s_w17_2stage_2gpu"
    assert gate_run.case_id({**two, "num_gpus": 1}, req) == "tiny_25f_64x64_4s_w17_2stage"


def test_bundle_cases_and_gate(tmp_path):
    run = synthetic.make_run(tmp_path)
    eng = {"kind": "reference", "preset": "tiny", "warmup_frames": 17}
    req = {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4}
    cases = gate_run.bundle_cases(gate_run.load_run_bundles(run), eng, req)
    # the uncovered 17 -> 25 slice is the investigation's finding, not a baseline case
    assert set(cases) == {
        "tiny_25f_64x64_4s_w17",
        "tiny_25f_64x64_4s_w25_shapes",
        "tiny_25f_64x64_4s_w17_cap-unlimited",
        "tiny_25f_64x64_4s_w17_cap-8GiBhost",
    }
    # a shapes case holds one launch only
    assert set(cases["tiny_25f_64x64_4s_w25_shapes"].requests["launch"]) == {"w25"}
    g = gate_run.gate(run, engine=eng, request=req)
    doc = bl.load_baseline(run / "baseline.json")
    assert set(doc["scenarios"]) == set(cases)
    assert all(r.status != "fail" for r in g.rows)
    # comparing the run with its own baseline passes
    g2 = gate_run.gate(run, engine=eng, request=req, baseline_file=run / "baseline.json")
    assert any(r.status == "pass" for r in g2.baseline_rows)
    assert all(r.status in ("pass", "skipped") for r in g2.baseline_rows), [
        r for r in g2.baseline_rows if r.status not in ("pass", "skipped")
    ]


def test_exit_code_rules():
    import pandas as pd

    ok = pd.DataFrame([{"status": "pass"}])
    bad = pd.DataFrame([{"status": "fail"}])
    assert verdicts.exit_code_for([{"status": "ok"}], ok) == 0
    assert verdicts.exit_code_for([{"status": "ok"}], bad) == 1
    assert verdicts.exit_code_for([{"status": "error"}], ok) == 2
    # a baseline that compared nothing is misuse (2), not a regression (1)
    none = pd.DataFrame([{"case": "baseline", "metric": "cases compared", "status": "fail"}])
    assert verdicts.exit_code_for([{"status": "ok"}], none) == 2
    # every check skipped (nothing measured) is not a pass either
    skipped = pd.DataFrame([{"case": "cold_warm", "metric": "warm_cold_ratio", "status": "skipped"}])
    assert verdicts.exit_code_for([{"status": "ok"}], skipped) == 2
    assert "nothing measured" in verdicts.nothing_measured_reason(skipped)
    assert verdicts.nothing_measured_reason(ok) is None


# --------------------------------------------------------------------------- replayed suite


@pytest.mark.slow
def test_replayed_suite_passes(ci_cpu_replay_run):
    """``perfkit suite --params params/ci-cpu.yaml --replay`` of synthetic bundles of every
    investigation, ``GITHUB_STEP_SUMMARY`` set (conftest's session run, shared with the browser
    tests, which only read it)."""
    proc, out, rec = ci_cpu_replay_run["proc"], ci_cpu_replay_run["out"], ci_cpu_replay_run["rec"]
    summary = ci_cpu_replay_run["gh_summary"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for f in ("report.html", "summary.md", "baseline.json", "run.json", "params.yaml"):
        assert (out / f).exists(), f
    enabled = load_params(ROOT / "params" / "ci-cpu.yaml").enabled()
    ran = [*(n for n in enabled if (rec / n / "meta.json").exists()), verdicts.GATE]
    for n in ran:
        assert (out / "notebooks" / f"{n}.ipynb").exists()
    for s in ran[:-1]:
        ResultBundle.load(out / s)
    # a disabled investigation, or one the replay has no bundle of, is skipped with its reason
    statuses = {n["name"]: n for n in json.loads((out / "run.json").read_text())["notebooks"]}
    skipped = [n for n in verdicts.notebooks() if n not in ran]
    assert skipped and all(statuses[n]["status"] == "skipped" for n in skipped), statuses
    for n in skipped:
        want = "no bundle in replay dir" if n in enabled else "disabled in the params"
        assert statuses[n]["reason"] == want, statuses[n]
    text = (out / "summary.md").read_text()
    assert "PASS" in text and "warm/cold ratio" in text
    assert summary.read_text() == text + "\n"
    html = (out / "report.html").read_text()
    assert "Verdict" in html and html.count("data:image/png;base64,") >= 8
    assert "<script" not in html
    doc = bl.load_baseline(out / "baseline.json")
    assert "tiny_25f_64x64_4s_w17" in doc["scenarios"]


@pytest.mark.slow
def test_notebook_that_raises_still_reports_exit_2(tmp_path):
    """A params value that makes a notebook raise: the replayed cold_warm bundle is really a
    warmup_shapes bundle. The report still renders, with the error visible; exit code 2."""
    rec = tmp_path / "recorded"
    synthetic.warmup_shapes().save(rec / "cold_warm")
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        "params/ci-cpu.yaml",
        "--out",
        str(out),
        "--replay",
        str(rec),
        "--only",
        "cold_warm",
        "--no-screenshot",
        "-q",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    html = (out / "report.html").read_text()
    assert "ERROR" in html and "cold_warm failed" in html
    # the traceback (nbconvert's HTML of the error output; the page's own error box escapes the
    # quotes, so this finds the traceback itself)
    # (the cell after the parameters refuses another investigation's bundle, before any replay)
    assert "NotebookParamsError" in html and "expected 'cold_warm'" in html
    run = json.loads((out / "run.json").read_text())
    nb = {n["name"]: n for n in run["notebooks"]}
    assert nb["cold_warm"]["status"] == "error" and nb["cold_warm"]["ename"] == "NotebookParamsError"
    # the finish time names its UTC offset (history reads it on any machine's time zone)
    assert datetime.fromisoformat(run["finished"]).utcoffset() is not None, run["finished"]
    assert "ERROR" in (out / "summary.md").read_text()
    # perfkit report re-renders the same run
    (out / "report.html").unlink()
    assert perfkit("report", str(out)).returncode == 0
    assert "cold_warm failed" in (out / "report.html").read_text()


def test_engine_crash_is_a_investigation_error():
    b = synthetic.cold_warm()
    b.results = {"error": "engine exited with code -9 during request 1", "leak_checks": []}
    with pytest.raises(registry.InvestigationError, match="engine exited"):
        registry.get("cold_warm").check_bundle(b)
    b.results = {**synthetic.cold_warm().results, "cold_ms": None}  # a replay with a null cold_ms
    with pytest.raises(registry.InvestigationError, match="results have no cold_ms$"):
        registry.get("cold_warm").check_bundle(b)
    mb = synthetic.memory_budget()
    mb.results["caps"][0]["completed"] = False  # the uncapped run crashed
    with pytest.raises(registry.InvestigationError, match="without caps"):
        registry.get("memory_budget").check_bundle(mb)
    mb = synthetic.memory_budget()
    mb.results["caps"][1]["completed"] = False  # a capped run failing is a verdict, not an error
    registry.get("memory_budget").check_bundle(mb)


@pytest.mark.slow
def test_replayed_engine_crash_exits_2(tmp_path):
    rec = tmp_path / "recorded"
    b = synthetic.cold_warm()
    b.results = {"error": "engine exited with code -9", "leak_checks": []}
    b.save(rec / "cold_warm")
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        "params/ci-cpu.yaml",
        "--out",
        str(out),
        "--replay",
        str(rec),
        "--only",
        "cold_warm",
        "--no-screenshot",
        "-q",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "InvestigationError" in (out / "report.html").read_text()


@pytest.mark.slow
def test_missing_notebook_is_an_error(tmp_path):
    rec = synthetic.make_run(tmp_path / "recorded")
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    (nbs / "baseline_gate.ipynb").write_text((NB_DIR / "baseline_gate.ipynb").read_text())
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        "params/ci-cpu.yaml",
        "--out",
        str(out),
        "--replay",
        str(rec),
        "--only",
        "cold_warm",
        "--notebooks",
        str(nbs),
        "--no-screenshot",
        "-q",
    )
    assert proc.returncode == 2
    assert "cold_warm.ipynb not found" in (out / "report.html").read_text()


# --------------------------------------------------------------------------- end to end, for real


@pytest.mark.slow
def test_suite_end_to_end_on_reference_engine(tmp_path):
    """``perfkit suite --params params/ci-cpu.yaml`` on the tiny reference engine, for real."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = perfkit("suite", "--params", "params/ci-cpu.yaml", "--out", str(out), "-q", timeout=900)
    wall = time.monotonic() - t0
    run = json.loads((out / "run.json").read_text())
    statuses = {n["name"]: n["status"] for n in run["notebooks"]}
    enabled = {n: "ok" for n in (*load_params(ROOT / "params" / "ci-cpu.yaml").enabled(), verdicts.GATE)}
    assert {n: s for n, s in statuses.items() if s != "skipped"} == enabled, (run, proc.stderr[-3000:])
    rows = verdicts.collect_verdicts(out)
    failed = rows[rows["status"] == "fail"]
    # exit 0 when every gate passed, 1 when one failed (noisy runner): never an error
    assert proc.returncode == (1 if len(failed) else 0), (failed.to_string(), proc.stdout)
    assert wall < 600, f"ci-cpu suite took {wall:.0f} s"
    # outputs
    doc = bl.load_baseline(out / "baseline.json")
    assert "tiny_25f_64x64_4s_w17" in doc["scenarios"]
    assert doc["scenarios"]["tiny_25f_64x64_4s_w17"]["expected_e2e_ms"] > 0
    assert any(c.endswith("_shapes") for c in doc["scenarios"])
    text = (out / "summary.md").read_text()
    assert "### Units of work" not in text  # a plain run has no units table (a merged one: scaleout)
    # exit 0 is PASS, or INCONCLUSIVE with a check over its limit within its run's noise
    assert any(w in text for w in (("REGRESSION",) if proc.returncode else ("PASS", "INCONCLUSIVE"))), text[
        :400
    ]
    for words in (
        "cold request",
        "warm median",
        "warmup 17f → request 25f",
        "cap unlimited",
        "warm_cold_ratio",
        "covered_compiles",
    ):
        assert words in text, words
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 8
    from perfkit.report import external_refs

    assert external_refs(html) == []
    # progress: the kernels reported every launch and request to the suite's bars, drew none
    # into the notebooks; the executed notebooks' tables went through the report's formatter
    from notebook_checks import html_problems, outputs

    events = [
        json.loads(x) for x in (out / "notebooks" / "cold_warm.progress.jsonl").read_text().splitlines()
    ]
    # "launching" first: the suite's bar says what the seconds before the first request wait for
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["launching", "launch", "request"] and kinds[-1] == "launch_done"
    assert sum(e["event"] == "request" for e in events) == events[1]["requests"] >= 2
    for nb in (out / "notebooks").glob("*.ipynb"):
        assert html_problems(nb) == [], nb.name
        assert not any("Warning" in t or "%|" in t for t in outputs(nb, "stream")), nb.name
    for s in ("cold_warm", "warmup_shapes", "memory_budget"):
        b = ResultBundle.load(out / s)
        assert not b.requests.empty
    # the gate launched nothing: every launch belongs to an investigation
    cw = json.loads((out / "cold_warm" / "results.json").read_text())
    assert cw["cold_ms"] > 0 and cw["warm_median_ms"] > 0
    # both cold-start figures: ready (the engine's word) and time to first result (ours)
    cs = cw["cold_start"]
    assert 0 < cs["ready_s"] < cs["first_result_s"]
    assert cs["first_result_s"] == pytest.approx(
        cs["ready_s"] + cs["first_request_wait_s"] + cs["first_request_ms"] / 1000, abs=0.05
    )
    entry = doc["scenarios"]["tiny_25f_64x64_4s_w17"]
    assert entry["expected_first_result_ms"] > entry["expected_load_ms"] > 0
    # what the engine really ran is recorded and gated
    ln = ResultBundle.load(out / "cold_warm").table("launches").iloc[0]
    assert ln["config_source"] == "engine record" and bool(ln["compile_active"])
    assert ln["compile_backend"] == "aot_eager" and ln["attention_backend"] == "native"
    assert "compile_active[session]" in set(rows["metric"]), rows["metric"].tolist()
    cov = json.loads((out / "warmup_shapes" / "results.json").read_text())["coverage"]
    by = {(c["warmup_frames"], c["request_frames"]): c for c in cov}
    assert by[(17, 25)]["covered"] is False and by[(25, 25)]["covered"] is True


@pytest.mark.slow
def test_runs_without_out_never_overwrite_each_other_and_a_regression_exits_1(tmp_path):
    """Two suites without --out (what `make suite` does) give two complete runs under
    outputs/<params name>/<timestamp>/, the first kept intact, and `latest` points at the second.
    The second replays a slow warm request: a regression, exit 1, named in summary.md and the page."""
    recs = [synthetic.make_run(tmp_path / "recorded"), synthetic.make_run(tmp_path / "slow", slow_warm=True)]
    runs = []
    for rec, code in zip(recs, (0, 1)):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "perfkit.cli",
                "suite",
                "--params",
                str(ROOT / "params" / "ci-cpu.yaml"),
                "--replay",
                str(rec),
                "--no-screenshot",
                "-q",
                "--only",
                "cold_warm",  # one investigation + the gate: the run layout is what is tested
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        runs.append(sorted(p for p in (tmp_path / "outputs" / "ci-cpu").iterdir() if not p.is_symlink()))
    first, second = runs[0], runs[1]
    assert len(first) == 1 and len(second) == 2 and first[0] in second
    for run in second:
        for f in ("report.html", "summary.md", "run.json", "baseline.json"):
            assert (run / f).is_file(), (run, f)
    latest = tmp_path / "outputs" / "ci-cpu" / "latest"
    new = [r for r in second if r != first[0]][0]
    assert latest.is_symlink() and latest.resolve() == new.resolve()
    assert json.loads((first[0] / "run.json").read_text())["exit_code"] == 0
    # the regression
    text = (new / "summary.md").read_text()
    assert "REGRESSION" in text and "| warm_cold_ratio |" in text and "| fail |" in text
    assert "REGRESSION" in (new / "report.html").read_text()
    assert json.loads((new / "run.json").read_text())["exit_code"] == 1

"""Issue 34: no input hangs a run, loses its data, or is half-read.

A real stand-in engine (tests/fake_engine.py) writes a 1 MiB stderr line, a NaN stage time and
an undecodable stage name; the launch is measured, assembled and saved as the scenarios do.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.report.render import refused_records, summary_markdown
from perfkit.scenarios.common import assemble, measure_launch

FAKE = str(Path(__file__).with_name("fake_engine.py"))
MIB = 2**20


def _fake(*args: str) -> EngineSpec:
    return EngineSpec(
        kind="command",
        command_template=[
            sys.executable,
            FAKE,
            "--port",
            "{port}",
            "--perf-log-dir",
            "{perf_log_dir}",
            *args,
        ],
        startup_timeout_s=30,
    )


def _no_nan(text: str):
    def refuse(name: str):
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _run(tmp: Path, name: str, *args: str) -> tuple[ResultBundle, float]:
    t0 = time.perf_counter()
    reqs = [VideoRequestSpec(num_frames=9, height=64, width=64, num_inference_steps=2) for _ in range(3)]
    data = measure_launch(_fake(*args), reqs, tmp / name, "L", sample_interval_s=0.5, request_timeout_s=20)
    b = assemble("cold_warm", [data], {}, {"warm_median_ms": float("nan"), "ok": 1.0})
    b.save(tmp / "run" / name)
    return b, time.perf_counter() - t0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    _, plain_s = _run(tmp, "plain")
    bad, bad_s = _run(
        tmp, "bad", "--stderr-line-bytes", str(MIB), "--nan-request", "1", "--bad-utf8-request", "2"
    )
    return tmp, plain_s, bad_s


def test_long_stderr_line_costs_under_10_s_and_is_kept(runs):
    tmp, plain_s, bad_s = runs
    assert bad_s - plain_s < 10, (plain_s, bad_s)
    saved = ResultBundle.load(tmp / "run" / "bad")
    longest = max(len(line) for line in saved.logs["L.stderr.log"].splitlines())
    assert longest == MIB  # kept whole, not cut


def test_refused_records_fail_their_requests_with_file_and_line(runs):
    tmp = runs[0]
    b = ResultBundle.load(tmp / "run" / "bad")
    req = b.requests.sort_values("index")
    measured = req[req["index"] >= 0]
    status = dict(zip(measured["index"], measured["status"]))
    assert status == {0: "completed", 1: "failed", 2: "failed"}
    err = dict(zip(measured["index"], measured["error"]))
    assert "performance.log:3: key 'stages[1].execution_time_ms'" in err[1] and "not a finite" in err[1]
    assert "performance.log:4: key '<utf-8>': invalid UTF-8 at byte" in err[2]
    assert not any("\ufffd" in s for s in b.stages["stage"].astype(str))  # never read with U+FFFD
    assert set(b.stages["request_id"]) == {"warmup-0", "req-0"}
    # summary.md names them (the run directory holds the bundle)
    lines = refused_records(tmp / "run")
    assert len(lines) == 2
    text = summary_markdown(tmp / "run")
    assert "performance.log:3" in text and "performance.log:4" in text


def test_json_outputs_have_no_nan(runs):
    tmp = runs[0]
    d = tmp / "run" / "bad"
    for p in d.glob("*.json"):
        _no_nan(p.read_text())
    res = _no_nan((d / "results.json").read_text())
    meta = _no_nan((d / "meta.json").read_text())
    assert res["warm_median_ms"] is None and res["ok"] == 1.0
    assert "warm_median_ms" in meta["results_null"]


# ---- every input validated: baseline fields, params and -p nesting (exit 2, no traceback) ----

FIXTURE_BASELINE = Path(__file__).parent / "fixtures" / "perf_baselines_5090.json"
RECORD = {
    "request_id": "r1",
    "tag": "pipeline_stage_metrics",
    "stages": [{"name": "DenoisingStage", "execution_time_ms": 20.0}],
    "steps": [10.0, 10.0],
    "total_duration_ms": 25.0,
    "memory_snapshots": {},
}


def _invoke(*args: str):
    from click.testing import CliRunner

    from perfkit.cli import cli

    res = CliRunner().invoke(cli, list(args))
    out = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert res.exception is None or isinstance(res.exception, SystemExit), out
    assert "Traceback" not in out, out
    return res.exit_code, out


@pytest.mark.parametrize("threshold", ['"0.2"', "NaN", "-5", '"abc"', "1.5", "true"])
def test_baseline_threshold_refused_naming_file_and_key(tmp_path, threshold):
    doc = FIXTURE_BASELINE.read_text()
    base = json.loads(doc)
    text = json.dumps(base).replace(
        json.dumps({"improvement_reporting": base["improvement_reporting"]})[1:-1],
        f'"improvement_reporting": {{"threshold": {threshold}}}',
    )
    assert f'"threshold": {threshold}' in text
    bpath = tmp_path / "b.json"
    bpath.write_text(text)
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(RECORD) + "\n")
    code, out = _invoke("compare", "--run", str(log), "--baseline", str(bpath))
    assert code == 2, out
    assert f"{bpath}: improvement_reporting.threshold:" in out


def test_params_nested_20000_levels_exit_2_naming_file(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("engine: " + "[" * 20000 + "]" * 20000 + "\n")
    code, out = _invoke("suite", "--params", str(deep), "--out", str(tmp_path / "out"))
    assert code == 2, out
    assert str(deep) in out and "nested deeper than 64 levels" in out


def test_p_value_nested_20000_levels_exit_2_naming_it(tmp_path):
    nb = Path(__file__).resolve().parents[1] / "notebooks" / "cold_warm.ipynb"
    code, out = _invoke("run", str(nb), "-p", "bundle_dir=" + "[" * 20000 + "]" * 20000)
    assert code == 2, out
    assert "-p bundle_dir:" in out and "nested deeper than 64 levels" in out

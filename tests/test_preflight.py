"""What a new user hits first: replay without bundles, a missing baseline file, a baseline of
other hardware, shapes the reference engine refuses, bad ``-p`` values, a reused ``--out``.

Every check here runs before anything is launched; the suite tests that need papermill replay
synthetic bundles (tests/synthetic.py), so no engine starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit import suite
from perfkit.checks import check_table, overall_status
from perfkit.gate import baseline as bl
from perfkit.gate import run as gate_run
from perfkit.investigations import registry
from perfkit.params import ParamsError, load_params, parse_params

sys.path.insert(0, str(Path(__file__).parent))
import inprocess_cli  # noqa: E402
import synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "params" / "ci-cpu.yaml"
ENG = {"kind": "reference", "preset": "tiny", "warmup_frames": 17}
REQ = {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4}


def perfkit(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(os.environ),
    )


def quick(*args: str) -> subprocess.CompletedProcess:
    """``perfkit ARGS`` in this process (tests/inprocess_cli.py): for help, compare and ``run``
    refusing its -p values before any kernel; ``suite`` (its reaper, its signal handlers) stays
    a subprocess (:func:`perfkit`)."""
    return inprocess_cli.perfkit(*args, cwd=ROOT)


def _params(tmp_path: Path, **sections) -> Path:
    """ci-cpu.yaml with some sections replaced/merged, written under tmp_path."""
    d = yaml.safe_load(CI.read_text())
    for k, v in sections.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


# --------------------------------------------------------------------------- 1. replay


def test_replay_of_missing_dir_is_an_error_before_anything_runs(tmp_path):
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        str(CI),
        "--out",
        str(out),
        "--replay",
        str(tmp_path / "nope"),
        "--no-screenshot",
        "-q",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--replay" in proc.stderr and "no such directory" in proc.stderr
    assert not out.exists()


def test_replay_of_dir_without_bundles_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    (empty / "cold_warm").mkdir(parents=True)  # a folder, but no bundle in it
    with pytest.raises(suite.SuiteError, match="no bundle to replay"):
        suite.run_suite(CI, tmp_path / "run", replay=empty, progress=False, screenshot=False)
    assert not (tmp_path / "run").exists()
    # bundles there, but none of the selected investigations'
    synthetic.warmup_shapes().save(empty / "warmup_shapes")
    with pytest.raises(suite.SuiteError, match="no bundle of cold_warm"):
        suite.run_suite(
            CI, tmp_path / "run", replay=empty, only=["cold_warm"], progress=False, screenshot=False
        )


def test_replay_plan_and_parameters_never_launch(tmp_path):
    rec = tmp_path / "rec"
    synthetic.cold_warm().save(rec / "cold_warm")
    assert suite.replay_plan(rec, ["cold_warm", "warmup_shapes", "memory_budget"]) == [
        "warmup_shapes",
        "memory_budget",
    ]
    p = load_params(CI)
    assert suite.notebook_parameters("cold_warm", p, tmp_path, rec)["bundle_dir"] == str(rec / "cold_warm")
    with pytest.raises(suite.SuiteError, match="no bundle in replay dir"):
        suite.notebook_parameters("warmup_shapes", p, tmp_path, rec)  # would launch otherwise


@pytest.mark.slow
def test_replay_skips_investigations_without_bundle(tmp_path):
    rec = tmp_path / "rec"
    synthetic.cold_warm().save(rec / "cold_warm")
    out = tmp_path / "run"
    proc = perfkit(
        "suite", "--params", str(CI), "--out", str(out), "--replay", str(rec), "--no-screenshot", "-q"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped (no bundle in replay dir)" in proc.stdout
    run = json.loads((out / "run.json").read_text())
    nb = {n["name"]: n for n in run["notebooks"]}
    assert nb["cold_warm"]["status"] == "ok" and nb["baseline_gate"]["status"] == "ok"
    for s in ("warmup_shapes", "memory_budget"):
        assert nb[s]["status"] == "skipped" and nb[s]["reason"] == "no bundle in replay dir"
        assert not (out / s).exists()  # never launched
    assert "skipped (no bundle in replay dir)" in (out / "summary.md").read_text()
    assert "skipped (no bundle in replay dir)" in (out / "report.html").read_text()


# --------------------------------------------------------------------------- 2. baseline.file


def test_missing_baseline_file_is_a_params_error(tmp_path):
    p = _params(tmp_path, baseline={"file": "baselines/nope.json"})
    out = tmp_path / "run"
    proc = perfkit("suite", "--params", str(p), "--out", str(out), "--no-screenshot", "-q")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "baseline.file: baselines/nope.json does not exist" in proc.stderr
    assert not out.exists()


def test_corrupt_baseline_file_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {},\n  "scenarios": {,}}\n')
    p = _params(tmp_path, baseline={"file": str(bad)})
    with pytest.raises(ParamsError, match=r"baseline.file: .*bad.json: invalid JSON at line 2 column"):
        suite.run_suite(p, tmp_path / "run", progress=False, screenshot=False)
    assert not (tmp_path / "run").exists()


def test_baseline_file_checks(tmp_path):
    suite.check_baseline_file(load_params(CI), "ci")  # file: null: invariants only
    h200 = load_params(ROOT / "params" / "h200.yaml")
    suite.check_baseline_file(h200, "h200")  # baselines/h200.json, relative to the checkout
    h200.baseline.profile = "nightly"
    with pytest.raises(ParamsError, match="'nightly' is not a tolerance profile"):
        suite.check_baseline_file(h200, "h200")
    # a file with flat tolerances (sglang's oldest form) has one set for every profile
    flat = json.loads((ROOT / "baselines" / "h200.json").read_text())
    flat["tolerances"] = {"e2e": 0.25, "stage": 0.3, "denoise_step": 0.1, "denoise_agg": 0.1}
    h200.baseline.file = str(tmp_path / "flat.json")
    Path(h200.baseline.file).write_text(json.dumps(flat))
    suite.check_baseline_file(h200, "h200")


# --------------------------------------------------------------------------- 3. other hardware


@pytest.fixture()
def gated_run(tmp_path) -> Path:
    run = synthetic.make_run(tmp_path / "run")
    gate_run.gate(run, engine=ENG, request=REQ, hardware="ci-cpu-2core")
    return run


def test_compare_with_no_common_case_is_an_error(gated_run):
    # nothing comparable at all is misuse (2), not a regression (1) and never a pass
    proc = quick("compare", "--run", str(gated_run), "--baseline", "baselines/h200.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    msg = (
        "no case of this run is in baselines/h200.json (hardware 'NVIDIA H200' vs this run's "
        "'ci-cpu-2core'): nothing compared"
    )
    assert msg in proc.stdout and "compare: ERROR: nothing compared" in proc.stdout
    assert "error" in proc.stderr and "'NVIDIA H200'" in proc.stderr and "'ci-cpu-2core'" in proc.stderr


def test_compare_other_hardware_with_common_cases_warns(gated_run, tmp_path):
    doc = bl.load_baseline(gated_run / "baseline.json")
    doc["metadata"]["hardware"] = "NVIDIA H200"
    other = tmp_path / "other.json"
    bl.save_baseline(doc, other)
    proc = quick("compare", "--run", str(gated_run), "--baseline", str(other))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'NVIDIA H200'" in proc.stderr and "'ci-cpu-2core'" in proc.stderr
    assert "only comparable on the same hardware" in proc.stderr


def test_gate_against_other_hardware_is_not_a_pass(gated_run):
    g = gate_run.gate(
        gated_run, engine=ENG, request=REQ, hardware="ci-cpu-2core", baseline_file="baselines/h200.json"
    )
    fails = [r for r in g.baseline_rows if r.status == "fail"]
    assert fails and "nothing compared" in fails[0].reason
    assert "'NVIDIA H200'" in fails[0].reason and "'ci-cpu-2core'" in fails[0].reason
    assert g.warnings
    assert overall_status(check_table(g.rows)) == "fail"


# --------------------------------------------------------------------------- 4. up-front checks


def _err(d: dict) -> str:
    text = yaml.safe_dump(d, sort_keys=False)
    with pytest.raises(ParamsError) as ei:
        parse_params(yaml.safe_load(text), "p.yaml", text)
    return str(ei.value)


def test_reference_engine_pixel_rule():
    msg = _err({"name": "x", "request": {"height": 65, "width": 96}})
    assert "p.yaml: request.height: must be a multiple of 32 for the reference engine, got 65" in msg
    assert "width" not in msg
    assert "engine.width: must be a multiple of 32" in _err({"name": "x", "engine": {"width": 100}})
    # other engines have their own rules
    parse_params({"name": "x", "engine": {"kind": "sglang", "model_path": "/m"}, "request": {"height": 65}})


def test_reference_engine_preset_must_be_known():
    msg = _err({"name": "x", "engine": {"preset": "ltx-13b"}})
    assert (
        "engine.preset: 'ltx-13b' is not a preset of the reference engine" in msg
        and "known: tiny, ltx-2b" in msg
    )
    parse_params({"name": "x", "engine": {"preset": "mine", "model_path": "/models/mine"}})


def test_frame_counts():
    parse_params(
        {"name": "x", "engine": {"warmup_frames": 0}, "warmup_shapes": {"warmup_frames": [0, 17]}}
    )  # no warmup is allowed
    assert "warmup_shapes.request_frames" in _err({"name": "x", "warmup_shapes": {"request_frames": [0]}})
    assert "request.num_frames" in _err({"name": "x", "request": {"num_frames": 0}})
    msg = _err({"name": "x", "request": {"num_frames": 300}})
    assert "request.num_frames: must be <= 257 (the reference engine's max_frames), got 300" in msg


def test_bad_shape_fails_before_launch_via_cli(tmp_path):
    p = _params(tmp_path, request={"height": 65})
    out = tmp_path / "run"
    proc = perfkit("suite", "--params", str(p), "--out", str(out), "--no-screenshot", "-q")
    assert proc.returncode == 2
    assert "request.height: must be a multiple of 32 for the reference engine, got 65" in proc.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- 5. all rejected


def test_warmup_shapes_with_nothing_measured_is_an_error():
    b = synthetic.warmup_shapes()
    for c in b.results["coverage"]:
        c.update(first_ms=None, warm_median_ms=None, covered=None, ratio=None, error=None)
    req = b.requests.copy()
    req.loc[req["index"] >= 0, "status"] = "rejected"
    req["error"] = req["error"].astype(object)
    req.loc[req["index"] >= 0, "error"] = "num_frames: must be between 1 and 257, got 300"
    b.tables["requests"] = req
    with pytest.raises(registry.InvestigationError, match="no request shape was measured.*must be between"):
        registry.get("warmup_shapes").check_bundle(b)
    registry.get("warmup_shapes").check_bundle(synthetic.warmup_shapes())


def test_cold_warm_error_carries_the_request_error(monkeypatch, tmp_path):
    from perfkit.engine.client import RequestOutcome, VideoRequestSpec
    from perfkit.engine.spec import EngineSpec
    from perfkit.investigations import cold_warm as cw
    from perfkit.measuring.launch_rows import LaunchData, failed_row

    def fake_measure(spec, requests, run_dir, label, **kw):
        d = LaunchData(label=label, launch_row={"launch": label, "ready_s": 1.0})
        for i, r in enumerate(requests):
            o = RequestOutcome(
                "", "rejected", 0.0, 0.003, 400, error="height: must be a positive multiple of 32, got 65"
            )
            d.outcomes.append(o)
            d.requests.append(failed_row(label, i, o, r))
        return d

    monkeypatch.setattr(cw, "measure_launch", fake_measure)
    b = cw.cold_vs_warm(EngineSpec(), VideoRequestSpec(height=65), repeats=3, run_dir=tmp_path)
    err = b.results["error"]
    assert "0 of 3 requests completed" in err and "HTTP 400" in err and "got 65" in err
    with pytest.raises(registry.InvestigationError, match="HTTP 400"):
        registry.get("cold_warm").check_bundle(b)


# --------------------------------------------------------------------------- 6. perfkit run


@pytest.mark.parametrize(
    "p, expected",
    [
        ("repeats", "-p expects KEY=VALUE, got 'repeats'"),
        ("caps=[{host_gib: 8}", "-p caps: value '[{host_gib: 8}' is not valid YAML"),
        ("repeat=3", "unknown parameter 'repeat' (did you mean 'repeats'?); known: engine, request"),
    ],
)
def test_run_bad_p_is_a_usage_error(tmp_path, p, expected):  # noqa: D103
    run_dir = tmp_path / "r"
    proc = quick("run", "notebooks/cold_warm.ipynb", "-p", f"run_dir={run_dir}", "-p", p)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert not run_dir.exists()


def test_failed_run_leaves_no_empty_run_dir(monkeypatch, tmp_path):
    from perfkit import cli

    def fails(nb, out, params, *args, **kw):  # the kernel never started: nothing was written
        Path(out).parent.mkdir(parents=True, exist_ok=True)  # as execute_owned does
        return suite.NotebookRun(
            Path(nb).stem, status="error", wall_s=0.1, error="NoSuchKernel: python3", ename="NoSuchKernel"
        )

    monkeypatch.setattr(suite, "execute_owned", fails)
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["run", str(ROOT / "notebooks" / "cold_warm.ipynb"), "-p", "repeats=3"])
    assert rc == 2
    assert not (tmp_path / "outputs").exists()


# --------------------------------------------------------------------------- 7. --out reuse


def test_out_holding_another_run_is_refused(tmp_path):
    rec = synthetic.make_run(tmp_path / "rec")
    out = synthetic.make_run(tmp_path / "old")  # an earlier run: three bundles
    proc = perfkit(
        "suite",
        "--params",
        str(CI),
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
    assert "already holds another run" in proc.stderr and "--force" in proc.stderr
    assert (out / "warmup_shapes" / "meta.json").exists()  # untouched
    with pytest.raises(suite.SuiteError, match="same directory"):
        suite.prepare_run_dir(rec, force=True, replay_dir=rec)


def test_force_removes_the_earlier_run(tmp_path):
    out = synthetic.make_run(tmp_path / "old")
    (out / "run.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    suite.prepare_run_dir(out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    suite.prepare_run_dir(tmp_path / "new")  # a fresh directory is fine
    suite.prepare_run_dir(out)  # so is one without a run


# --------------------------------------------------------------------------- 8. help


def test_help_is_plain_text():
    proc = quick("--help")
    assert proc.returncode == 0
    assert "``" not in proc.stdout and "perfkit:" in proc.stdout and "Exit codes" in proc.stdout


@pytest.mark.parametrize(
    "nb, p, name",
    [
        ("warmup_shapes", "warmup_frames=abc", "warmup_frames"),
        ("warmup_shapes", "warmup_frames=[17, abc]", "warmup_frames[1]"),
        ("cold_warm", "repeats=1e1", "repeats"),  # 10.0 is not an integer: refused, naming it
        ("cold_warm", "repeats=1", "repeats"),  # below the model's minimum (2)
        ("memory_budget", "caps=[{host_gib: -1}]", "caps[0].host_gib"),
        ("cold_warm", "request={num_frames: x}", "request.num_frames"),
        ("cold_warm", "request={num_frames: 1000}", "request.num_frames"),  # > the engine's max
        ("cold_warm", "engine={preset: nosuch}", "engine.preset"),  # refused before the engine starts
        ("cold_warm", "engine={compile_backend: nosuch}", "engine.compile_backend"),
        ("cold_warm", "bundle_dir=/nonexistent", "bundle_dir"),
    ],
)
def test_run_p_values_are_validated_before_any_kernel(tmp_path, nb, p, name):
    run_dir = tmp_path / "r"
    proc = quick("run", f"notebooks/{nb}.ipynb", "-p", f"run_dir={run_dir}", "-p", p)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"\n{name}: " in proc.stderr, proc.stderr
    assert not run_dir.exists()  # no kernel started, no executed notebook written


def test_replay_with_params_of_another_engine_is_refused(tmp_path):
    """H200 ltx-2b bundles replayed with the tiny CPU params would be filed under the tiny case
    ids and the CPU hardware label: refused, naming what differs."""
    out = tmp_path / "run"
    proc = perfkit(
        "suite",
        "--params",
        str(CI),
        "--out",
        str(out),
        "--replay",
        str(ROOT / "examples" / "h200" / "bundles"),
        "--no-screenshot",
        "-q",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the cold_warm bundle: engine.preset: given 'tiny', measured with 'ltx-2b'" in proc.stderr
    assert f"('given' is {CI})" in proc.stderr
    assert not out.exists()

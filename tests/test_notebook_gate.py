"""Notebooks that papermill alone can gate on, with parameters papermill understands, and
JupyterLab on copies outside the tracked tree (issue 40, items 1, 2 and 4).

Real ``papermill`` command lines on the committed H200 bundles (replays: nothing launched);
real ``perfkit lab`` with nbclient; ``git status`` of this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from perfkit import nbparams
from perfkit.gate import verdicts
from perfkit.gate.verdicts import read_verdict
from perfkit.measuring import progress
from perfkit.params import ParamsError

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks"
H200 = ROOT / "examples" / "h200"
#: a committed bundle of each investigation (the H200 runs)
BUNDLES = {
    "cold_warm": H200 / "bundles" / "cold_warm",
    "warmup_shapes": H200 / "bundles" / "warmup_shapes",
    "memory_budget": H200 / "bundles" / "memory_budget",
    "offload_modes": H200 / "bundles-memory" / "offload_modes",
    "overhead": H200 / "bundles-overhead" / "overhead",
}
BIN = Path(sys.executable).parent


def papermill(nb: str, out: Path, *params: str) -> subprocess.CompletedProcess:
    """Plain ``papermill NB OUT -p ...`` (no perfkit in between), run in ``out``'s folder."""
    return subprocess.run(
        [str(BIN / "papermill"), str(NB / f"{nb}.ipynb"), str(out), "--no-progress-bar", *params],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out.parent,
    )


def code_cells(path: Path) -> list:
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def errors(path: Path) -> list[dict]:
    return [o for c in code_cells(path) for o in c.get("outputs", []) if o.get("output_type") == "error"]


def images(path: Path) -> int:
    return sum("image/png" in (o.get("data") or {}) for c in code_cells(path) for o in c.get("outputs", []))


# ------------------------------------------------------------------ 1. papermill exits by the gate
@pytest.fixture(scope="module")
def pass_fail(tmp_path_factory):
    """The H200 cold_warm bundle through plain papermill twice: with the default limits and a
    JSON engine dict from -p (passes), and with a latency drift limit of 0.05 from -p as YAML
    (its drift is 0.091: fails)."""
    tmp = tmp_path_factory.mktemp("pm")
    bundle = str(BUNDLES["cold_warm"])
    runs = {}
    for word, extra in (
        # the engine the bundle was measured with (another one is refused: what was measured)
        ("pass", ["-p", "engine", '{"kind": "reference", "preset": "ltx-2b"}']),
        ("fail", ["-p", "invariants", "{latency_drift_max: 0.05}"]),
    ):
        out = tmp / f"{word}.ipynb"
        proc = papermill(
            "cold_warm", out, "-p", "bundle_dir", bundle, "-p", "run_dir", str(tmp / word), *extra
        )
        runs[word] = (proc, out, tmp / word / "cold_warm")
    return runs


@pytest.mark.slow
def test_papermill_exits_0_on_a_passing_gate(pass_fail):
    proc, out, run = pass_fail["pass"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_verdict(run)["status"] == "pass"
    assert errors(out) == []
    last = code_cells(out)[-1]
    assert "finish(" in last.source
    assert any("cold_warm gate: pass" in str(o.get("data", {})) for o in last.outputs)
    assert not [o for o in last.outputs if o.get("output_type") == "execute_result"]  # no raw 'pass'


@pytest.mark.slow
def test_papermill_exits_1_on_a_failing_gate_and_keeps_every_output(pass_fail):
    proc, out, run = pass_fail["fail"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (
        "GateFailed: cold_warm gate: fail: 4 checks: 1 failed, 3 passed; failed: latency_drift (0.091 > 0.05)"
        in proc.stderr
    )
    doc = read_verdict(run)
    assert doc["status"] == "fail"
    # the exception is the last cell's, after every output: the same figures as the passing run
    (err,) = errors(out)
    assert err["ename"] == verdicts.GATE_FAILED
    assert "finish(" in code_cells(out)[-1].source and code_cells(out)[-1].outputs[-1] == err
    assert images(out) == images(pass_fail["pass"][1]) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["warmup_shapes", "memory_budget"])
def test_papermill_exit_code_is_the_gate_of_every_investigation(tmp_path, name):
    """The other per-commit investigation notebooks, their committed bundles replayed by plain
    papermill: exit 1 exactly when the verdict.json fails or judges nothing, else 0
    (warmup_shapes also takes its list parameter as JSON from -p). The last cell is the same
    generated code in every investigation notebook; the suite's replays run it in the others."""
    out = tmp_path / f"{name}.ipynb"
    extra = ["-p", "warmup_frames", "[17, 25]"] if name == "warmup_shapes" else []
    proc = papermill(
        name, out, "-p", "bundle_dir", str(BUNDLES[name]), "-p", "run_dir", str(tmp_path), *extra
    )
    doc = read_verdict(tmp_path / name)
    assert doc is not None, proc.stderr[-3000:]
    want = 0 if verdicts.gate_result("ok", doc) == "pass" else 1
    assert proc.returncode == want, (doc["status"], proc.stderr[-3000:])
    if want:
        assert [e["ename"] for e in errors(out)] == [verdicts.GATE_FAILED]
    else:
        assert errors(out) == []


# ------------------------------------------------------------------ 2. parameters papermill understands
@pytest.mark.slow
def test_bad_parameters_stop_the_notebook_before_anything_runs(tmp_path):
    """A dict with a misspelt request field, a list with a bad item, a bad value and an unknown
    name, all from -p: the cell after the parameters names every one, nothing is replayed or
    launched, papermill exits 1."""
    out = tmp_path / "bad.ipynb"
    t0 = time.monotonic()
    proc = papermill(
        "warmup_shapes",
        out,
        "-p", "bundle_dir", str(BUNDLES["warmup_shapes"]),
        "-p", "run_dir", str(tmp_path / "run"),
        "-p", "request", '{"num_frame": 25}',
        "-p", "warmup_frames", "[17, many]",
        "-p", "repeats", "three",
        "-p", "repeat", "3",
        "-p", "engine", "{kind: reference, preset: tinyy}",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Passed unknown parameter: repeat" in proc.stderr  # papermill itself only warns
    (err,) = errors(out)
    assert err["ename"] == "NotebookParamsError"
    text = err["evalue"]
    for line in (
        "unknown parameter 'repeat' (did you mean 'repeats'?); known: engine, request, warmup_frames",
        "request.num_frame: unknown field (did you mean 'num_frames'?)",
        "warmup_frames[1]: Input should be a valid integer, got 'many'",
        "repeats: Input should be a valid integer, got 'three'",
        "engine.preset: 'tinyy' is not a preset of the reference engine",
    ):
        assert line in text, text
    # it stopped in the cell after the parameters: nothing replayed, no verdict, no bundle
    cells = code_cells(out)
    assert "bind(" in cells[2].source and cells[2].outputs[-1] == err
    assert not (tmp_path / "run").exists()
    assert time.monotonic() - t0 < 60


def test_help_notebook_shows_types_and_help():
    proc = subprocess.run(
        [str(BIN / "papermill"), "--help-notebook", str(NB / "cold_warm.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Unknown type" not in proc.stdout
    for line in (
        "engine: dict",
        "request: dict",
        "repeats: int (default 5)",
        "caps: Optional[dict]",
        "fail_on: str",
    ):
        assert line in proc.stdout, proc.stdout
    assert "gate: the last cell raises when the gate fails" in proc.stdout


@pytest.mark.parametrize("nb", sorted(p.stem for p in NB.glob("*.ipynb")))
def test_every_notebook_parameter_has_a_type_papermill_reads(nb):
    from papermill.inspection import inspect_notebook

    found = inspect_notebook(str(NB / f"{nb}.ipynb"))
    assert list(found) == [p.name for p in nbparams.declared(nb)]
    untyped = [k for k, p in found.items() if p["inferred_type_name"] in ("None", "object")]
    assert untyped == [], untyped
    assert all(p["help"] for p in found.values()), found


def test_strings_from_p_are_read_as_json_or_yaml():
    got = nbparams.coerce(
        "warmup_shapes",
        {
            "engine": '{"kind": "reference", "preset": "tiny"}',
            "warmup_frames": "[17, 25]",
            "invariants": "{covered_compiles_max: 0}",
            "repeats": 3,
            "run_dir": "123",  # a str parameter keeps its string
        },
    )
    assert got == {
        "engine": {"kind": "reference", "preset": "tiny"},
        "warmup_frames": [17, 25],
        "invariants": {"covered_compiles_max": 0},
        "repeats": 3,
        "run_dir": "123",
    }
    with pytest.raises(ParamsError, match=r"caps: '\[\{host_gib: 8\}' is not valid JSON or YAML"):
        nbparams.coerce("memory_budget", {"caps": "[{host_gib: 8}"})
    assert nbparams.coerce("memory_budget", {"caps": "[{label: small, host_gib: 8}]"})["caps"] == [
        {"label": "small", "host_gib": 8}
    ]


def test_unknown_names_come_from_the_injected_cell_only():
    history = [
        "",
        "engine: dict = {}\nrepeats: int = 5",  # the parameters cell itself
        '# Parameters\nrepeat = 3\nbundle_dir = "x"\nfail_on = "never"\n',  # what papermill injects
        "import pandas as pd",  # a later cell re-run in JupyterLab
    ]
    assert nbparams.injected_names(history) == ["repeat", "bundle_dir", "fail_on"]
    (line,) = nbparams.unknown_names("cold_warm", nbparams.injected_names(history))
    assert line.startswith("unknown parameter 'repeat' (did you mean 'repeats'?); known: engine, request")


def test_bind_validates_every_value_and_returns_them_typed(tmp_path):
    ns = {p.name: p.default for p in nbparams.declared("cold_warm")}
    ns["In"] = ["", "# Parameters\nrepeats = '3'\n"]
    ns["repeats"] = "3"  # papermill's -p repeats '3' would give an int; a str is read as YAML
    got = nbparams.bind("cold_warm", ns)
    assert got["repeats"] == 3 and got["fail_on"] == "gate"
    assert got["engine"]["preset"] == "tiny" and got["request"]["num_frames"] == 25
    ns["bundle_dir"] = str(tmp_path)
    with pytest.raises(nbparams.NotebookParamsError, match="bundle_dir: .* is not a result bundle"):
        nbparams.bind("cold_warm", ns)
    # an engine spec the suite filled in from a params file's cell timeout (1800 s): papermill's
    # cell timeout is no notebook parameter, so the timeout order is not judged here
    eng = {"kind": "reference", "preset": "tiny", "request_timeout_s": 1800.0}
    assert nbparams.validate("cold_warm", {"engine": eng})["engine"]["request_timeout_s"] == 1800.0
    # rules across parameters, as for a params file (what the engine would refuse after its launch)
    ns.update(bundle_dir=None, request={"num_frames": 25, "height": 65})
    with pytest.raises(nbparams.NotebookParamsError, match="request.height: must be a multiple of 32"):
        nbparams.bind("cold_warm", ns)


def test_a_replay_bundle_of_another_investigation_or_engine_is_refused_in_bind():
    """Found by the breaker: a cold_warm bundle given to the warmup_shapes notebook failed in a
    later cell, and an engine or request contradicting the bundle passed unremarked."""
    bundle = str(H200 / "bundles" / "cold_warm")
    ns = {p.name: p.default for p in nbparams.declared("warmup_shapes")}
    ns.update(In=["", "# Parameters\nbundle_dir = 'x'\n"], bundle_dir=bundle)
    with pytest.raises(
        nbparams.NotebookParamsError, match="holds a 'cold_warm' bundle, expected 'warmup_shapes'"
    ):
        nbparams.bind("warmup_shapes", ns)
    ns = {p.name: p.default for p in nbparams.declared("cold_warm")}
    ns["bundle_dir"] = bundle
    # not injected: the notebook's default engine (tiny) is not compared with the bundle (ltx-2b)
    ns["In"] = ["", "# Parameters\nbundle_dir = 'x'\n"]
    assert nbparams.bind("cold_warm", ns)["bundle_dir"] == bundle
    # injected and contradicting the bundle: named, before anything is replayed
    ns["In"] = ["", "# Parameters\nbundle_dir = 'x'\nengine = {}\nrequest = {}\n"]
    ns["request"] = {"num_frames": 9, "height": 32, "width": 32}
    with pytest.raises(nbparams.NotebookParamsError) as exc:
        nbparams.bind("cold_warm", ns)
    assert "engine.preset: given 'tiny', measured with 'ltx-2b'" in str(exc.value)
    assert "request.height: given 32, measured with 512" in str(exc.value)


def test_gate_outcome_words_and_the_last_cell():
    fail = {
        "status": "fail",
        "rows": [{"metric": "latency_drift", "status": "fail", "reason": "0.091 > 0.05"}],
    }
    ok = {"status": "pass", "rows": [{"metric": "latency_drift", "status": "pass"}]}
    none = {"status": "skipped", "rows": [{"metric": "x", "status": "skipped"}]}
    assert [verdicts.gate_result("ok", v) for v in (ok, fail, none, None)] == [
        "pass",
        "fail",
        "not gated",
        "not gated",
    ]
    assert verdicts.gate_result("error", ok) == "error"
    assert verdicts.gate_result("ok", None, verdicts.GATE_FAILED) == "fail"
    assert [verdicts.exit_code(w, v) for w, v in (("pass", ok), ("fail", fail), ("not gated", none))] == [
        0,
        1,
        2,
    ]
    assert verdicts.exit_code("not gated", None) == 0  # a notebook without a gate (history)
    assert verdicts.finish("x", ok) == "pass"
    assert verdicts.finish("x", fail, "never") == "fail"
    with pytest.raises(
        verdicts.GateFailed, match=r"x gate: fail: 1 check: 1 failed; failed: latency_drift \(0.091"
    ):
        verdicts.finish("x", fail)
    with pytest.raises(
        verdicts.GateFailed, match=r"not gated: \d+ checks?: \d+ skipped \(nothing measured\)"
    ):
        verdicts.finish("x", none)
    with pytest.raises(ValueError, match="fail_on: must be one of 'gate', 'never', got 'sometimes'"):
        verdicts.finish("x", ok, "sometimes")


@pytest.mark.slow
def test_perfkit_run_prints_the_gate_result(tmp_path):
    """``perfkit run`` with fail_on=gate: the notebook raises GateFailed at its end, which is
    the gate's failure (exit 1, the gate's sentence printed), not a notebook error."""
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "run", "notebooks/cold_warm.ipynb",
         "-p", f"bundle_dir={BUNDLES['cold_warm']}", "-p", f"run_dir={tmp_path}",
         "-p", "invariants={latency_drift_max: 0.05}", "-p", "fail_on=gate"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "cold_warm.ipynb: gate fail in" in proc.stdout
    assert (
        "cold_warm gate: fail: 4 checks: 1 failed, 3 passed; failed: latency_drift (0.091 > 0.05)"
        in proc.stdout
    )
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ 4. JupyterLab outside the tracked tree
def _git_status() -> str:
    """``git status`` without the nbstripout filter: a notebook the lab wrote into shows as
    changed (the filter would hide its outputs), and no filter process runs per notebook (in a
    fresh clone every entry is racily clean: 10 s a status)."""
    nofilter = ["-c", "filter.nbstripout.clean=cat", "-c", "filter.nbstripout.required=false"]
    return subprocess.run(
        ["git", *nofilter, "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_lab_replay_leaves_the_clone_clean(tmp_path):
    before = _git_status()
    lab = ROOT / "outputs" / f"lab-test-{tmp_path.name}"  # inside the clone, git-ignored
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "perfkit.cli", "lab", "--replay", str(H200 / "bundles"),
             "--only", "cold_warm", "--dir", str(lab), "--no-launch"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        assert f"--notebook-dir={lab}" in proc.stdout
        nb_path = lab / "cold_warm.ipynb"
        nb = nbformat.read(str(nb_path), as_version=4)
        # bound to the bundle by an injected cell, run once: outputs and the kernel's
        # language_info saved, nothing raised, no widget (a frozen bar) among the outputs
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert len(injected) == 1 and str(BUNDLES["cold_warm"]) in injected[0].source
        assert "fail_on = 'never'" in injected[0].source or 'fail_on = "never"' in injected[0].source
        assert nb.metadata["language_info"].get("version"), nb.metadata["language_info"]
        assert errors(nb_path) == [] and images(nb_path) >= 4
        mimes = {m for c in code_cells(nb_path) for o in c.get("outputs", []) for m in (o.get("data") or {})}
        assert "application/vnd.jupyter.widget-view+json" not in mimes
        assert read_verdict(lab / "run" / "cold_warm")["status"] == "pass"
        # what JupyterLab writes next to it, and a checkpoint beside the tracked notebooks
        (lab / ".ipynb_checkpoints").mkdir()
        (lab / ".ipynb_checkpoints" / "cold_warm-checkpoint.ipynb").write_text(nb_path.read_text())
        assert _git_status() == before
        ignored = subprocess.run(
            [
                "git",
                "check-ignore",
                "-q",
                "--no-index",
                "notebooks/.ipynb_checkpoints/cold_warm-checkpoint.ipynb",
            ],
            cwd=ROOT,
        )
        assert ignored.returncode == 0
        # a lab directory git would track is refused before anything is written
        bad = subprocess.run(
            [sys.executable, "-m", "perfkit.cli", "lab", "--replay", str(H200 / "bundles"),
             "--dir", "notebooks/lab", "--no-launch"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert bad.returncode == 2 and "inside the git work tree" in bad.stderr
        assert not (ROOT / "notebooks" / "lab").exists()
    finally:
        shutil.rmtree(lab, ignore_errors=True)
    assert _git_status() == before


def test_progress_in_a_kernel_is_text_lines_saying_what_it_waits_for(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.setattr(progress, "in_kernel", lambda: True)
    progress.launching("session")
    assert list(progress.track_requests(["a", "b"], "session")) == ["a", "b"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "session: launching the engine … (the first request is sent once it serves)"
    assert lines[1:3] == ["session: request 1/2 sent (the cold one)", "session: request 2/2 sent"]
    assert lines[3].startswith("session: 2 of 2 requests done in ")
    # under the suite (an events file) the notebook gets nothing: the suite's bars say it
    events = tmp_path / "p.jsonl"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(events))
    progress.launching("warmup17")
    assert capsys.readouterr().out == ""
    (ev,), _ = progress.read_events(events)
    assert ev["event"] == "launching" and ev["label"] == "warmup17"
    with open(os.devnull, "w") as sink:
        bars = progress.RunBars(sink, 2, 4)
        with bars.listen("probe", planned=0):
            bars.handle(ev)
            assert "launch 1: launching the engine" in bars.overall.postfix
        # a launch that sent no request leaves no "launching …" once its block ends
        assert bars.overall.postfix.endswith("launch 0/~2"), bars.overall.postfix
        bars.close()


def test_lab_on_a_run_opens_it_in_place_or_copies_tracked_notebooks(tmp_path, monkeypatch):
    from perfkit import lab

    run = tmp_path / "run" / "notebooks"
    run.mkdir(parents=True)
    shutil.copy(NB / "cold_warm.ipynb", run / "cold_warm.ipynb")
    opened = lab.prepare_run(tmp_path / "run")  # outside any git work tree: in place
    assert opened.dir == run.resolve() and [p.name for p in opened.notebooks] == ["cold_warm.ipynb"]
    cmd = lab.lab_command(opened, browser=False)
    assert cmd[3] == f"--notebook-dir={run.resolve()}" and cmd[-1] == "--no-browser"
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)  # JupyterLab refuses root without it
    if shutil.which("git") and (ROOT / ".git").exists():
        # a folder git tracks (here the checkout's notebooks/) is copied, never opened in place
        monkeypatch.chdir(tmp_path)
        copied = lab.prepare_run(ROOT)
        assert copied.dir.is_relative_to(tmp_path.resolve() / "outputs" / "lab")
        assert sorted(p.name for p in copied.notebooks) == sorted(p.name for p in NB.glob("*.ipynb"))
    with pytest.raises(lab.LabError, match="no executed notebooks"):
        lab.prepare_run(tmp_path)

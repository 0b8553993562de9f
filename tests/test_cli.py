"""The `perfkit` command: run, report, compare, baseline update, engine serve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from perfkit.cli import cli
from perfkit.gate import baseline as bl
from perfkit.gate import run as gate_run
from perfkit.lab import parse_kv as _parse_kv

sys.path.insert(0, str(Path(__file__).parent))
import inprocess_cli  # noqa: E402
import synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def perfkit(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def quick(*args: str) -> subprocess.CompletedProcess:
    """``perfkit ARGS`` in this process (tests/inprocess_cli.py): for the commands that launch
    nothing (help, option errors, compare, baseline update); the entry point itself, ``run``,
    ``report`` and ``engine serve`` stay subprocesses (:func:`perfkit`)."""
    return inprocess_cli.perfkit(*args, cwd=ROOT)


def test_entry_point_declared_and_help():
    assert shutil.which("perfkit") or True  # console script present in an installed venv
    proc = perfkit("--help")
    assert proc.returncode == 0
    for sub in ("suite", "run", "report", "compare", "baseline", "engine"):
        assert sub in proc.stdout


def test_parse_kv_yaml_values():
    assert _parse_kv(
        ["repeats=3", "bundle_dir=null", "caps=[{host_gib: 8}]", "name=a=b", "t=1e3", "f=5e-1"]
    ) == {
        "repeats": 3,
        "bundle_dir": None,
        "caps": [{"host_gib": 8}],
        "name": "a=b",
        "t": 1000.0,  # YAML 1.1 reads 1e3 as a string; perfkit reads numbers as numbers
        "f": 0.5,
    }


def test_suite_requires_params():
    proc = quick("suite")
    assert proc.returncode == 2 and "--params" in proc.stderr


def _walk(cmd: click.Command, path: tuple[str, ...] = ()):
    """Every command under ``cmd``, through click's public API (the top group loads each
    command's module when asked: ``perfkit.cli.COMMANDS``)."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from _walk(cmd.get_command(ctx, name), (*path, name))


def test_every_command_and_option_has_help():
    seen = []
    for path, cmd in _walk(cli):
        seen.append(" ".join(path))
        assert (cmd.help or "").strip(), f"perfkit {' '.join(path)}: no help text"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert (param.help or "").strip(), f"perfkit {' '.join(path)} {param.opts[0]}: no help"
    for want in (
        "suite",
        "run",
        "report",
        "compare",
        "baseline update",
        "measure",
        "wheelhouse download",
        "wheelhouse install",
        "engine serve",
        "ab",
        "history add",
        "history import",
        "history check",
        "history site",
        "history confirm",
        "bisect",
    ):
        assert want in seen, seen


@pytest.mark.parametrize(
    "sub",
    [
        ["suite"],
        ["run"],
        ["compare"],
        ["baseline", "update"],
        ["measure"],
        ["report"],
        ["wheelhouse", "download"],
        ["ab"],
        ["history", "add"],
        ["history", "import"],
        ["history", "check"],
        ["history", "site"],
        ["history", "confirm"],
        ["bisect"],
    ],
)
def test_help_of_every_command_lists_exit_codes(sub):
    proc = quick(*sub, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Exit codes" in proc.stdout or "exit codes" in proc.stdout.lower(), proc.stdout


def test_suite_help_lists_every_investigation_in_run_order():
    from perfkit.investigations import registry

    text = quick("suite", "--help").stdout.split("Investigations (", 1)[1]
    lines = [
        next(ln for ln in text.splitlines() if ln.split()[:1] == [s.name])
        for s in registry.all_investigations()
    ]
    assert [ln.split()[0] for ln in lines] == [
        "cold_warm",
        "warmup_shapes",
        "memory_budget",
        "offload_modes",
        "load",
        "overhead",
    ]
    assert "Cold vs warm: Does the warm request" in lines[0] and "[off by default]" not in lines[0]
    assert lines[4].endswith("[off by default]")  # load: its params section is off unless enabled


def test_missing_params_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    for cmd in (
        ["suite", "--params", str(missing)],
        ["measure", "--params", str(missing), "--out", str(tmp_path)],
    ):
        proc = quick(*cmd)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"params file not found: {missing}" in proc.stderr, proc.stderr
        # a path that exists but is no regular file is not called missing (found by the breaker)
        proc = quick(*[("/dev/null" if a == str(missing) else a) for a in cmd])
        assert proc.returncode == 2 and "params file is not a regular file: /dev/null" in proc.stderr, (
            proc.stderr
        )


def test_engine_options_all_have_help():
    import argparse

    from perfkit.refengine.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        assert (action.help or "").strip(), f"perfkit engine serve {action.option_strings}: no help"
    assert parser.prog == "perfkit engine serve" and "Exit codes" in (parser.epilog or "")


def test_engine_serve_forwards_to_refengine():
    proc = perfkit("engine", "serve", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--preset" in proc.stdout and "perfkit" in proc.stdout.lower()


@pytest.fixture()
def gated_run(tmp_path) -> Path:

    run = synthetic.make_run(tmp_path / "run")
    gate_run.gate(
        run,
        engine={"preset": "tiny", "warmup_frames": 17},
        request={"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4},
    )
    return run


def test_compare_pass_and_regression(gated_run, tmp_path):
    same = quick("compare", "--run", str(gated_run), "--baseline", str(gated_run / "baseline.json"))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "compare: PASS" in same.stdout
    doc = bl.load_baseline(gated_run / "baseline.json")
    for entry in doc["scenarios"].values():
        entry["expected_e2e_ms"] = entry["expected_e2e_ms"] / 3  # the run is now 3x slower
    faster = tmp_path / "faster.json"
    bl.save_baseline(doc, faster)
    reg = quick("compare", "--run", str(gated_run), "--baseline", str(faster))
    assert reg.returncode == 1
    assert "expected_e2e_ms" in reg.stdout and "fail" in reg.stdout


def test_compare_bad_baseline_is_error(gated_run, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = quick("compare", "--run", str(gated_run), "--baseline", str(bad))
    assert proc.returncode == 2 and "invalid JSON" in proc.stderr


def test_baseline_update(gated_run, tmp_path):
    dst = tmp_path / "baselines" / "cpu.json"
    proc = quick(
        "baseline",
        "update",
        "--bundle",
        str(gated_run / "cold_warm"),
        "--baseline",
        str(dst),
        "--case",
        "tiny_25f_64x64_4s_w17",
        "--hardware",
        "ci-cpu",
    )
    assert proc.returncode == 0, proc.stderr
    doc = bl.load_baseline(dst)
    assert doc["metadata"]["hardware"] == "ci-cpu"
    assert doc["scenarios"]["tiny_25f_64x64_4s_w17"]["expected_e2e_ms"] > 0


@pytest.mark.slow
def test_run_one_notebook_replaying_a_bundle(tmp_path):
    rec = tmp_path / "rec"
    synthetic.cold_warm().save(rec)
    run_dir = tmp_path / "nbrun"
    proc = perfkit("run", "notebooks/cold_warm.ipynb", "-p", f"bundle_dir={rec}", "-p", f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "notebooks" / "cold_warm.ipynb").exists()
    v = json.loads((run_dir / "cold_warm" / "verdict.json").read_text())
    assert v["status"] == "pass"
    # and the report renders from that directory (no run.json: inferred from the files)
    rep = perfkit("report", str(run_dir))
    assert rep.returncode == 0, rep.stderr
    assert "Cold vs warm" in (run_dir / "report.html").read_text()


def test_run_missing_notebook_is_error(tmp_path):
    proc = perfkit("run", str(tmp_path / "nope.ipynb"))
    assert proc.returncode == 2 and "not found" in proc.stderr

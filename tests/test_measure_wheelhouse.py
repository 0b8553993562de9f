"""`perfkit measure` (bundles without notebooks) and the offline wheelhouse."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit import wheelhouse
from perfkit.bundle import ResultBundle


def test_measure_writes_bundles_without_notebooks(tmp_path):
    params = {
        "name": "measure-test",
        "engine": {"kind": "reference", "preset": "tiny", "compile": False, "warmup_frames": 17},
        "request": {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 2},
        "cold_warm": {"enabled": True, "repeats": 2},
        "warmup_shapes": {"enabled": False},
        "memory_budget": {"enabled": False},
    }
    pfile = tmp_path / "p.yaml"
    pfile.write_text(yaml.safe_dump(params))
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfkit.cli",
            "measure",
            "--params",
            str(pfile),
            "--out",
            str(out),
            "--overhead-pairs",
            "2",
            "--work-dir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "measure.json").read_text())
    assert summary["cold_warm"]["error"] is None
    b = ResultBundle.load(out / "cold_warm")
    assert b.results["completed"] == 2
    assert sorted(b.requests["index"]) == [-1, 0, 1]
    # --overhead-pairs runs the overhead investigation in a launch of its own
    assert summary["overhead"]["error"] is None
    ov = ResultBundle.load(out / "overhead")
    assert ov.results["stage_timing"]["n_on"] == 2 and ov.results["sampler"]["n_off"] == 2
    # paired: the overhead is the median of the pairs' on/off ratios (ABBA neighbours)
    st = ov.results["stage_timing"]
    assert st["estimator"].startswith("paired") and st["n_pairs"] == 2
    ratios = sorted(on / off for on, off in st["pairs_ms"])
    assert math.isclose(st["overhead"], math.exp((math.log(ratios[0]) + math.log(ratios[1])) / 2) - 1)
    assert st["overhead_ci"][0] <= st["overhead"] <= st["overhead_ci"][1]
    assert sorted(on for on, _ in st["pairs_ms"]) == sorted(st["on_ms"])
    # event-timed stages cross-checked against a sync at every boundary; they add up to e2e
    agree = ov.results["timing_agreement"]
    assert agree["pairs"] == 3 and "DenoisingStage" in agree["stages"]
    assert 0.5 < agree["events_stage_sum_over_e2e"] <= 1.0
    # the probe's requests are not part of the measured table: only its warm-up request is
    assert sorted(ov.requests["index"]) == [-1, 0]
    # no compile caches travel with the bundle
    assert not any(p.name == "cache" for p in out.rglob("*"))


def test_measure_bad_params_exit_2(tmp_path):
    pfile = tmp_path / "p.yaml"
    pfile.write_text("name: x\ncold_wram: {}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.measure", "--params", str(pfile), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "cold_wram" in proc.stderr


def test_closure_and_missing():
    closure = wheelhouse.requirement_closure()
    for name in ("diffusers", "fastapi", "pandas", "papermill", "numpy"):
        assert name in closure, name
    assert "perfkit" not in closure
    have = {"diffusers", "fastapi", "pandas"}
    miss = wheelhouse.missing(closure, have)
    assert "diffusers" not in miss and "torch" not in miss and "papermill" in miss
    # the measuring profile leaves the Jupyter stack out
    assert "papermill" not in wheelhouse.requirement_closure(wheelhouse.MEASURE_ROOTS)


def test_read_have_parses_freeze(tmp_path):
    f = tmp_path / "have.txt"
    f.write_text("# comment\nNumPy==2.0.1\npydantic_core @ file:///x\ntyping-extensions\n")
    assert wheelhouse.read_have(f) == {"numpy", "pydantic-core", "typing-extensions"}


def test_download_and_offline_install(tmp_path):
    """Real pip download for another Python (3.12) of the one package the host lacks, then an
    offline install into a folder."""
    closure = wheelhouse.requirement_closure(wheelhouse.MEASURE_ROOTS)
    have = tmp_path / "have.txt"
    have.write_text("\n".join(n for n in closure if n != "tqdm") + "\n")
    dest = tmp_path / "wh"
    try:
        reqs = wheelhouse.download(dest, have, python_version="3.12", profile="measure")
    except RuntimeError as exc:  # no package index reachable
        pytest.skip(f"no package index: {exc}")
    assert reqs == [f"tqdm=={closure['tqdm']}"]
    wheels = list(dest.glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].name.startswith("tqdm")
    target = tmp_path / "site"
    wheelhouse.install(dest, target)
    assert (Path(target) / "tqdm").is_dir()


def test_install_without_wheels_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .whl"):
        wheelhouse.install(tmp_path)

"""Params files: every shipped file validates; bad ones fail naming the key, before any launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit.params import ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["ci-cpu", "h200", "consumer-12g"])
def test_shipped_params_validate(name):
    p = load_params(ROOT / "params" / f"{name}.yaml")
    assert p.name == name
    p.engine_spec()  # a valid EngineSpec
    assert p.enabled()


def test_ci_cpu_is_cheap_and_compiled():
    p = load_params(ROOT / "params" / "ci-cpu.yaml")
    assert p.engine["preset"] == "tiny" and p.engine["compile"] is True
    assert p.engine["compile_backend"] == "aot_eager" and p.engine["device"] == "cpu"
    assert p.baseline.file is None  # CPU: invariants only


def test_consumer_budget():
    p = load_params(ROOT / "params" / "consumer-12g.yaml")
    caps = [c for c in p.memory_budget.caps if c.device_gib == 12 and c.host_gib == 32]
    assert caps
    assert p.cold_warm.repeats == 3  # one cold + two warm


def _err(text: str) -> str:
    with pytest.raises(ParamsError) as ei:
        parse_params(yaml.safe_load(text), "params/x.yaml", text)
    return str(ei.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "name: x\ncold_wram:\n  repeats: 3\n",
            "params/x.yaml: unknown key 'cold_wram' (line 2) (did you mean 'cold_warm'?)",
        ),
        (
            "name: x\ncold_warm:\n  repeat: 3\n",
            "unknown key 'repeat' in cold_warm (line 3) (did you mean 'repeats'?)",
        ),
        (
            "name: x\nengine:\n  compil: true\n",
            "unknown key 'compil' in engine (line 3) (did you mean 'compile'?)",
        ),
        (
            "name: x\nmemory_budget:\n  caps:\n    - device_gb: 3\n",
            "unknown key 'device_gb' in memory_budget.caps",
        ),
        ("name: x\ninvariants:\n  warm_cold_ratio_mx: 1\n", "did you mean 'warm_cold_ratio_max'?"),
        (
            "name: x\ncold_warm:\n  repeats: 0\n",
            "cold_warm.repeats: Input should be greater than or equal to 2, got 0",
        ),
        ("name: x\nrequest:\n  num_frames: lots\n", "request.num_frames: Input should be a valid integer"),
        ("name: x\nengine:\n  warmup_frames: -1\n", "engine.warmup_frames: must be >= 0, got -1 (line 3)"),
        (
            "name: x\nmemory_budget:\n  min_budget: {lo_gib: 5, hi_gib: 2}\n",
            "lo_gib (5) must be < hi_gib (2)",
        ),
        ("name: x\nwarmup_shapes: {request_frames: []}\n", "warmup_shapes.request_frames"),
        ("cold_warm: {}\n", "name: required key is missing"),
        ("name: x\ncold_warm:\n  enabled: 'yes'\n", "cold_warm.enabled: Input should be a valid boolean"),
    ],
)
def test_errors_name_the_key(text, expected):
    assert expected in _err(text)


def test_all_problems_reported_at_once():
    msg = _err("name: x\ncold_wram: {}\nrequest: {num_frames: 0}\n")
    assert "cold_wram" in msg and "request.num_frames" in msg


def test_typo_fails_before_launch_via_cli(tmp_path):
    bad = tmp_path / "typo.yaml"
    text = (ROOT / "params" / "ci-cpu.yaml").read_text().replace("cold_warm:", "cold_wram:", 1)
    bad.write_text(text)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "suite", "--params", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown key 'cold_wram'" in proc.stderr and "did you mean 'cold_warm'?" in proc.stderr
    assert not out.exists()  # nothing ran, nothing was launched


def test_yaml_syntax_error(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ncold_warm: [\n")
    with pytest.raises(ParamsError, match="broken.yaml: invalid YAML"):
        load_params(p)

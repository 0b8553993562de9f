"""Params files: every shipped file validates; bad ones fail naming the key, before any launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit.engine.spec import EngineSpec, ReferenceEngine, SglangEngine
from perfkit.params import ParamsError, load_params, load_yaml, parse_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["ci-cpu", "h200", "consumer-12g"])
def test_shipped_params_validate(name):
    p = load_params(ROOT / "params" / f"{name}.yaml")
    assert p.name == name
    p.engine_spec()  # a valid EngineSpec
    assert p.enabled()


def test_ci_cpu_is_cheap_and_compiled():
    p = load_params(ROOT / "params" / "ci-cpu.yaml")
    assert p.engine.preset == "tiny" and p.engine.compile is True
    assert p.engine.compile_backend == "aot_eager" and p.engine.device == "cpu"
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
        (
            "name: x\nengine:\n  warmup_frames: -1\n",
            "engine.warmup_frames: Input should be greater than or equal to 0, got -1 (line 3)",
        ),
        (
            "name: x\nengine:\n  warmup_frames: abc\n",
            "engine.warmup_frames: Input should be a valid integer, got 'abc' (line 3)",
        ),
        (
            "name: x\nengine:\n  kind: vllm\n",
            "engine.kind: must be one of reference, sglang, command, got 'vllm' (line 3)",
        ),
        (
            "name: x\nengine:\n  kind: sglang\n  model_path: m/x\n  server_arg: []\n",
            "unknown key 'server_arg' in engine (line 5) (did you mean 'server_args'?)",
        ),
        (
            "name: x\nengine:\n  preset: tiny\n  server_args: [--x]\n",
            "unknown key 'server_args' in engine (line 4) (a field of kind 'sglang')",
        ),
        (
            "name: x\nengine:\n  kind: sglang\n",
            "engine.model_path: required key is missing for kind 'sglang'",
        ),
        ("name: x\nengine:\n  kind: command\n", "engine.command: required key is missing for kind 'command'"),
        (
            "name: x\nengine:\n  kind: sglang\n  model_path: m/x\n  warmup_frames: 0\n  warmup_mode: server\n",
            "engine.warmup_mode: 'server' contradicts warmup_frames=0 (which turns the startup warmup off) (line 6)",
        ),
        (
            "name: x\nengine:\n  port: 0\n",
            "engine.port: Input should be greater than or equal to 1, got 0 (line 3)",
        ),
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


def test_engine_section_is_the_spec():
    p = parse_params({"name": "x", "engine": {"kind": "sglang", "model_path": "m/x", "num_gpus": 2}})
    spec = p.engine_spec()
    assert isinstance(spec, SglangEngine) and spec.num_gpus == 2
    # the section itself, its request timeout filled in from the cell timeout (1800 - 10 - 10 s)
    assert p.engine.request_timeout_s is None and spec.request_timeout_s == 1780
    assert spec == p.engine.replace(request_timeout_s=1780)
    d = p.engine_dict()
    assert d == spec.to_dict() and d["kind"] == "sglang" and d["executable"] == ["sglang"]
    assert EngineSpec.from_dict(d) == spec
    assert EngineSpec.from_dict(dict(p.engine)) == p.engine  # dict(model): its fields


def test_timeouts_are_ordered():
    """request + stop grace + teardown margin must fit in the cell timeout (issue 33)."""
    eng = {"kind": "command", "command": ["x", "{port}"]}
    ok = parse_params(
        {"name": "x", "timeout_s": 30, "engine": {**eng, "request_timeout_s": 18, "stop_grace_s": 2}}
    )
    assert ok.request_timeout_s() == 18
    assert parse_params({"name": "x", "timeout_s": 30, "engine": eng}).request_timeout_s() == 10
    assert parse_params({"name": "x", "timeout_s": None, "engine": eng}).request_timeout_s() == 1800
    with pytest.raises(
        ParamsError, match=r"engine.request_timeout_s: request_timeout_s 19 \+ stop_grace_s 2"
    ):
        parse_params(
            {"name": "x", "timeout_s": 30, "engine": {**eng, "request_timeout_s": 19, "stop_grace_s": 2}}
        )
    with pytest.raises(ParamsError, match=r"timeout_s: must be > engine.stop_grace_s 10"):
        parse_params({"name": "x", "timeout_s": 20, "engine": eng})
    assert isinstance(parse_params({"name": "x"}).engine, ReferenceEngine)  # no section: the default


def test_yaml_12_floats(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: x\nengine:\n  startup_timeout_s: 1e3\nrequest:\n  guidance_scale: 5e-1\n")
    p = load_params(f)
    assert p.engine.startup_timeout_s == 1000.0 and p.request.guidance_scale == 0.5
    assert load_yaml("a: 1e3\nb: 5e-1\nc: -1.5E+2\nd: 10\ne: 1_000\nf: '1e3'\ng: 1.5\nh: 1e\n") == {
        "a": 1000.0,
        "b": 0.5,
        "c": -150.0,
        "d": 10,
        "e": 1000,
        "f": "1e3",
        "g": 1.5,
        "h": "1e",
    }
    # an int field still refuses a float, naming the field
    f.write_text("name: x\nengine:\n  warmup_frames: 1e3\n")
    with pytest.raises(
        ParamsError, match=r"engine.warmup_frames: Input should be a valid integer, got 1000.0 \(line 3\)"
    ):
        load_params(f)


def test_yaml_syntax_error(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ncold_warm: [\n")
    with pytest.raises(ParamsError, match="broken.yaml: invalid YAML"):
        load_params(p)


@pytest.mark.parametrize("bad", [-5, -0.01, float("inf"), float("nan")])
def test_a_negative_or_infinite_invariant_limit_is_refused_naming_its_key(bad):
    """Found by the breaker: ``-p invariants '{latency_drift_max: -5}'`` was judged, and every
    run failed as a regression; a misuse is an error (exit 2), not a verdict."""
    from perfkit.investigations import registry

    with pytest.raises(ValueError, match=r"latency_drift_max.*finite number >= 0"):
        registry.merged_invariants({"latency_drift_max": bad})
    assert registry.merged_invariants({"latency_drift_max": 0})["latency_drift_max"] == 0

"""What the engine really ran: recorded from the engine, shown, and gated (issue 17, item 2).

Real reference-engine launches (tiny preset, CPU): a recompile limit of 1 that a 25-frame request
hits after a 17-frame warmup fails the suite with the stage and torch's reason in summary.md; an
engine that drops torch.compile (inductor on CPU without a C++ compiler: ``CXX`` points nowhere)
fails the gate with the engine's reason unless the params expect it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfkit.bundle import ResultBundle
from perfkit.gate import run as gate_run
from perfkit.investigations import registry
from perfkit.readings.engine_config import (
    NOT_REPORTED,
    effective_config,
    from_record,
    from_sglang_log,
    server_args,
)

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "engine": {
        "kind": "reference",
        "preset": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "compile": True,
        "compile_backend": "aot_eager",
        "warmup_frames": 17,
    },
    "request": {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 2},
    "cold_warm": {"enabled": True, "repeats": 2},
    "warmup_shapes": {"enabled": False},
    "memory_budget": {"enabled": False},
    "offload_modes": {"enabled": False},
    "baseline": {"file": None},
    # this file is about the engine config rows: keep the noisy tiny-request ratios out
    "invariants": {
        "warm_cold_ratio_max": None,
        "latency_drift_max": None,
        "host_anon_slope_mib_per_request_max": None,
        "device_reserved_slope_mib_per_request_max": None,
    },
}


def _params(tmp_path: Path, name: str, **over) -> Path:
    doc = json.loads(json.dumps(BASE))
    doc["name"] = name
    for key, value in over.items():
        if isinstance(value, dict):
            doc.setdefault(key, {}).update(value)
        else:
            doc[key] = value
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# ---------------------------------------------------------------------------- readers


def test_record_config_is_read_as_reported():
    cfg = from_record(
        {
            "compile_requested": True,
            "compile_active": False,
            "compile_disabled_reason": "the transformer is offloaded (group-block)",
            "compile_backend": None,
            "recompile_limit": None,
            "attention_backend": "native",
            "dtype": "bfloat16",
            "offload": {"vae": "none", "transformer": "group-block"},
            "device": "cuda:0",
        }
    )
    assert cfg is not None and cfg.config_source == "engine record"
    assert (cfg.compile_requested, cfg.compile_active) == (True, False)
    assert cfg.compile_disabled_reason == "the transformer is offloaded (group-block)"
    assert cfg.offload == "transformer=group-block, vae=none"
    assert cfg.attention_backend == "native" and cfg.dtype == "bfloat16"
    # a record without config keys (another engine) is not a config of Nones
    assert from_record({"status": "completed"}) is None


SGLANG = ROOT / "tests" / "fixtures" / "sglang" / "0.5.23"  # real sglang 0.5.23 logs (NOTES-startup.md)


def test_sglang_0523_server_args_json_line_is_read():
    """sglang 0.5.23's own log: ``server_args: {JSON}`` (attention_backend null: its pick is the
    "Using torch_sdpa attention backend" line), the device and the DiT's dtype beside it."""
    cfg = from_sglang_log((SGLANG / "sana-video" / "server.log").read_text())
    assert cfg is not None and cfg.config_source == "engine log (server_args JSON)"
    assert cfg.compile_active is False and cfg.compile_requested is None  # sglang logs no "asked"
    assert cfg.attention_backend == "torch_sdpa (sglang's pick: attention_backend null)"
    assert cfg.offload == "image_encoder=none, text_encoder=none, transformer=none, vae=none"
    assert (cfg.device, cfg.dtype) == ("cpu", "bfloat16")
    # the diffusers backend: no attention pick logged, its pipeline's dtype line
    cfg = from_sglang_log((SGLANG / "sana-video-diffusers" / "server.log").read_text())
    assert cfg is not None and cfg.config_source == "engine log (server_args JSON)"
    assert (
        cfg.attention_backend == "not set (attention_backend null: sglang picks per platform; no pick logged)"
    )
    assert (cfg.device, cfg.dtype, cfg.compile_active) == ("cpu", "bfloat16", False)


def test_server_args_line_read_once_last_wins_and_flags_map():
    """The JSON is read from its line alone (the one datum, once); a later line (a restart)
    wins; a line that is not JSON is skipped, never read as defaults."""
    line = (SGLANG / "sana-video" / "server.log").read_text().splitlines()[7]
    args, form = server_args(line)
    assert (
        form == "server_args JSON" and args["warmup_mode"] == "server" and args["attention_backend"] is None
    )
    restart = line.replace('"enable_torch_compile": false', '"enable_torch_compile": true').replace(
        '"dit_cpu_offload": false', '"dit_cpu_offload": true'
    )
    assert restart != line
    cfg = from_sglang_log(line + "\n" + restart + "\n[12-04 00:00:00] server_args: {not json\n")
    assert cfg.compile_active is True and "transformer=cpu" in cfg.offload
    assert from_sglang_log("[12-04 00:00:00] server_args: {not json") is None
    assert from_sglang_log("no args here") is None


def test_server_args_repr_fallback_is_read():
    """sglang 0.5.23 falls back to ``server_args: {self}`` (the dataclass repr) when its sanitizer
    fails (server_args.py, ``__post_init__``); older sglang wrote ``server_args=ServerArgs(...)``."""
    for sep in (": ", "="):
        log = (
            "[11-30 10:00:00] INFO starting\n"
            f"[11-30 10:00:01] server_args{sep}ServerArgs(model_path='Lightricks/LTX-Video', "
            "enable_torch_compile=True, attention_backend='fa3', dtype='bfloat16', dit_cpu_offload=False, "
            "dit_layerwise_offload=True, vae_cpu_offload=True, tp_size=1, lora_path=None)\n"
        )
        cfg = from_sglang_log(log)
        assert cfg is not None and cfg.config_source == "engine log (ServerArgs repr)"
        assert cfg.compile_active is True and cfg.compile_requested is None
        assert (cfg.attention_backend, cfg.dtype) == ("fa3", "bfloat16")
        assert cfg.offload == "transformer=layerwise, vae=cpu"
    # nothing readable: every field None and said so
    none = effective_config(None, {"x.stderr.log": "hello"})
    assert none.config_source == NOT_REPORTED and none.compile_active is None


# ---------------------------------------------------------------------------- live engine


@pytest.mark.slow
def test_recompile_limit_hit_fails_the_suite_naming_stage_and_reason(tmp_path):
    params = _params(tmp_path, "recompile-limit", engine={"recompile_limit": 1})
    out = tmp_path / "run"
    proc = _cli("perfkit.cli", "suite", "--params", str(params), "--out", str(out), "--no-screenshot", "-q")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    b = ResultBundle.load(out / "cold_warm")
    ln = b.table("launches").iloc[0]
    assert bool(ln["compile_requested"]) and bool(ln["compile_active"])
    assert int(ln["recompile_limit"]) == 1
    assert ln["config_source"] == "engine record"
    cold = b.requests[b.requests["index"] == 0].iloc[0]
    assert bool(cold["recompile_limit_hit"]) and cold["recompile_limit_stage"] == "DenoisingStage"
    # long reasons wrap in summary.md's tables (<br> where a space was)
    summary = (out / "summary.md").read_text().replace("<br>", " ")
    assert "recompile_limit\\[session\\]" in summary  # brackets escaped: never a link
    assert "hit torch.compile's recompile limit (limit 1) in DenoisingStage" in summary
    assert "recompile_limit" in summary.split("hit torch.compile's")[1]  # torch's own words follow
    # the report shows what the engine ran
    html = (out / "report.html").read_text()
    assert "recompile limit" in html.lower()


@pytest.mark.slow
def test_compile_dropped_by_the_engine_fails_unless_expected(tmp_path):
    params = _params(tmp_path, "no-cxx", engine={"compile_backend": "inductor"})
    out = tmp_path / "bundles"
    proc = _cli(
        "perfkit.measure", "--params", str(params), "--out", str(out), env={"CXX": "/nonexistent/g++"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ln = ResultBundle.load(out / "cold_warm").table("launches").iloc[0]
    assert bool(ln["compile_requested"]) and not bool(ln["compile_active"])
    assert "needs a C++ compiler" in ln["compile_disabled_reason"]
    engine, request = BASE["engine"], BASE["request"]
    rows = gate_run.gate(out, engine=engine, request=request).rows
    row = next(r for r in rows if r.metric == "compile_active[session]")
    assert (
        row.status == "fail"
        and "compile asked but not active: inductor on CPU needs a C++ compiler" in row.reason
    )
    # no compile, so no recompile-limit row: nothing was compiled to hit it
    assert not [r for r in rows if r.metric.startswith("recompile_limit[")]
    inv = {**registry.invariant_defaults(), "compile_inactive_ok": True}
    row = next(
        r
        for r in gate_run.gate(out, engine=engine, request=request, invariants=inv).rows
        if r.metric == "compile_active[session]"
    )
    assert row.status == "pass" and "expected" in row.reason

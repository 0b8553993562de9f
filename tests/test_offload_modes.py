"""Offload modes: the reference engine's ``--offload`` flags and the offload investigation.

On a CPU device only ``none`` runs; the engine refuses the accelerator modes at startup (exit
code 2, a message naming the mode and the device), and the investigation records them as "not
applicable" with that reason: their checks are skipped, never passed.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from matplotlib.figure import Figure

from perfkit.checks import Check
from perfkit.engine.spec import OFFLOAD_MODES, EngineSpec, EngineSpecError
from perfkit.investigations.offload_modes import offload_modes
from perfkit.investigations.registry import get, invariant_defaults
from perfkit.report import plots
from refengine_helpers import running_engine, spec

NAME = "offload_modes"
ACCEL = ("model", "group-block", "group-leaf")
REQ = {"num_frames": 17, "height": 64, "width": 64, "num_inference_steps": 2}
# a 9-frame warmup does not cover 17 frames: the cold request recompiles (aot_eager, seconds), so
# "warm not slower than cold" holds by a wide margin even on a busy 2-core runner
SPEC = EngineSpec(
    kind="reference",
    preset="tiny",
    device="cpu",
    dtype="float32",
    compile=True,
    compile_backend="aot_eager",
    warmup_frames=9,
)


# -- the spec carries the flags ----------------------------------------------------------------


def test_reference_spec_builds_offload_argv_and_round_trips():
    s = EngineSpec(offload="group-leaf", offload_components={"vae": "none", "text_encoder": "model"})
    argv = s.command(1234, "/tmp/perf")
    i = argv.index("--offload")
    assert argv[i + 1] == "group-leaf"
    assert argv[argv.index("--offload-text-encoder") + 1] == "model"
    assert argv[argv.index("--offload-vae") + 1] == "none"
    assert "--offload-transformer" not in argv
    assert EngineSpec.from_dict(s.to_dict()) == s
    assert "--offload" not in EngineSpec().command(1, "/tmp/p")  # default: automatic


def test_offload_fields_are_validated_and_reference_only():
    with pytest.raises(EngineSpecError, match="offload"):
        EngineSpec(offload="disk")
    with pytest.raises(EngineSpecError, match="offload_components"):
        EngineSpec(offload_components={"unet": "model"})
    with pytest.raises(EngineSpecError, match="a field of kind 'reference'"):
        EngineSpec(kind="sglang", model_path="org/model", offload="model")


# -- the engine: what it reports per mode on a CPU device ---------------------------------------


@pytest.mark.slow
def test_engine_with_offload_none_reports_every_component_resident(tmp_path):
    with running_engine(tmp_path, "--device", "cpu", "--offload", "none", "--warmup-frames", "0") as eng:
        with eng.client() as c:
            m = httpx.get(c.base_url + "/v1/models").json()["data"][0]
            out = c.generate(spec(9, steps=2))
    assert m["placement"] == "cpu"
    assert m["offload"] == {"text_encoder": "none", "transformer": "none", "vae": "none"}
    assert m["offload_requested"] == {"text_encoder": "none", "transformer": "none", "vae": "none"}
    assert m["placement_by_component"] == {"text_encoder": "cpu", "transformer": "cpu", "vae": "cpu"}
    assert m["offload_use_stream"] is False
    assert out.ok, out.error
    pk = out.record.perfkit
    assert pk["placement"] == "cpu"  # the record's summary string stays as before
    assert pk["offload"] == m["offload"] and pk["placement_by_component"] == m["placement_by_component"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ACCEL)
def test_engine_refuses_accelerator_modes_on_cpu_with_exit_code_2(mode, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "perfkit.refengine", "--device", "cpu", "--offload", mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"offload mode '{mode}' needs an accelerator; device is cpu" in proc.stderr
    assert "perfkit-mark listening" not in proc.stderr  # refused before binding or loading
    # and before importing torch (-X importtime lists every module imported, on stderr)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "perfkit.refengine.cli" in imported and "torch" not in imported


@pytest.mark.slow
def test_engine_refuses_a_per_component_mode_naming_the_component(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.refengine", "--device", "cpu", "--offload", "none"]
        + ["--offload-vae", "model"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "offload mode 'model' needs an accelerator; device is cpu (vae=model)" in proc.stderr


# -- the investigation on the CPU ---------------------------------------------------------------


@pytest.fixture(scope="module")
def none_only(tmp_path_factory):
    return offload_modes(SPEC, modes=["none"], request=REQ, repeats=2, run_dir=tmp_path_factory.mktemp("om1"))


@pytest.fixture(scope="module")
def all_modes(none_only, tmp_path_factory):
    # mode none reuses the launch above (same spec, automatic placement = none without a cap)
    return offload_modes(
        SPEC, request=REQ, repeats=2, run_dir=tmp_path_factory.mktemp("om4"), reuse=[none_only]
    )


@pytest.mark.slow
def test_cpu_run_gives_one_row_per_mode_none_ran_others_not_applicable(all_modes):
    r = all_modes.results
    rows = {e["mode"]: e for e in r["modes"]}
    assert list(rows) == list(OFFLOAD_MODES)
    none = rows["none"]
    assert none["status"] == "ran" and none["reason"] is None
    assert none["offload"] == {"text_encoder": "none", "transformer": "none", "vae": "none"}
    assert none["placement"] == "cpu" and none["placement_matches"] is True
    assert none["cold_ms"] > 0 and none["warm_ms"] > 0 and none["host_pss_peak_mib"] > 0
    assert none["reused_from"] and r["reused_launches"] == ["offload-none"]
    for mode in ACCEL:
        e = rows[mode]
        assert e["status"] == "not applicable", e
        assert e["reason"].startswith(f"offload mode '{mode}' needs an accelerator; device is cpu")
        assert e["placement_matches"] is None and e["warm_ms"] is None
    assert r["device"] == "cpu"
    table = get(NAME).summary_table(r)
    assert list(table["mode"]) == list(OFFLOAD_MODES)
    assert list(table["status"]) == ["ran"] + ["not applicable"] * 3
    assert {"ready_s", "load_s", "warmup_s", "cold_ms", "warm_ms", "peak_reserved_mib"} <= set(table.columns)
    assert table.loc[0, "placement"].startswith("cpu: text_encoder=none")
    # torch.compile as the engine's records have it (this spec asks for aot_eager)
    assert none["compile_requested"] is True and none["compile_active"] is True
    assert none["compile_disabled_reason"] is None
    assert list(table["compile"]) == ["on", "–", "–", "–"]
    get(NAME).check_bundle(all_modes)
    assert isinstance(plots.offload_memory_latency(table), Figure)


@pytest.mark.slow
def test_cpu_checks_pass_for_what_ran_and_skip_what_could_not(all_modes):
    rows = get(NAME).checks(all_modes.results, invariant_defaults())
    by = {c.metric: c for c in rows}
    assert by["placement_matches[none]"].status == "pass"
    assert by["warm_not_slower[none]"].status == "pass"
    for mode in ACCEL:
        for col in ("placement_matches", "warm_not_slower"):
            c = by[f"{col}[{mode}]"]
            assert c.status == "skipped" and "not applicable" in c.reason, c
    assert by["offload_vram_order"].status == "skipped" and "GPU" in by["offload_vram_order"].reason
    assert not [c for c in rows if c.status == "fail"]


@pytest.mark.slow
def test_cases_are_one_per_mode_that_ran(all_modes):
    def cid(suffix: str = "") -> str:
        return "case" + suffix

    assert list(get(NAME).cases(all_modes, cid)) == ["case_offload-none"]


# -- checks on GPU-shaped results (no engine) ---------------------------------------------------


def _gpu(**over):
    def row(mode, vram, host, warm=100.0):
        return {
            "mode": mode,
            "label": f"offload-{mode}",
            "status": "ran",
            "peak_reserved_mib": vram,
            "host_pss_peak_mib": host,
            "cold_ms": 120.0,
            "warm_ms": warm,
            "offload": {"transformer": mode},
            "placement_matches": True,
            "warm_not_slower": True,
        }

    modes = [
        row("none", 9000.0, 2000.0),
        row("model", 5000.0, 9000.0),
        row("group-block", 1500.0, 9200.0),
        row("group-leaf", 900.0, 9300.0),
    ]
    for m in modes:
        m.update(over.get(m["mode"], {}))
    return {"device": "cuda:0", "modes": modes}


def test_vram_order_passes_when_offload_saves_device_memory():
    rows = get(NAME).checks(_gpu(), {"offload_vram_order": True})
    assert rows and all(isinstance(c, Check) for c in rows)
    assert {c.status for c in rows} == {"pass"}, [(c.metric, c.status, c.reason) for c in rows]
    assert any(c.metric.startswith("vram_order[none>model]") for c in rows)
    assert any(c.metric.startswith("host_order[none<model]") for c in rows)


def test_vram_order_fails_when_a_group_mode_holds_more_vram_than_model():
    rows = get(NAME).checks(
        _gpu(**{"group-leaf": {"peak_reserved_mib": 7000.0}}), {"offload_vram_order": True}
    )
    failed = [c.metric for c in rows if c.status == "fail"]
    assert failed == ["vram_order[model>group-leaf]"]


def test_vram_order_skipped_with_fewer_than_two_modes_and_failed_launch_fails_placement():
    r = _gpu()
    for m in r["modes"][1:]:
        m.update({"status": "failed", "reason": "exit code 1", "placement_matches": None})
    rows = get(NAME).checks(r, invariant_defaults())
    by = {c.metric: c for c in rows}
    assert by["offload_vram_order"].status == "skipped"
    assert by["placement_matches[model]"].status == "fail"
    assert by["warm_not_slower[model]"].status == "skipped"


def test_params_need_two_repeats_and_unique_modes():
    model = get(NAME).params_model
    assert model().modes == list(OFFLOAD_MODES) and model().repeats == 2
    with pytest.raises(ValueError):
        model(repeats=1)
    with pytest.raises(ValueError):
        model(modes=["none", "none"])
    with pytest.raises(ValueError):
        model(modes=["disk"])


def test_the_h200_block_offload_bundle_shows_compile_on_from_the_engine_records():
    # examples/h200/bundles-offload-block-compile (2026-12-01): the block-offloaded transformer
    # was compiled; the table says so from the results, and the records agree
    import json
    from pathlib import Path

    from perfkit.bundle import ResultBundle

    b = ResultBundle.load(
        Path(__file__).resolve().parents[1] / "examples/h200/bundles-offload-block-compile/offload_modes"
    )
    table = get(NAME).summary_table(b.results)
    assert list(table["mode"]) == ["group-block"] and list(table["compile"]) == ["on"]
    pk = [json.loads(line)["perfkit"] for line in b.records["offload-group-block"]]
    assert all(p["compile_active"] for p in pk)
    assert [p["compiles"] for p in pk] == [56, 0, 0, 0]  # the startup warmup, then three requests
    assert "torch.compile on" in get(NAME).reading(b.results)


def test_compile_text_says_what_the_engine_reported():
    text = offload_modes_module().compile_text
    assert text({"compile_active": True}) == "on"
    assert text({"compile_active": False, "compile_requested": False}) == "off (not asked)"
    why = "the transformer is offloaded (group-leaf); torch.compile is kept only under none or group-block"
    assert (
        text({"compile_active": False, "compile_requested": True, "compile_disabled_reason": why})
        == f"off: {why}"
    )
    assert text({}) == "–"  # not recorded (bundles from before the field): never a guess


def offload_modes_module():
    import importlib

    return importlib.import_module("perfkit.investigations.offload_modes")

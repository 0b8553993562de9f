"""The sglang adapter: EngineSpec kind ``sglang`` (argv, environment, checks before launch),
records in sglang's performance.log layout, the stage-class mapping, and cold_vs_warm run end to
end through the sglang code path against the reference engine (``perfkit engine serve`` speaks
sglang's command line and perf environment), so everything but the executable is real.

Record fixtures follow docs/sglang.md "Interop facts" and sglang 0.5.23's ``perf_logger.py``
(``RequestPerfRecord``: stages carry ``is_denoising``; snapshots carry ``peak_host_anon_mb``).
"""

from __future__ import annotations

import json
import math
import stat
import sys
from pathlib import Path

import matplotlib.colors
import pandas as pd
import pytest

from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import RequestOutcome, job_fields
from perfkit.engine.launch import parse_marks, started_processes
from perfkit.engine.spec import EngineSpec
from perfkit.gate import baseline as bl
from perfkit.investigations.cold_warm import cold_vs_warm
from perfkit.measuring.launch_rows import LaunchData, _rows
from perfkit.params import load_params
from perfkit.readings import stages
from perfkit.readings.engine_config import from_sglang_log
from perfkit.readings.records import SNAPSHOT_KEYS, PerfRecord, lookup, parse_lines, read_perf_log
from perfkit.refengine.cli import sglang_perf_log_dir
from perfkit.report import plots

REPO = Path(__file__).resolve().parents[1]
BASE = ["serve", "--model-path", "/models/ltx2", "--port", "30000", "--host", "127.0.0.1"]


# ----------------------------------------------------------------------------- command line / env
@pytest.mark.parametrize(
    "kwargs, expected",
    [
        # defaults: sglang's own warmup (17 frames, server mode) -> no warmup flag
        ({}, ["sglang", *BASE, "--num-gpus", "1"]),
        # python -m form, several GPUs, offload + parallelism server args, extra args last
        (
            {
                "executable": [sys.executable, "-m", "sglang.cli.main"],
                "num_gpus": 2,
                "server_args": [
                    "--dit-layerwise-offload",
                    "--text-encoder-cpu-offload",
                    "--ulysses-degree",
                    "2",
                ],
                "extra_args": ["--log-level", "debug"],
            },
            [
                sys.executable,
                "-m",
                "sglang.cli.main",
                *BASE,
                "--num-gpus",
                "2",
                "--dit-layerwise-offload",
                "--text-encoder-cpu-offload",
                "--ulysses-degree",
                "2",
                "--log-level",
                "debug",
            ],
        ),
        # startup warmup passed through with sglang's flag names; resolution is width first there
        (
            {
                "warmup_frames": 25,
                "warmup_resolution": "480x832",
                "warmup_steps": 2,
                "compile": True,
                "server_args": ["--pipeline-class-name", "LTX2TwoStagePipeline"],
            },
            [
                "sglang",
                *BASE,
                "--num-gpus",
                "1",
                "--warmup-num-frames",
                "25",
                "--warmup-resolutions",
                "832x480",
                "--warmup-steps",
                "2",
                "--enable-torch-compile",
                "--pipeline-class-name",
                "LTX2TwoStagePipeline",
            ],
        ),
        ({"warmup_frames": 0}, ["sglang", *BASE, "--num-gpus", "1", "--warmup-mode", "off"]),
        (
            {"warmup_mode": "request", "warmup_frames": 49},
            ["sglang", *BASE, "--num-gpus", "1", "--warmup-mode", "request", "--warmup-num-frames", "49"],
        ),
        ({"warmup_mode": "server"}, ["sglang", *BASE, "--num-gpus", "1", "--warmup-mode", "server"]),
        # the reference engine behind sglang's command line (what the end-to-end test runs)
        (
            {
                "executable": [sys.executable, "-m", "perfkit.cli", "engine"],
                "extra_args": ["--preset", "tiny"],
            },
            [sys.executable, "-m", "perfkit.cli", "engine", *BASE, "--num-gpus", "1", "--preset", "tiny"],
        ),
    ],
)
def test_sglang_command_lines(kwargs, expected):
    spec = EngineSpec(kind="sglang", model_path="/models/ltx2", **kwargs)
    argv = spec.command(30000, "/runs/x/perf")
    assert argv[:-2] == expected
    # sglang's default output path is relative to its cwd: the launch's directory instead
    assert argv[-2:] == ["--output-path", "/runs/x/outputs"]
    # the perf dir never goes on sglang's command line: the environment carries it
    assert "/runs/x/perf" not in " ".join(spec.command(30000, "/runs/x/perf"))


def test_sglang_environment_with_caps():
    spec = EngineSpec(
        kind="sglang",
        model_path="/models/ltx2",
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "MY_LOG": "{perf_log_dir}/x.log"},
    )
    env = spec.env_for("/runs/x/perf", port=30000)
    assert env["SGLANG_DIFFUSION_STAGE_LOGGING"] == "1"
    assert env["SGLANG_PERF_LOG_DIR"] == "/runs/x/perf"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["MY_LOG"] == "/runs/x/perf/x.log"
    # launch adds the caps' environment on top: the variables sglang's CI uses
    caps = MemoryCaps(device_gib=12, host_gib=32).env()
    assert caps["SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"] == "12"
    assert caps["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] == "32"
    assert "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB" not in MemoryCaps().env()


def test_startup_warmup_frames_and_validation():
    assert EngineSpec(kind="sglang", model_path="m/x").startup_warmup_frames() == 17
    assert EngineSpec(kind="sglang", model_path="m/x", warmup_mode="request").startup_warmup_frames() == 0
    assert EngineSpec(kind="sglang", model_path="m/x", warmup_frames=0).startup_warmup_frames() == 0
    assert EngineSpec(kind="command", command_template=["x"]).startup_warmup_frames() is None
    with pytest.raises(
        ValueError, match=r"EngineSpec.warmup_mode: Input should be 'off', 'request' or 'server'"
    ):
        EngineSpec(kind="sglang", model_path="m/x", warmup_mode="eager")
    with pytest.raises(ValueError, match=r"EngineSpec.warmup_mode: 'request' is only supported"):
        EngineSpec(kind="reference", warmup_mode="request")
    with pytest.raises(ValueError, match=r"EngineSpec.warmup_mode: 'server' contradicts warmup_frames=0"):
        EngineSpec(kind="sglang", model_path="m/x", warmup_frames=0, warmup_mode="server")
    with pytest.raises(
        ValueError, match=r"EngineSpec.warmup_steps: Input should be greater than or equal to 1"
    ):
        EngineSpec(kind="sglang", model_path="m/x", warmup_steps=0)
    # reference kind: the same fields map to its own flags
    argv = EngineSpec(warmup_mode="off", warmup_steps=3).command(1, "/p")
    assert argv[argv.index("--warmup-frames") + 1] == "0"
    assert argv[argv.index("--warmup-steps") + 1] == "3"
    spec = EngineSpec(kind="sglang", model_path="m/x", warmup_steps=2, warmup_mode="server")
    assert EngineSpec.from_dict(spec.to_dict()) == spec


def test_params_example_validates():
    params = load_params(REPO / "params" / "sglang-example.yaml")
    spec = params.engine_spec()
    assert spec.kind == "sglang" and spec.model_path == "Lightricks/LTX-2"
    argv = spec.command(30000, "/p")
    assert argv[:2] == ["sglang", "serve"]
    for flag in (
        "--dit-layerwise-offload",
        "--text-encoder-cpu-offload",
        "--vae-cpu-offload",
        "--pin-cpu-memory",
        "--warmup-steps",
    ):
        assert flag in argv
    assert params.enabled() == ["cold_warm", "warmup_shapes", "memory_budget"]


# ----------------------------------------------------------------------------- errors before launch
def _fake_exe(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "sglang"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.mark.parametrize("case", ["no-executable", "no-module", "no-model"])
def test_missing_executable_or_model_path_fails_before_launch(tmp_path, case):
    model = tmp_path / "model"
    model.mkdir()
    if case == "no-executable":
        spec = EngineSpec(kind="sglang", model_path=str(model), executable=["sglang-not-installed-xyz"])
        pattern = r"EngineSpec.executable: 'sglang-not-installed-xyz' is not on PATH"
    elif case == "no-module":
        spec = EngineSpec(
            kind="sglang",
            model_path=str(model),
            executable=[sys.executable, "-m", "no_such_sglang_pkg.cli.main"],
        )
        pattern = r"EngineSpec.executable: .*module 'no_such_sglang_pkg.cli.main' cannot be imported"
    else:
        spec = EngineSpec(
            kind="sglang", model_path=str(tmp_path / "missing"), executable=[str(_fake_exe(tmp_path))]
        )
        pattern = r"EngineSpec.model_path: '.*missing' does not exist"
    before = len(started_processes())
    run_dir = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=pattern):
        cold_vs_warm(spec, {"num_frames": 9}, repeats=2, run_dir=run_dir)
    assert len(started_processes()) == before  # nothing was started
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_refengine_takes_the_perf_dir_from_sglangs_env():
    on = {"SGLANG_DIFFUSION_STAGE_LOGGING": "1", "SGLANG_PERF_LOG_DIR": "/x/perf"}
    assert sglang_perf_log_dir(on) == "/x/perf"
    assert sglang_perf_log_dir({**on, "SGLANG_DIFFUSION_STAGE_LOGGING": "True"}) == "/x/perf"
    assert sglang_perf_log_dir({**on, "SGLANG_DIFFUSION_STAGE_LOGGING": "0"}) is None
    assert sglang_perf_log_dir({"SGLANG_PERF_LOG_DIR": "/x/perf"}) is None
    assert sglang_perf_log_dir({"SGLANG_DIFFUSION_STAGE_LOGGING": "1"}) is None


# ----------------------------------------------------------------------------- records, sglang layout
LTX2_STAGES = [  # LTX-2 two-stage pipeline (sglang ltx_2_pipeline.py), ms
    ("InputValidationStage", 0.1, False),
    ("TextEncodingStage", 180.0, False),
    ("LTX2TextConnectorStage", 4.0, False),
    ("LTX2HalveResolutionStage", 0.05, False),
    ("LTX2LoRASwitchStage", 0.4, False),
    ("LTX2SigmaPreparationStage", 0.2, False),
    ("TimestepPreparationStage", 0.3, False),
    ("LTX2AVLatentPreparationStage", 6.0, False),
    ("LTX2ImageEncodingStage", 0.1, False),
    ("LTX2AVDenoisingStage", 9000.0, True),
    ("LTX2UpsampleStage", 350.0, False),
    ("ltx2_lora_switch_stage2", 0.3, False),
    ("ltx2_image_encoding_stage2", 0.1, False),
    ("LTX2RefinementStage", 2100.0, True),
    ("LTX2AVDecodingStage", 1400.0, False),
]


def _snapshot(peak_reserved: float, peak_alloc: float, host: float = 9000.0) -> dict:
    return {
        "allocated_mb": peak_alloc * 0.8,
        "reserved_mb": peak_reserved * 0.9,
        "peak_allocated_mb": peak_alloc,
        "peak_reserved_mb": peak_reserved,
        "peak_host_anon_mb": host,
    }


def sglang_record(rid: str, scale: float = 1.0, n_steps: int = 30) -> dict:
    return {
        "request_id": rid,
        "timestamp": "2026-01-01T00:00:00+00:00",
        "commit_hash": "0123abc",
        "tag": "pipeline_stage_metrics",
        "stages": [
            {"name": n, "execution_time_ms": ms * scale, "is_denoising": d} for n, ms, d in LTX2_STAGES
        ],
        "steps": [300.0 * scale] + [290.0] * (n_steps - 1),
        "total_duration_ms": sum(ms for _, ms, _ in LTX2_STAGES) * scale,
        "memory_snapshots": {
            "load_peak": _snapshot(41000.0, 40500.0),
            "warmup_peak": _snapshot(52000.0, 50100.0),
            "runtime_peak": _snapshot(55000.0 + scale, 51000.0),
        },
    }


def _outcome(rid: str) -> RequestOutcome:
    return RequestOutcome(rid, "completed", 0.0, 1.0, 200)


def test_records_in_sglangs_layout(tmp_path):
    perf = tmp_path / "perf"
    perf.mkdir()
    ids = [f"video_{i:04x}" for i in range(3)]
    lines = [json.dumps(sglang_record(rid, scale=1.5 if i == 0 else 1.0)) for i, rid in enumerate(ids)]
    (perf / "performance.log").write_text("\n".join(lines) + "\n" + lines[0][:40])  # partial last line
    rep = read_perf_log(perf)
    assert [r.request_id for r in rep.records] == ids and rep.skipped == []
    rec = lookup(perf, ids[1])
    assert isinstance(rec, PerfRecord) and rec.tag == "pipeline_stage_metrics" and not rec.is_warmup
    assert [n for n, _ in rec.stages] == [n for n, _, _ in LTX2_STAGES]
    assert rec.stage_ms()["LTX2AVDenoisingStage"] == 9000.0
    assert len(rec.steps) == 30
    assert set(SNAPSHOT_KEYS) <= set(rec.memory_snapshots)
    assert rec.peak_mb("load_peak") == 41000.0
    assert rec.peak_mb("warmup_peak", "peak_allocated_mb") == 50100.0
    assert rec.peak_mb("runtime_peak") == 55001.0
    assert rec.perfkit == {} and rec.raw["stages"][9]["is_denoising"] is True

    # the rows the investigations build from them (no warmup lines: sglang does not log warmup)
    data = LaunchData(label="session", record_lines=lines, outcomes=[_outcome(r) for r in ids])
    _rows(data, [None] * 3)
    req = pd.DataFrame(data.requests)
    assert list(req["request_id"]) == ids and list(req["index"]) == [0, 1, 2]
    assert (req["status"] == "completed").all()
    assert req["e2e_ms"].iloc[0] == pytest.approx(1.5 * sum(ms for _, ms, _ in LTX2_STAGES))
    assert req["peak_reserved_mib"].iloc[1] == 55001.0
    assert data.launch_row["load_peak_mib"] == 41000.0
    assert data.launch_row["warmup_peak_mib"] == 52000.0
    st = pd.DataFrame(data.stages)
    assert list(st[st["request_id"] == ids[0]]["stage"]) == [n for n, _, _ in LTX2_STAGES]
    assert len(data.steps) == 90


# ----------------------------------------------------------------------------- stage classes
@pytest.mark.parametrize(
    "name, cls, gate",
    [
        ("DenoisingStage", "denoising", "denoise"),
        ("LTX2AVDenoisingStage", "denoising", "denoise"),
        ("LTX2DenoisingStage", "denoising", "denoise"),
        ("RefinementStage", "refinement", "denoise"),
        ("LTX2RefinementStage", "refinement", "denoise"),
        ("DecodingStage", "decoding", "decoding"),
        ("LTX2AVDecodingStage", "decoding", "decoding"),
        ("CausalVaeDecodingStage", "decoding", "decoding"),
        ("ImageVAEEncodingStage", "other", "non_denoise"),
        ("LTX2UpsampleStage", "other", "non_denoise"),
        ("TextEncodingStage", "other", "non_denoise"),
        ("ltx2_image_encoding_stage2", "other", "non_denoise"),
        ("WanAnimate2BeforeDenoisingStage", "other", "non_denoise"),
        ("Kandinsky6SRDenoisingStage", "denoising", "denoise"),  # unknown name: by substring
        ("Flux3ImageDecodeStage", "decoding", "decoding"),
        ("SomeNewStage", "other", "non_denoise"),
    ],
)
def test_stage_classes(name, cls, gate):
    assert stages.stage_class(name) == cls
    assert bl.classify_stage(name) == gate


def test_stage_order_and_colours_for_sglang_names():
    names = [n for n, _, _ in LTX2_STAGES]
    shuffled = list(reversed(names)) + ["MyCustomStage"]
    ordered = stages.order_stages(shuffled)
    assert ordered[:-1] == names and ordered[-1] == "MyCustomStage"
    assert stages.denoising_stage(names) == "LTX2AVDenoisingStage"

    rows = []
    for i, rid in enumerate(["a", "b"]):
        for n, ms, _ in reversed(LTX2_STAGES):  # arrival order must not matter
            rows.append(dict(launch="L", request_id=rid, index=i, stage=n, ms=ms))
    fig = plots.stage_breakdown(pd.DataFrame(rows))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == names  # pipeline order on the x axis
    colour = plots.stage_colors(names)  # stage marks of the memory timeline
    assert matplotlib.colors.same_color(colour["LTX2AVDenoisingStage"], "tab:blue")
    assert matplotlib.colors.same_color(colour["LTX2RefinementStage"], "tab:purple")
    assert matplotlib.colors.same_color(colour["LTX2AVDecodingStage"], "tab:green")
    assert len({matplotlib.colors.to_hex(c) for c in colour.values()}) == len(names)


def test_baseline_gate_tolerances_for_sglang_stage_names():
    doc = bl.new_baseline("test")
    case = {
        "stages_ms": {
            "LTX2AVDenoisingStage": 1000.0,
            "LTX2RefinementStage": 1000.0,
            "LTX2AVDecodingStage": 1000.0,
            "LTX2UpsampleStage": 1000.0,
        },
        "denoise_step_ms": {},
        "expected_e2e_ms": 4000.0,
        "expected_avg_denoise_ms": 0.0,
        "expected_median_denoise_ms": 0.0,
    }
    bl.set_case(doc, "ltx2", case)
    run = {"ltx2": {**case, "stages_ms": {k: 1700.0 for k in case["stages_ms"]}}}
    rows = {r.metric: r for r in bl.compare(run, doc, profile="long_term")}
    # long_term: denoise_stage tolerance (0.1) for denoising and refinement, decoding gets
    # max(non_denoise_stage, 0.9), other stages non_denoise_stage (0.5)
    assert rows["stages_ms.LTX2AVDenoisingStage"].status == "fail"
    assert rows["stages_ms.LTX2RefinementStage"].status == "fail"
    assert rows["stages_ms.LTX2AVDecodingStage"].status == "pass"
    assert rows["stages_ms.LTX2UpsampleStage"].status == "fail"


# ----------------------------------------------------------------------------- real sglang 0.5.23
SGLANG = REPO / "tests" / "fixtures" / "sglang" / "0.5.23"

#: the final ``GET /v1/videos/{id}`` of the request in sana-video/server.log, whole, as sglang
#: 0.5.23 answered it (NOTES-startup.md there)
SGLANG_JOB = {
    "id": "e0c3f2d8-04c2-4f92-a59a-c208d2569db9",
    "object": "video",
    "model": "/tmp/sgl/models/tiny-sana-video",
    "status": "completed",
    "progress": 100,
    "created_at": 1796384052,
    "size": "96x64",
    "seconds": "0",
    "quality": "standard",
    "url": None,
    "urls": [None],
    "remixed_from_video_id": None,
    "completed_at": 1796384053,
    "expires_at": None,
    "error": None,
    "file_path": "/tmp/startup-cap/outputs/e0c3f2d8-04c2-4f92-a59a-c208d2569db9.mp4",
    "file_paths": ["/tmp/startup-cap/outputs/e0c3f2d8-04c2-4f92-a59a-c208d2569db9.mp4"],
    "num_outputs": 1,
    "peak_memory_mb": None,
    "inference_time_s": 0.8148129280007197,
    "revised_prompt": None,
    "action": None,
    "lidar": None,
}


def test_sglang_job_json_fields_are_read_as_what_they_are(caplog):
    """Whole-second created/completed, the pipeline's inference time, no peak on a CPU (null),
    no start: None, never 0; a value that is not a number is None with a warning naming it."""
    job = RequestOutcome(SGLANG_JOB["id"], "completed", 0.0, 1.06, 200, body=SGLANG_JOB).job
    assert (job.created_at_s, job.completed_at_s) == (1796384052, 1796384053)
    assert job.inference_time_s == 0.8148129280007197
    assert job.peak_memory_mib is None and job.started_at_s is None
    # the queued answer: nothing measured yet
    queued = job_fields({**SGLANG_JOB, "status": "queued", "completed_at": None, "inference_time_s": None})
    assert queued.completed_at_s is None and queued.inference_time_s is None
    bad = job_fields({**SGLANG_JOB, "inference_time_s": "0.8", "peak_memory_mb": -1.0})
    assert bad.inference_time_s is None and bad.peak_memory_mib is None
    assert "inference_time_s = '0.8'" in caplog.text and "peak_memory_mb = -1.0" in caplog.text
    ref = job_fields({"id": "r", "perfkit_times": {"submitted": 10.0, "started": 10.5, "completed": 11.0}})
    assert ref.started_at_s == 10.5 and ref.completed_at_s is None  # the reference engine's start


def test_diffusers_backend_gives_no_denoise_pass_from_nothing():
    """sglang's --backend diffusers writes one DiffusersExecutionStage, no steps (a real record):
    the denoise aggregates its entry carries (0.0, sglang's layout) are skipped with the reason,
    the stage itself is judged, and a denoising stage the baseline has stays a failure."""
    (rec,) = read_perf_log(SGLANG / "sana-video-diffusers").records
    assert [n for n, _ in rec.stages] == ["DiffusersExecutionStage"] and list(rec.steps) == []
    entry = bl.entry_from_records([rec])
    assert entry["expected_avg_denoise_ms"] == 0.0 and entry["denoise_step_ms"] == {}
    doc = bl.new_baseline("cpu")
    bl.set_case(doc, "sana_diffusers", entry)
    rows = {r.metric: r for r in bl.compare({"sana_diffusers": entry}, doc, profile="pr_test")}
    why = "not reported by sglang's diffusers backend: one DiffusersExecutionStage, no steps"
    for m in ("expected_avg_denoise_ms", "expected_median_denoise_ms"):
        assert rows[m].status == "skipped" and rows[m].reason == why
    assert rows["stages_ms.DiffusersExecutionStage"].status == "pass"
    assert rows["expected_e2e_ms"].status == "pass"
    native = bl.new_baseline("cpu")
    bl.set_case(
        native,
        "sana_diffusers",
        {
            "stages_ms": {"DenoisingStage": 50.0},
            "denoise_step_ms": {"0": 30.0, "1": 20.0},
            "expected_avg_denoise_ms": 25.0,
            "expected_median_denoise_ms": 25.0,
        },
    )
    rows = {r.metric: r for r in bl.compare({"sana_diffusers": entry}, native, profile="pr_test")}
    assert rows["stages_ms.DenoisingStage"].status == "fail"
    assert rows["stages_ms.DenoisingStage"].reason == "missing from run"
    assert {
        rows[m].status for m in ("denoise_step_ms.0", "denoise_step_ms.1", "expected_avg_denoise_ms")
    } == {"skipped"}


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    import torch

    from perfkit.refengine import models

    return models.save_checkpoint(
        models.build_preset("tiny", torch.float32, seed=0), tmp_path_factory.mktemp("ckpt") / "tiny-ltx"
    )


@pytest.mark.slow
def test_cold_vs_warm_through_the_sglang_adapter(tmp_path, tiny_checkpoint):
    spec = EngineSpec(
        kind="sglang",
        model_path=str(tiny_checkpoint),
        executable=[sys.executable, "-m", "perfkit.cli", "engine"],
        warmup_frames=9,
        warmup_steps=2,
        server_args=["--preset", "tiny", "--height", "64", "--width", "64", "--steps", "4"],
        startup_timeout_s=240,
    )
    req = {"num_frames": 9, "height": 64, "width": 64, "num_inference_steps": 4}
    bundle = cold_vs_warm(spec, req, repeats=3, run_dir=tmp_path)
    r = bundle.results
    assert r["error"] is None, r["error"]
    assert r["completed"] == 3

    # the sglang command line ran, with the warmup flags under sglang's names and no perf dir
    argv = bundle.meta["commands"]["session"]
    assert argv[:8] == [
        sys.executable,
        "-m",
        "perfkit.cli",
        "engine",
        "serve",
        "--model-path",
        str(tiny_checkpoint),
        "--port",
    ]
    assert argv[argv.index("--num-gpus") + 1] == "1"
    assert argv[argv.index("--warmup-num-frames") + 1] == "9"
    assert argv[argv.index("--warmup-steps") + 1] == "2"
    assert "--perf-log-dir" not in argv

    # records found by request id in the performance.log of SGLANG_PERF_LOG_DIR
    perf_log = tmp_path / "session" / "perf" / "performance.log"
    assert perf_log.exists()
    lines = bundle.records["session"]
    recs = {x.request_id: x for x in parse_lines(lines).records}
    req_df = bundle.tables["requests"]
    measured = req_df[pd.to_numeric(req_df["index"]) >= 0]
    assert len(measured) == 3
    for rid in measured["request_id"]:
        assert rid in recs and isinstance(lookup(perf_log.parent, rid), PerfRecord)
    assert (measured["status"] == "completed").all()
    assert all(math.isfinite(float(v)) for v in measured["e2e_ms"])
    # the startup warmup ran with the frames passed as --warmup-num-frames
    warm = [x for x in recs.values() if x.is_warmup]
    assert len(warm) == 1 and warm[0].perfkit["num_frames_requested"] == 9
    assert warm[0].perfkit["model_source"] == f"path:{tiny_checkpoint}"

    # the results have a penalty stage, one of the record's stages
    assert r["penalty_stage"] in {n for x in recs.values() for n, _ in x.stages}
    assert set(r["penalty_ms"]) >= {"DenoisingStage", "DecodingStage"}
    launches = bundle.tables["launches"]
    assert int(launches["warmup_frames"].iloc[0]) == 9

    # the cold start parts from the lines sglang 0.5.23 writes too ([server-load], /health 503
    # while warming), each naming its source; the perfkit marks only cross-check them
    ln = launches.iloc[0]
    # the tiny engine's warmup lasts ~0.1 s: on a loaded machine the poll can miss its 503, and
    # the warmup then comes from the marks (an optional extra source, named as such)
    assert ln["cold_start_sources"] in {
        "ready: /health answered 200 (perfkit's poll); "
        "process_start: OS: /proc/<pid>/stat starttime (10 ms ticks); "
        "models_loaded: engine log: [server-load] workers_ready_monotonic_ns; "
        f"warmup: {w}"
        for w in ("/health 503 until 200 (perfkit's poll)", "perfkit-mark warmup_done - models_loaded")
    }
    assert 0 <= ln["process_start_s"] < 1.0 < ln["models_loaded_s"] < ln["ready_s"]
    assert 0 < ln["warmup_s"] < ln["ready_s"] - ln["models_loaded_s"]
    log_text = "\n".join(bundle.logs.values())
    marks = parse_marks(log_text)
    by_marks = marks["warmup_done"] - marks["models_loaded"]
    # /health's 503 starts once uvicorn serves, after the models_loaded mark; poll every 0.2 s
    assert ln["warmup_s"] == pytest.approx(by_marks, abs=0.6), (ln["warmup_s"], by_marks)
    assert r["cold_start"]["sources"] == ln["cold_start_sources"]
    # the effective config: its server_args line agrees with its records' block
    cfg = from_sglang_log(log_text)
    assert cfg is not None and cfg.config_source == "engine log (server_args JSON)"
    assert ln["config_source"] == "engine record"
    assert (cfg.compile_active, cfg.attention_backend, cfg.offload) == (
        bool(ln["compile_active"]),
        ln["attention_backend"],
        ln["offload"],
    )

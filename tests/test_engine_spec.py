import os
import stat
import sys
from pathlib import Path

import pytest

from perfkit.engine.spec import EngineSpec


def test_reference_argv_defaults():
    spec = EngineSpec()
    assert spec.command(8123, Path("/tmp/perf")) == [
        sys.executable,
        "-m",
        "perfkit.refengine",
        "--preset",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--perf-log-dir",
        "/tmp/perf",
        "--warmup-frames",
        "17",
        "--num-gpus",
        "1",
    ]


def test_reference_argv_all_options():
    spec = EngineSpec(
        kind="reference",
        preset="tiny",
        model_path="/models/ltx",
        compile=True,
        compile_backend="aot_eager",
        compile_vae=True,
        two_stage=True,
        warmup_frames=25,
        warmup_resolution="64x96",
        height=64,
        width=96,
        steps=4,
        dtype="float32",
        device="cpu",
        num_gpus=2,
        keep_outputs=True,
        debug_leak_mib=16,
        max_frames=49,
        extra_args=["--foo", "{port}"],
    )
    argv = spec.command(9000, "/d")
    assert argv == [
        sys.executable,
        "-m",
        "perfkit.refengine",
        "--preset",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--perf-log-dir",
        "/d",
        "--model-path",
        "/models/ltx",
        "--compile",
        "--compile-backend",
        "aot_eager",
        "--compile-vae",
        "--two-stage",
        "--warmup-frames",
        "25",
        "--warmup-resolution",
        "64x96",
        "--height",
        "64",
        "--width",
        "96",
        "--steps",
        "4",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--num-gpus",
        "2",
        "--keep-outputs",
        "--debug-leak-mib",
        "16",
        "--max-frames",
        "49",
        "--foo",
        "9000",
    ]
    env = spec.env_for("/d")
    assert env["PERFKIT_PERF_LOG_DIR"] == "/d"


def test_sglang_argv_and_env():
    spec = EngineSpec(
        kind="sglang",
        model_path="Lightricks/LTX-Video",
        num_gpus=2,
        server_args=["--dit-cpu-offload", "false"],
        extra_args=["--log-level", "info"],
        env={"HF_HOME": "/cache/hf"},
    )
    assert spec.command(30000, "/runs/perf") == [
        "sglang",
        "serve",
        "--model-path",
        "Lightricks/LTX-Video",
        "--port",
        "30000",
        "--host",
        "127.0.0.1",
        "--num-gpus",
        "2",
        "--dit-cpu-offload",
        "false",
        "--log-level",
        "info",
    ]
    env = spec.env_for("/runs/perf")
    assert env["SGLANG_DIFFUSION_STAGE_LOGGING"] == "1"
    assert env["SGLANG_PERF_LOG_DIR"] == "/runs/perf"
    assert env["HF_HOME"] == "/cache/hf"


def test_sglang_python_module_executable():
    spec = EngineSpec(kind="sglang", model_path="/m", executable=[sys.executable, "-m", "sglang.cli.main"])
    assert spec.command(1, "/p")[:4] == [sys.executable, "-m", "sglang.cli.main", "serve"]


def test_command_kind_placeholders():
    spec = EngineSpec.from_dict(
        {
            "kind": "command",
            "command": ["myserver", "--port={port}", "--logs", "{perf_log_dir}", "--bind", "{host}"],
            "env": {"LOG_DIR": "{perf_log_dir}/x"},
            "extra_args": "--a 1",
        }
    )
    assert spec.command(4242, "/pl") == [
        "myserver",
        "--port=4242",
        "--logs",
        "/pl",
        "--bind",
        "127.0.0.1",
        "--a",
        "1",
    ]
    env = spec.env_for("/pl")
    assert env["LOG_DIR"] == "/pl/x"
    assert env["SGLANG_PERF_LOG_DIR"] == "/pl"


def test_roundtrip_dict():
    spec = EngineSpec(kind="command", command_template=["x", "{port}"], env={"A": "1"}, port=8000)
    d = spec.to_dict()
    assert d["command"] == ["x", "{port}"]
    assert EngineSpec.from_dict(d) == spec
    ref = EngineSpec(compile=True, warmup_resolution="64x64")
    assert EngineSpec.from_dict(ref.to_dict()) == ref


@pytest.mark.parametrize(
    "kwargs, field, text",
    [
        ({"warmup_frames": -1}, "warmup_frames", "must be >= 0, got -1"),
        ({"kind": "vllm"}, "kind", "must be one of"),
        ({"num_gpus": 0}, "num_gpus", "must be >= 1"),
        ({"warmup_resolution": "64"}, "warmup_resolution", "64x64"),
        ({"height": 0}, "height", ">= 1"),
        ({"compile": "yes"}, "compile", "bool"),
        ({"port": 70000}, "port", "1..65535"),
        ({"startup_timeout_s": 0}, "startup_timeout_s", "> 0"),
        ({"health_path": "health"}, "health_path", "start with '/'"),
        ({"kind": "command"}, "command", "required"),
        ({"kind": "sglang"}, "model_path", "required"),
        ({"debug_leak_mib": -5}, "debug_leak_mib", ">= 0"),
    ],
)
def test_validation_names_field(kwargs, field, text):
    with pytest.raises(ValueError) as ei:
        EngineSpec(**kwargs)
    msg = str(ei.value)
    assert f"EngineSpec.{field}" in msg and text in msg


def test_exact_validation_message():
    with pytest.raises(ValueError, match=r"^EngineSpec.warmup_frames must be >= 0, got -1$"):
        EngineSpec.from_dict({"warmup_frames": -1})


def test_from_dict_unknown_key():
    with pytest.raises(ValueError, match="unknown field.*warmpu_frames"):
        EngineSpec.from_dict({"warmpu_frames": 17})


def test_sglang_check_missing_executable(tmp_path):
    spec = EngineSpec(
        kind="sglang", model_path=str(tmp_path), executable=["sglang-definitely-not-installed-xyz"]
    )
    with pytest.raises(FileNotFoundError, match="not on PATH"):
        spec.check()


def test_sglang_check_missing_model_path(tmp_path):
    exe = tmp_path / "sglang"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    spec = EngineSpec(kind="sglang", model_path=str(tmp_path / "no-such-model"), executable=[str(exe)])
    with pytest.raises(FileNotFoundError, match="model_path.*does not exist"):
        spec.check()
    # an existing directory and a hub id pass
    EngineSpec(kind="sglang", model_path=str(tmp_path), executable=[str(exe)]).check()
    EngineSpec(kind="sglang", model_path="Lightricks/LTX-Video", executable=[str(exe)]).check()


def test_sglang_check_on_path(tmp_path, monkeypatch):
    exe = tmp_path / "sglang"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    EngineSpec(kind="sglang", model_path=str(tmp_path)).check()

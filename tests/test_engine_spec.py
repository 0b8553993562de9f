import os
import stat
import sys
from pathlib import Path

import pytest

from perfkit.engine.spec import CommandEngine, EngineSpec, EngineSpecError, ReferenceEngine, SglangEngine


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
        "--output-path",  # sglang's default is relative to its cwd: the launch's dir instead
        "/runs/outputs",
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
        ({"warmup_frames": -1}, "warmup_frames", "greater than or equal to 0, got -1"),
        ({"warmup_frames": "abc"}, "warmup_frames", "valid integer, got 'abc'"),
        ({"warmup_frames": True}, "warmup_frames", "valid integer, got True"),
        ({"kind": "vllm"}, "kind", "must be one of reference, sglang, command, got 'vllm'"),
        ({"num_gpus": 0}, "num_gpus", "greater than or equal to 1"),
        ({"warmup_resolution": "64"}, "warmup_resolution", "should match pattern"),
        ({"height": 0}, "height", "greater than or equal to 1"),
        ({"compile": "yes"}, "compile", "valid boolean"),
        ({"port": 70000}, "port", "less than or equal to 65535"),
        ({"startup_timeout_s": 0}, "startup_timeout_s", "greater than 0"),
        ({"startup_timeout_s": "1e3"}, "startup_timeout_s", "valid number"),
        ({"health_path": "health"}, "health_path", "should match pattern '^/'"),
        ({"kind": "command"}, "command", "required for kind 'command'"),
        ({"kind": "command", "command": []}, "command", "at least 1 item"),
        ({"kind": "sglang"}, "model_path", "required for kind 'sglang'"),
        ({"kind": "sglang", "model_path": "m/x", "executable": []}, "executable", "at least 1 item"),
        ({"debug_leak_mib": -5}, "debug_leak_mib", "greater than or equal to 0"),
        (
            {"kind": "sglang", "model_path": "m/x", "server_args": ["--x", None]},
            "server_args.1",
            "valid string",
        ),
        ({"warmup_mode": "eager"}, "warmup_mode", "Input should be 'off' or 'server'"),
        ({"warmup_mode": "request"}, "warmup_mode", "'request' is only supported by kind 'sglang'"),
        (
            {"kind": "sglang", "model_path": "m/x", "warmup_frames": 0, "warmup_mode": "server"},
            "warmup_mode",
            "'server' contradicts warmup_frames=0",
        ),
    ],
)
@pytest.mark.parametrize("build", ["constructor", "from_dict"])
def test_validation_names_field(kwargs, field, text, build):
    with pytest.raises(EngineSpecError) as ei:
        EngineSpec(**kwargs) if build == "constructor" else EngineSpec.from_dict(kwargs)
    msg = str(ei.value)
    assert msg.startswith(f"EngineSpec.{field}: ") and text in msg, msg
    assert isinstance(ei.value, ValueError)
    assert ei.value.problems[0][0] == field


def test_exact_validation_message():
    with pytest.raises(
        ValueError, match=r"^EngineSpec.warmup_frames: Input should be greater than or equal to 0, got -1$"
    ):
        EngineSpec.from_dict({"warmup_frames": -1})


def test_every_problem_is_named():
    with pytest.raises(EngineSpecError) as ei:
        EngineSpec(warmup_frames=-1, port=0, compil=True)
    assert sorted(f for f, _ in ei.value.problems) == ["compil", "port", "warmup_frames"]
    assert len(str(ei.value).splitlines()) == 3


@pytest.mark.parametrize("build", [EngineSpec.from_dict, lambda d: EngineSpec(**d)])
def test_unknown_key_did_you_mean(build):
    with pytest.raises(
        ValueError,
        match=r"^EngineSpec.warmpu_frames: unknown field for kind 'reference' \(did you mean 'warmup_frames'\?\)$",
    ):
        build({"warmpu_frames": 17})
    with pytest.raises(
        ValueError, match=r"EngineSpec.server_arg: unknown field for kind 'sglang'.*'server_args'"
    ):
        build({"kind": "sglang", "model_path": "m/x", "server_arg": []})


def test_field_of_another_kind_is_named():
    # a sglang-only field on a reference spec
    with pytest.raises(
        EngineSpecError,
        match=r"^EngineSpec.server_args: unknown field for kind 'reference' \(a field of kind 'sglang'\)$",
    ):
        EngineSpec(server_args=["--dit-layerwise-offload"])
    # a reference-only field on a sglang spec
    with pytest.raises(EngineSpecError, match=r"EngineSpec.preset: .*a field of kind 'reference'"):
        EngineSpec.from_dict({"kind": "sglang", "model_path": "m/x", "preset": "tiny"})
    # serving fields are not the command kind's
    with pytest.raises(EngineSpecError, match=r"EngineSpec.warmup_frames: .*kind 'reference' and 'sglang'"):
        EngineSpec(kind="command", command=["srv"], warmup_frames=25)


def test_command_spellings():
    a = EngineSpec(kind="command", command=["srv", "{port}"])
    b = EngineSpec(kind="command", command_template="srv {port}")
    assert a == b and a.command_template == ["srv", "{port}"]
    with pytest.raises(
        EngineSpecError, match="EngineSpec.command: give either 'command' or 'command_template'"
    ):
        EngineSpec.from_dict({"kind": "command", "command": ["a"], "command_template": ["b"]})


def test_kinds_and_isinstance():
    assert type(EngineSpec()) is ReferenceEngine
    assert type(EngineSpec(kind="sglang", model_path="m/x")) is SglangEngine
    assert type(EngineSpec.from_dict({"kind": "command", "command": ["x"]})) is CommandEngine
    assert type(SglangEngine(model_path="m/x")) is SglangEngine
    for spec in (EngineSpec(), SglangEngine(model_path="m/x"), CommandEngine(command=["x"])):
        assert isinstance(spec, EngineSpec)
    # a kind's own class names its own errors
    with pytest.raises(EngineSpecError, match="^EngineSpec.model_path: required for kind 'sglang'$"):
        SglangEngine()


def test_list_and_env_inputs_from_yaml():
    spec = EngineSpec.from_dict(
        {
            "kind": "sglang",
            "model_path": "m/x",
            "server_args": ["--ulysses-degree", 2],
            "executable": "python -m sglang.cli.main",
            "env": {"CUDA_VISIBLE_DEVICES": 0},
        }
    )
    assert spec.server_args == ["--ulysses-degree", "2"]
    assert spec.executable == ["python", "-m", "sglang.cli.main"]
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert EngineSpec(startup_timeout_s=5).startup_timeout_s == 5.0


def test_replace_validates():
    spec = EngineSpec(compile=True)
    two = spec.replace(two_stage=True)
    assert two.two_stage and two.compile and not spec.two_stage
    assert type(two) is ReferenceEngine
    with pytest.raises(EngineSpecError, match="EngineSpec.warmup_frames: .*greater than or equal to 0"):
        spec.replace(warmup_frames=-1)
    with pytest.raises(EngineSpecError, match="EngineSpec.warmup_frames: unknown field for kind 'command'"):
        EngineSpec(kind="command", command=["x"]).replace(warmup_frames=25)
    cmd = EngineSpec(kind="command", command=["x"]).replace(command=["y"], port=9)
    assert cmd.command_template == ["y"] and cmd.port == 9


def test_assignment_is_validated():
    spec = EngineSpec()
    with pytest.raises(ValueError, match="warmup_frames"):
        spec.warmup_frames = -1


def test_to_dict_has_the_kinds_fields_only():
    assert "server_args" not in EngineSpec().to_dict()
    d = EngineSpec(kind="sglang", model_path="m/x").to_dict()
    assert d["kind"] == "sglang" and "preset" not in d and d["executable"] == ["sglang"]
    assert set(EngineSpec(kind="command", command=["x"]).to_dict()) >= {"command", "env", "port"}


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


def test_reference_debug_stage_delay_reaches_the_engine_argv():
    spec = EngineSpec.from_dict(
        {"kind": "reference", "debug_stage_delay": {"DenoisingStage": "30%"}, "debug_stage_delay_from": 1}
    )
    assert spec.debug_stage_delay == {"DenoisingStage": 30.0}
    argv = spec.command(9000, "/d")
    i = argv.index("--debug-stage-delay")
    assert argv[i : i + 4] == ["--debug-stage-delay", "DenoisingStage=30%", "--debug-stage-delay-from", "1"]
    assert EngineSpec.from_dict(spec.to_dict()) == spec
    assert "--debug-stage-delay" not in EngineSpec(kind="reference").command(9000, "/d")
    with pytest.raises(EngineSpecError, match=r"debug_stage_delay\.Denoising.*DenoisingStage"):
        EngineSpec.from_dict({"debug_stage_delay": {"Denoising": 30}})
    with pytest.raises(EngineSpecError, match="expected a percent"):
        EngineSpec.from_dict({"debug_stage_delay": {"DenoisingStage": "lots"}})
    with pytest.raises(EngineSpecError, match="greater than or equal to 0"):
        EngineSpec.from_dict({"debug_stage_delay": {"DenoisingStage": -5}})


def test_reference_cpu_threads_reaches_the_engine_argv():
    spec = EngineSpec.from_dict({"kind": "reference", "cpu_threads": 1})
    argv = spec.command(9000, "/d")
    assert argv[argv.index("--cpu-threads") + 1] == "1"
    assert EngineSpec.from_dict(spec.to_dict()) == spec
    assert "--cpu-threads" not in EngineSpec(kind="reference").command(9000, "/d")
    with pytest.raises(EngineSpecError, match="cpu_threads.*greater than or equal to 1"):
        EngineSpec.from_dict({"cpu_threads": 0})


def test_reference_memory_snapshot_flows_to_argv():
    spec = EngineSpec(kind="reference", memory_snapshot_after=[3, 0, 3], memory_snapshot_entries=500)
    argv = spec.command(9000, "/d")
    i = argv.index("--memory-snapshot-after")
    assert argv[i : i + 4] == ["--memory-snapshot-after", "0,3", "--memory-snapshot-entries", "500"]
    assert "--memory-snapshot-after" not in EngineSpec(kind="reference").command(9000, "/d")


def test_sglang_relative_paths_that_exist_become_absolute(tmp_path, monkeypatch):
    # the notebooks run in the run directory: params/sglang-cpu.yaml's relative paths (from the
    # repo root) failed there as "'.sglang-venv/bin/sglang' is not on PATH" (a new user's run)
    (tmp_path / ".v/bin").mkdir(parents=True)
    (tmp_path / ".v/bin/sglang").write_text("#!/bin/sh\n")
    (tmp_path / "m/tiny-sana-video").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    s = EngineSpec.from_dict(
        {"kind": "sglang", "model_path": "m/tiny-sana-video", "executable": [".v/bin/sglang"]}
    )
    assert s.model_path == str(tmp_path / "m/tiny-sana-video") and s.executable == [
        str(tmp_path / ".v/bin/sglang")
    ]
    hub = EngineSpec.from_dict({"kind": "sglang", "model_path": "org/name", "executable": ["sglang"]})
    assert hub.model_path == "org/name" and hub.executable == ["sglang"]  # not local: as written


def test_engine_versions_are_read_in_the_engines_own_python(tmp_path):
    """The report names the torch the engine ran, not perfkit's: the versions come from the
    interpreter of the command (``python -m ...`` or a console script's ``#!`` line)."""
    import importlib.metadata

    from perfkit.engine.argv import engine_versions

    torch_v = importlib.metadata.version("torch")
    direct = engine_versions([sys.executable, "-m", "perfkit.refengine"])
    assert direct["torch"] == torch_v and direct["sglang"] is None
    script = tmp_path / "serve"
    script.write_text(f"#!{sys.executable}\nprint('hi')\n")
    script.chmod(0o755)
    assert engine_versions([str(script), "serve"])["torch"] == torch_v
    shell = tmp_path / "wrapper"
    shell.write_text("#!/bin/sh\nexec true\n")
    shell.chmod(0o755)
    assert "no Python interpreter" in engine_versions([str(shell)])["error"]


def test_a_launch_failure_says_the_logs_last_error_first():
    """A wrong model directory name: sglang exits after loading with the cause in a traceback's
    last line; the launch error carries that line, not only the log's tail."""
    from perfkit.engine.launch import error_line

    tail = (
        "[12-04 14:50:01] Loading pipeline modules\nTraceback (most recent call last):\n"
        '  File "registry.py", line 698, in _get_config_info\n'
        "ValueError: Could not get model info for '/m/tiny-model'\n[12-04 14:50:02] shutting down\n"
    )
    assert error_line(tail) == "ValueError: Could not get model info for '/m/tiny-model'"
    assert error_line("all fine\nready\n") is None
    # a new user's renamed SANA-Video directory: the error sglang recovered from is on stderr,
    # what ended it on stdout (EngineHandle.tail: stdout's lines, then stderr's)
    both = (
        "[stdout]\n[12-04 16:31:02] Server warmup failed; aborting startup: Encoded prompt has 211 "
        "tokens, expected at least 300\n[stderr]\nAttributeError: 'SanaVAEConfig' object has no "
        "attribute 'shift_factor'\n  falling back to native version\n"
    )
    assert error_line(both).startswith("[12-04 16:31:02] Server warmup failed; aborting startup: Encoded")

"""The reference engine end to end: real server processes, real HTTP, real performance.log records.

One plain engine is shared by the module (``plain``); tests that need other flags start their own.
Compiling tests use ``--compile-backend aot_eager`` (inductor takes ~37 s on the 2-core runner).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.handle import parse_server_load
from perfkit.readings.engine_config import from_record, from_sglang_log, server_args
from refengine_helpers import running_engine, spec

pytestmark = pytest.mark.slow

ALL_STAGES = ["TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage"]
COMPILE = ("--compile", "--compile-backend", "aot_eager")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("plain")) as eng:
        yield eng


@pytest.fixture
def client(plain):
    with plain.client() as c:
        yield c


def _ok(out):
    assert out.ok, f"{out.status}: {out.error}"
    assert out.record is not None, f"no performance.log line for {out.request_id}"
    return out.record


# -- one request ----------------------------------------------------------------------------------


def test_request_record_has_stages_steps_and_latent_facts(client):
    rec = _ok(client.generate(spec(25, steps=4)))
    assert [name for name, _ in rec.stages] == ALL_STAGES
    assert all(ms > 0 for _, ms in rec.stages)
    assert len(rec.steps) == 4 and all(s > 0 for s in rec.steps)
    assert rec.tag == "request" and not rec.is_warmup
    assert rec.total_duration_ms and rec.total_duration_ms >= sum(rec.steps)
    pk = rec.perfkit
    assert pk["status"] == "completed"
    assert pk["latent_frames"] == 4
    assert pk["num_frames_effective"] == 25
    assert pk["num_frames_requested"] == 25
    assert (pk["height"], pk["width"], pk["num_inference_steps"]) == (64, 64, 4)
    assert pk["latent_shape"][1:] == [4, 2, 2]
    assert pk["compiles"] == 0 and pk["recompile_limit_hit"] is False


def test_frames_are_aligned_to_8k_plus_1(client):
    rec = _ok(client.generate(spec(24)))
    assert rec.perfkit["num_frames_requested"] == 24
    assert rec.perfkit["num_frames_effective"] == 25
    assert rec.perfkit["latent_frames"] == 4


def test_warmup_run_is_recorded_with_tag_warmup(plain):
    warm = [r for r in plain.records() if r.is_warmup]
    assert len(warm) == 1
    w = warm[0]
    assert w.tag == "warmup"
    assert w.perfkit["num_frames_effective"] == 17 and w.perfkit["latent_frames"] == 3
    assert len(w.steps) == 2  # --warmup-steps default
    assert [name for name, _ in w.stages] == ALL_STAGES
    # the warmup is the first line: written before the server became ready
    assert plain.records()[0].is_warmup


def test_startup_lines_are_sglangs(plain):
    """The engine logs sglang 0.5.23's ``server_args: {JSON}`` and ``[server-load]`` lines: its
    config reads from the line alone (no record block needed) and agrees with the block."""
    text = plain.stderr_text()
    args, form = server_args(text)
    assert form == "server_args JSON" and args["warmup_mode"] == "server"
    assert (args["warmup_num_frames"], args["warmup_steps"], args["port"]) == (17, 2, plain.port)
    cfg = from_sglang_log(text)
    rec = from_record(plain.records()[0].perfkit)
    assert cfg.config_source == "engine log (server_args JSON)" and rec.config_source == "engine record"
    assert (cfg.compile_active, cfg.attention_backend, cfg.offload) == (
        rec.compile_active,
        rec.attention_backend,
        rec.offload,
    )
    ns = parse_server_load(text)
    assert ns is not None and 0 < ns < time.monotonic_ns()  # the host's monotonic clock
    # logged once the models loaded, before the warmup (which runs once HTTP serves)
    assert (
        text.index("perfkit-mark models_loaded")
        < text.index("[server-load]")
        < text.index("perfkit-mark warmup_done")
    )


# -- bad requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_frames", 0),
        ("height", 65),
        ("num_inference_steps", 0),
        ("num_inference_steps", 10**12),
        ("num_frames", "abc"),
    ],
)
def test_bad_request_is_4xx_naming_the_field_and_server_stays_up(client, field, value):
    body = spec().payload()
    body[field] = value
    resp = httpx.post(client.base_url + "/v1/videos", json=body)
    assert 400 <= resp.status_code < 500, resp.text
    err = resp.json()["error"]
    assert field in err["message"]
    assert field in err["fields"]
    # the same through the client: a rejected outcome naming the field
    bad = client.generate(VideoRequestSpec(**{**_spec_fields(), field: value}))
    assert bad.status == "rejected" and 400 <= bad.http_status < 500
    assert field in (bad.error or "")
    # and the next good request succeeds
    _ok(client.generate(spec(17, steps=2)))


def _spec_fields():
    s = spec()
    return {k: getattr(s, k) for k in ("num_frames", "height", "width", "num_inference_steps")}


# -- concurrency ----------------------------------------------------------------------------------


def test_two_concurrent_requests_complete_with_intact_lines(plain):
    outs: dict[int, object] = {}
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            with plain.client() as c:
                outs[i] = c.generate(spec(25, seed=i))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(outs) == 2
    ids = set()
    for out in outs.values():
        _ok(out)
        ids.add(out.request_id)
    assert len(ids) == 2
    lines = plain.perf_log_lines()
    objs = [json.loads(line) for line in lines]  # every line is one whole JSON object
    logged = [o["request_id"] for o in objs]
    assert all(logged.count(i) == 1 for i in ids)
    # one run at a time: the two runs' spans do not overlap
    a, b = sorted((out.record.perfkit["t_start"], out.record.perfkit["t_end"]) for out in outs.values())
    assert a[1] <= b[0]


# -- other endpoints ------------------------------------------------------------------------------


def test_unknown_video_is_404(client):
    r = httpx.get(client.base_url + "/v1/videos/unknown")
    assert r.status_code == 404
    assert "unknown" in r.json()["error"]["message"]


def test_models_lists_the_model(client):
    r = httpx.get(client.base_url + "/v1/models")
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["preset:tiny"]
    assert data[0]["preset"] == "tiny" and data[0]["placement"] == "cpu"


def test_health_is_200_when_ready(client):
    assert client.health()


# -- compile: warmup shape coverage --------------------------------------------------------------


def test_uncovered_shape_recompiles_on_first_request(tmp_path):
    with running_engine(tmp_path, *COMPILE, "--warmup-frames", "17") as eng, eng.client() as c:
        warm = [r for r in eng.records() if r.is_warmup]
        assert len(warm) == 1 and warm[0].perfkit["compiles"] >= 1  # the warmup compiled 17 frames
        first = _ok(c.generate(spec(25)))
        second = _ok(c.generate(spec(25)))
    p1, p2 = first.perfkit, second.perfkit
    assert p1["compiles"] >= 1, p1
    assert p1["compile_ms"] > 0
    assert any("size mismatch" in r for r in p1["recompile_reasons"]), p1["recompile_reasons"]
    assert p1["recompile_limit_hit"] is False
    # what the recompile is made of: torch's compile timers inside the request (ms), nested
    ph = p1["compile_phases_ms"]
    assert 0 < ph["bytecode_tracing"] < ph["_compile.compile_inner"] <= p1["compile_ms"] * 1.05, ph
    assert 0 < ph["OutputGraph.call_user_compiler"] < ph["_compile.compile_inner"], ph
    assert p2["compiles"] == 0 and p2["recompile_reasons"] == [] and p2["compile_phases_ms"] == {}
    assert first.total_duration_ms > second.total_duration_ms
    assert first.stage_ms()["DenoisingStage"] > second.stage_ms()["DenoisingStage"]


def test_covered_shape_does_not_recompile(tmp_path):
    with running_engine(tmp_path, *COMPILE, "--warmup-frames", "25") as eng, eng.client() as c:
        first = _ok(c.generate(spec(25)))
    assert first.perfkit["compiles"] == 0, first.perfkit
    assert first.perfkit["recompile_reasons"] == []


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_recompile_limit_below_one_is_refused_before_the_engine_starts(value):
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.refengine", "--compile", "--recompile-limit", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"argument --recompile-limit: expected a whole number >= 1, got '{value}'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_recompile_limit_hit_is_recorded(tmp_path):
    with (
        running_engine(tmp_path, *COMPILE, "--recompile-limit", "1", "--warmup-frames", "17") as eng,
        eng.client() as c,
    ):
        recs = [_ok(c.generate(spec(n))) for n in (17, 25, 33)]
        stderr = eng.stderr_text()
    assert "hit config.recompile_limit" in stderr  # what torch itself logs
    hit = [r for r in recs if r.perfkit["recompile_limit_hit"]]
    assert hit, [r.perfkit["recompile_reasons"] for r in recs]
    # the first uncovered shape (25) hits a limit of 1 (the warmup's 17-frame graph is the one entry)
    assert recs[1].perfkit["recompile_limit_hit"] is True
    assert any("recompile_limit" in reason for reason in recs[1].perfkit["recompile_reasons"])
    # the limit message is recorded once, not once per logger it passes through
    assert sum("recompile_limit" in reason for reason in recs[1].perfkit["recompile_reasons"]) == 1
    # past the limit torch runs the frame eagerly: nothing compiles
    assert recs[1].perfkit["compiles"] == 0 and recs[2].perfkit["compiles"] == 0
    assert recs[0].perfkit["recompile_limit_hit"] is False


# -- two-stage ------------------------------------------------------------------------------------


def test_two_stage_records_upsample_and_refinement(tmp_path):
    with running_engine(tmp_path, "--two-stage", "--warmup-frames", "0") as eng, eng.client() as c:
        rec = _ok(c.generate(spec(25, steps=4)))
    names = [n for n, _ in rec.stages]
    assert names == [
        "TextEncodingStage",
        "LatentPreparationStage",
        "DenoisingStage",
        "UpsampleStage",
        "RefinementStage",
        "DecodingStage",
    ]
    assert len(rec.steps) == 4
    assert len(rec.perfkit["refinement_steps"]) == 2  # --refine-steps default
    assert rec.perfkit["two_stage"] is True
    assert rec.perfkit["latent_shape"][1:] == [4, 2, 2]  # refined at full resolution


# -- leak check -----------------------------------------------------------------------------------


def test_debug_leak_grows_host_anon_by_the_leak(tmp_path):
    leak = 64
    with running_engine(tmp_path, "--debug-leak-mib", str(leak)) as eng, eng.client() as c:
        # a first request allocates the 25-frame working set; measure the ones after it
        _ok(c.generate(spec(25)))
        recs = [_ok(c.generate(spec(25))) for _ in range(3)]
    anon = [r.perfkit["host_anon_mib"] for r in recs]
    deltas = [b - a for a, b in zip(anon, anon[1:])]
    for d in deltas:
        assert 0.75 * leak <= d <= 1.5 * leak, (anon, deltas)


# -- request API: sglang's fields, unknown fields, the effective frame count -----------------------


def test_unknown_field_is_400_naming_it(client):
    body = {**spec().payload(), "num_frame": 24}
    resp = httpx.post(client.base_url + "/v1/videos", json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["fields"] == ["num_frame"]
    assert err["message"] == "num_frame: unknown field (did you mean 'num_frames'?)"


def test_invalid_json_is_400_naming_the_body_and_the_character(client):
    resp = httpx.post(
        client.base_url + "/v1/videos",
        content=b'{"prompt": "a cat",',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["fields"] == ["body"]
    assert err["message"].startswith("body: invalid JSON at character 19: "), err["message"]
    # the engine keeps serving
    assert httpx.get(client.base_url + "/health").status_code == 200


def test_every_sglang_video_field_is_accepted_and_the_answer_echoes_effective_frames(client):
    from perfkit.refengine.server import SGLANG_VIDEO_FIELDS

    body = {
        "prompt": "a cat",
        "input_reference": "/tmp/cat.png",
        "reference_url": "https://example.invalid/cat.png",
        "video_path": "/tmp/in.mp4",
        "video_url": "https://example.invalid/in.mp4",
        "model": "tiny",
        "n": 1,
        "num_outputs_per_prompt": 1,
        "seconds": 1,
        "size": "64x64",
        "fps": 24,
        "num_frames": 24,
        "seed": [7],
        "generator_device": "cpu",
        "width": 64,
        "height": 64,
        "num_inference_steps": 2,
        "guidance_scale": 3.0,
        "guidance_scale_2": 2.0,
        "true_cfg_scale": 1.5,
        "negative_prompt": "blurry",
        "max_sequence_length": 128,
        "flow_shift": 3.0,
        "enable_teacache": True,
        "enable_frame_interpolation": False,
        "frame_interpolation_exp": 1,
        "frame_interpolation_scale": 1.0,
        "frame_interpolation_model_path": None,
        "enable_upscaling": False,
        "upscaling_model_path": None,
        "upscaling_scale": 4,
        "output_quality": "high",
        "output_compression": 90,
        "output_path": "/tmp/out",
        "diffusers_kwargs": {"foo": 1},
        "task": "t2v",
        "conditions": [],
        "target": {"short_edge": 64},
        "audio_flow_shift": 1.0,
        "perf_dump_path": "/tmp/dump.json",
        "profile": False,
        "num_profiled_timesteps": 2,
        "profile_all_stages": False,
    }
    assert sorted(body) == sorted(SGLANG_VIDEO_FIELDS)  # the test sends every one
    resp = httpx.post(client.base_url + "/v1/videos", json=body)
    assert resp.status_code == 200, resp.text
    ans = resp.json()
    assert ans["num_frames"] == 25 and ans["num_frames_requested"] == 24
    assert ans["alignment_note"] == "num_frames 24 aligned up to 25 (LTX: 8k+1 frames)"
    assert (ans["height"], ans["width"], ans["num_inference_steps"]) == (64, 64, 2)
    # what the engine does not implement is said, not silently dropped
    assert "enable_teacache" in ans["ignored_fields"] and "input_reference" in ans["ignored_fields"]
    assert "num_frames" not in ans["ignored_fields"] and "seed" not in ans["ignored_fields"]
    rec = client.wait_record(ans["id"], timeout_s=120)
    assert rec is not None and rec.perfkit["num_frames_effective"] == 25
    assert rec.perfkit["ignored_fields"] == ans["ignored_fields"]


def test_seconds_gives_frames_when_num_frames_is_absent(client):
    body = {"prompt": "a cat", "seconds": 1, "fps": 8, "height": 64, "width": 64, "num_inference_steps": 1}
    ans = httpx.post(client.base_url + "/v1/videos", json=body).json()
    assert (ans["num_frames_requested"], ans["num_frames"]) == (8, 9), ans
    bad = httpx.post(client.base_url + "/v1/videos", json={**body, "seconds": 100})
    assert bad.status_code == 400 and bad.json()["error"]["fields"] == ["seconds"]


@pytest.mark.parametrize("field,value", [("n", 2), ("seed", [1, 2])])
def test_what_the_engine_cannot_honour_is_400_naming_it(client, field, value):
    resp = httpx.post(client.base_url + "/v1/videos", json={**spec().payload(), field: value})
    assert resp.status_code == 400 and resp.json()["error"]["fields"] == [field], resp.text


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"profile": "yes"}, "profile"),
        ({"profile": 1}, "profile"),
        ({"profile_all_stages": "no"}, "profile_all_stages"),
        ({"profile": True, "num_profiled_timesteps": "5"}, "num_profiled_timesteps"),
        ({"profile": True, "num_profiled_timesteps": True}, "num_profiled_timesteps"),
        ({"profile": True, "num_profiled_timesteps": 10**12}, "num_profiled_timesteps"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
    ],
)
def test_a_mistyped_profiling_field_is_400_naming_it(client, extra, field):
    """Found by the breaker: "yes", 1, "5", true and 10**12 were read as true, true, 5, 1 and
    10**12 (a request queued as profiled, its trace named ``1000000000000_steps``); a NaN
    guidance_scale passed "must be >= 0" and ran."""
    body = json.dumps({**spec(9, steps=2).payload(), **extra})  # NaN as Python's JSON writes it
    resp = httpx.post(
        client.base_url + "/v1/videos", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400 and resp.json()["error"]["fields"] == [field], resp.text
    _ok(client.generate(spec(9, steps=2)))  # and the server keeps serving


# -- injected slowdown (test-only) ----------------------------------------------------------------


def test_debug_stage_delay_scales_the_stage_from_the_nth_measured_request(tmp_path):
    # +100 % DenoisingStage from measured request 3 on: the startup warmup and requests 0-2 run at
    # full speed, 3-5 do twice the denoising work (per step), other stages untouched. Asserted on
    # CPU time, which other processes on a shared runner do not stretch: with one torch thread a
    # span's wall time is at least the CPU time spent in it (--cpu-threads 1, which the record
    # shows: torch's own default here would be the runner's cores).
    args = (
        "--debug-stage-delay",
        "DenoisingStage=100%",
        "--debug-stage-delay-from",
        "3",
        "--cpu-threads",
        "1",
    )
    # OMP_NUM_THREADS=1 as well, as the tiny A/B specs: without it the OpenMP pool torch made at
    # import runs beside the one torch thread, and a CI run measured the busy work at 1.29x its
    # target (15.6 ms of work, 20.1 ms busy)
    with running_engine(tmp_path, *args, env={"OMP_NUM_THREADS": "1"}) as eng, eng.client() as c:
        recs = [_ok(c.generate(spec(25, steps=8))) for _ in range(6)]
        warmup = [r for r in eng.records() if r.is_warmup]
    # the engine says which runs it slowed: never the startup warmup, measured requests from 3 on
    assert len(warmup) == 1 and warmup[0].perfkit["debug_stage_delay_applied"] is False
    assert [r.perfkit["debug_stage_delay_applied"] for r in recs] == [False] * 3 + [True] * 3
    assert all("debug_stage_delay_ms" not in r.perfkit for r in [*warmup, *recs[:3]])
    for r in recs[3:]:
        added = r.perfkit["debug_stage_delay_ms"]
        assert list(added) == ["DenoisingStage"]  # no other stage got busy work
        work, busy = added["DenoisingStage"]
        assert 0.95 <= busy / work <= 1.15, (work, busy)  # +100 % of the stage's own work
        # inside the stage's span and inside its steps, not after them
        assert dict(r.stages)["DenoisingStage"] >= 0.98 * (work + busy), (r.stages, work, busy)
        assert sum(r.steps) >= 0.98 * (work + busy), (r.steps, work, busy)
    assert recs[0].perfkit["torch_threads"] == 1 and recs[0].perfkit["cpu_threads_requested"] == 1
    assert recs[0].perfkit["debug_stage_delay_pct"] == {"DenoisingStage": 100.0}
    assert recs[0].perfkit["debug_stage_delay_from"] == 3


def test_debug_stage_delay_is_refused_when_malformed(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "perfkit.refengine", "--debug-stage-delay", "DenoisingStage"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "expected STAGE=PCT" in out.stderr


@pytest.mark.parametrize("flag", ["--steps", "--warmup-steps", "--height", "--width"])
def test_a_zero_size_or_step_count_exits_2_before_torch(flag):
    """Found reading the code: ``--warmup-steps 0`` divided by zero in the warmup (exit 3) and
    ``--steps 0``/``--height 0``/``--width 0`` fell back to the preset's value silently; 10**30 of
    each hung or crashed in torch after the models loaded (a breaker's find)."""
    import subprocess
    import sys

    code = (
        "import sys; from perfkit.refengine.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    for value, says in (
        ("0", ">= 1, got 0"),
        (str(10**30), f"<= {'10000' if 'steps' in flag else '16384'}, got 1"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, flag, value], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out.stderr
        assert f"{flag} must be {says}" in out.stderr
        assert "Traceback" not in out.stderr


def test_cpu_threads_past_the_hosts_cpus_exits_2_before_torch():
    """Found probing: ``--cpu-threads 1000000000`` started the engine and libgomp died at the
    first parallel region (exit 1, no word of the option); now exit 2 naming it, before torch."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; from perfkit.refengine.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "--device", "cpu", "--cpu-threads", "1000000000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    cores = os.cpu_count()
    assert f"--cpu-threads must be <= this host's {cores} logical CPUs, got 1000000000" in out.stderr
    assert "Traceback" not in out.stderr


def test_compile_kwargs_pass_the_recompile_limit_only_where_torch_compile_takes_it():
    from perfkit.refengine.cli import compile_kwargs

    def compile_2_11(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None):
        """torch 2.11's torch.compile keywords (no recompile_limit)."""

    # the installed torch (2.13) takes it; torch 2.11's signature does not, and the H200 engine
    # died with TypeError when it was passed
    assert compile_kwargs("inductor", 1024) == {
        "dynamic": False,
        "backend": "inductor",
        "recompile_limit": 1024,
    }
    assert compile_kwargs("inductor", 1024, compile_2_11) == {"dynamic": False, "backend": "inductor"}
    assert compile_kwargs("eager", None) == {"dynamic": False, "backend": "eager"}
    for limit in (0, -5, True, "8", 8.5):
        with pytest.raises(ValueError, match="recompile_limit must be a positive integer"):
            compile_kwargs("inductor", limit)
    for backend in (None, ""):
        with pytest.raises(ValueError, match="compile backend must be a non-empty name"):
            compile_kwargs(backend, None)

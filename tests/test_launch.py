"""Launch tests with real processes (tests/fake_engine.py)."""

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

import fake_engine
from perfkit.engine.client import VideoClient, VideoRequestSpec
from perfkit.engine.handle import (
    LaunchClock,
    WarmupShape,
    cold_start_parts,
    parse_server_load,
    parse_warmup_shapes,
    sources_text,
)
from perfkit.engine.launch import (
    EngineStartError,
    PortInUseError,
    launch,
    parse_marks,
    started_processes,
    surviving,
)
from perfkit.engine.spec import EngineSpec


def fake(*args: str, **kw) -> EngineSpec:
    kw.setdefault("startup_timeout_s", 20)
    return EngineSpec(
        kind="command",
        command_template=fake_engine.command(*args),
        **kw,
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_launch_ready_cold_start_and_teardown(tmp_path):
    n0 = len(started_processes())
    with launch(fake("--child", "--escape-child"), run_dir=tmp_path, label="fake") as h:
        assert h.alive()
        assert h.health()
        assert h.base_url == f"http://127.0.0.1:{h.port}"
        assert httpx.get(h.base_url + "/health", trust_env=False).status_code == 200
        cs = h.cold_start
        assert 0 < cs["ready_s"] < 20
        assert 0 <= cs["process_start_s"] <= cs["models_loaded_s"] <= cs["ready_s"]
        assert cs["warmup_s"] == pytest.approx(0.2, abs=0.15)
        assert cs["models_loaded_s"] >= 0.25
        # the stand-in engine writes no sglang lines and serves only once warm: marks fill in
        src = cs["sources"]
        assert src["process_start_s"].startswith("OS: /proc/<pid>/stat") and cs["process_start_s"] < 1.0
        assert src["models_loaded_s"] == "perfkit-mark"
        assert src["warmup_s"] == "perfkit-mark warmup_done - models_loaded"
        assert h.run_dir == tmp_path / "fake"
        assert h.stdout_path.exists() and h.stderr_path.exists()
        assert "perfkit-mark models_loaded" in h.tail()
        assert "fake engine pid" in h.tail(5)
        recs = h.records()
        assert [r.request_id for r in recs] == ["warmup-0"] and recs[0].is_warmup
        env = psutil.Process(h.pid).environ()  # the engine really runs with them
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "fake" / "cache" / "inductor")
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "fake" / "cache" / "triton")
        assert env["PYTHONUNBUFFERED"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
        assert env["SGLANG_PERF_LOG_DIR"] == str(h.perf_log_dir)
        assert os.getpgid(h.pid) == h.pid != os.getpgid(0)
        time.sleep(0.3)
        kids = psutil.Process(h.pid).children(recursive=True)
        assert len(kids) == 2
        pid = h.pid
    assert _gone(pid)
    for k in kids:
        assert _gone(k.pid)
    assert h.exit_code is not None
    assert not surviving(started_processes()[n0:])
    assert len(started_processes()) - n0 == 3  # engine + both children registered
    row = h.launch_row()
    assert row["ready_s"] == cs["ready_s"] and row["exit_code"] == h.exit_code
    assert row["cold_start_sources"].startswith(
        "ready: /health answered 200 (perfkit's poll); process_start: OS"
    )


def test_second_launch_same_label_gets_own_dir_and_cache(tmp_path):
    def cache_dir(spec, label):  # the engine's own TORCHINDUCTOR_CACHE_DIR
        with launch(spec, run_dir=tmp_path, label=label) as h:
            return h.run_dir, psutil.Process(h.pid).environ()["TORCHINDUCTOR_CACHE_DIR"]

    (a_dir, a), (b_dir, b) = cache_dir(fake(), "x"), cache_dir(fake(), "x")
    assert a_dir != b_dir and a != b
    c, d = (cache_dir(fake(share_compile_cache=True), label)[1] for label in ("s1", "s2"))
    assert c == d == str(tmp_path / "shared-cache" / "inductor")


def test_exit_code_3_gives_start_error_with_tail(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as ei:
        with launch(fake("--mode", "exit", "--exit-code", "3"), run_dir=tmp_path):
            pytest.fail("should not be reached")
    assert time.monotonic() - t0 < 10
    e = ei.value
    assert e.exit_code == 3
    assert "exited with code 3" in str(e)
    assert "out of luck" in str(e) and "out of luck" in e.log_tail
    assert e.run_dir is not None and (e.run_dir / "stderr.log").exists()


def test_startup_timeout_is_clear_and_leaves_nothing(tmp_path):
    n0 = len(started_processes())
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match=r"not ready after 2 s") as ei:
        with launch(fake("--mode", "hang", "--child", startup_timeout_s=2), run_dir=tmp_path):
            pass
    assert time.monotonic() - t0 < 2 + 10 + 3  # timeout + SIGTERM grace at most
    assert "perfkit-mark warmup_done" in ei.value.log_tail
    assert ei.value.exit_code is None
    assert not surviving(started_processes()[n0:])


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    t0 = time.monotonic()
    with launch(fake("--ignore-term", "--child", stop_grace_s=1.0), run_dir=tmp_path) as h:
        pid = h.pid
    assert time.monotonic() - t0 < 10
    assert _gone(pid)
    assert h.exit_code == -signal.SIGKILL


def test_occupied_fixed_port_is_refused_before_launch(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    n0 = len(started_processes())
    try:
        with pytest.raises(PortInUseError, match=f"port {port} is already in use"):
            with launch(fake(port=port), run_dir=tmp_path):
                pass
    finally:
        s.close()
    assert len(started_processes()) == n0  # nothing was started
    assert not (tmp_path / "engine").exists()


def test_a_launch_refused_before_it_started_takes_no_other_launchs_logs(tmp_path):
    """Launch ``cap1`` refused for its taken port made no directory: its row has no logs, not
    those of ``cap10`` (the newest directory whose name starts with its label)."""
    from perfkit.measuring.launch_rows import measure_launch

    other = tmp_path / "cap10"
    other.mkdir()
    (other / "stdout.log").write_text("cap10's engine\n")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        data = measure_launch(fake(port=s.getsockname()[1]), [], tmp_path, "cap1")
    finally:
        s.close()
    assert "already in use" in data.error
    assert data.logs == {}, data.logs


def test_fixed_free_port_is_used(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with launch(fake(port=port), run_dir=tmp_path) as h:
        assert h.port == port and h.health()


def test_killed_engine_surfaces(tmp_path):
    with launch(fake(), run_dir=tmp_path) as h:
        os.kill(h.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while h.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not h.alive()
        assert h.exit_code == -signal.SIGKILL
        assert not h.health()
        with VideoClient(h.base_url) as c:  # what a measurement sees: an error, not a hang
            assert c.generate(VideoRequestSpec()).status == "error"
    assert "killed by signal 9 (SIGKILL, not sent by perfkit)" in h.end["how"]


def test_exception_in_body_still_tears_down(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with launch(fake("--child"), run_dir=tmp_path) as h:
            pid = h.pid
            raise RuntimeError("boom")
    assert _gone(pid)


def test_keyboard_interrupt_tears_down(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with launch(fake(), run_dir=tmp_path) as h:
            pid = h.pid
            raise KeyboardInterrupt
    assert _gone(pid)


def test_parse_marks():
    text = (
        "noise\nperfkit-mark process_start t=100.5\nperfkit-mark listening port=8000\n"
        "INFO perfkit-mark models_loaded t=103 placement=device\n"
        "perfkit-mark warmup_done at=5 t=1.7e9\nperfkit-mark process_start t=200\n"
    )
    assert parse_marks(text) == {"process_start": 100.5, "models_loaded": 103.0, "warmup_done": 1.7e9}


# ----------------------------------------------------------------------------- real sglang start-up
SGLANG = Path(__file__).resolve().parent / "fixtures" / "sglang" / "0.5.23"
# the clocks the launching script read, on the host that ran sglang (NOTES-startup.md there)
WARM_CLOCK = LaunchClock(1796383997.4432597, 5011641307684, 5011.64130948, 501164 / 100)
WARM_503, WARM_200 = 1796384048.1287758, 1796384052.0837421


def test_cold_start_parts_from_real_sglang_lines():
    """sglang 0.5.23 with a server warmup: models loaded from its [server-load] line (monotonic),
    the warmup from /health's 503 -> 200, the process start from the OS; marks are not needed
    and, when present, do not override what sglang itself says."""
    text = (SGLANG / "sana-video" / "server.log").read_text()
    assert parse_server_load(text) == 5061177846398
    health = {"first_status": 503, "t_first_503": WARM_503}
    t0 = WARM_CLOCK.t_launch
    cs = cold_start_parts({}, t0, WARM_200, log_text=text, clock=WARM_CLOCK, health=health, engine="sglang")
    assert cs["models_loaded_s"] == pytest.approx((5061177846398 - 5011641307684) / 1e9, abs=1e-9)
    assert cs["models_loaded_s"] == pytest.approx(49.5365, abs=1e-4)
    assert cs["warmup_s"] == pytest.approx(3.95497, abs=1e-5)
    assert cs["ready_s"] == pytest.approx(54.64048, abs=1e-5)
    assert cs["process_start_s"] == 0.0  # started within the launch's 10 ms tick
    assert cs["ready_s"] > cs["models_loaded_s"] + cs["warmup_s"]  # HTTP start-up between them
    assert cs["sources"] == {
        "ready_s": "/health answered 200 (perfkit's poll)",
        "process_start_s": "OS: /proc/<pid>/stat starttime (10 ms ticks)",
        "models_loaded_s": "engine log: [server-load] workers_ready_monotonic_ns",
        "warmup_s": "/health 503 until 200 (perfkit's poll)",
    }
    marks = {"process_start": t0 + 5, "models_loaded": t0 + 7, "warmup_done": WARM_200}
    again = cold_start_parts(marks, t0, WARM_200, log_text=text, clock=WARM_CLOCK, health=health)
    assert {k: again[k] for k in cs["sources"]} == {k: cs[k] for k in cs["sources"]}
    assert again["marks"] == marks  # kept as an extra


def test_warmup_shapes_from_real_sglang_server_logs():
    """sglang 0.5.23's ``server warmup req (WxHxNf, S/D steps)`` progress line (tqdm, \\r
    redraws, twice on the line): width, height, frames after sglang's frame rule, the steps run
    of the model's default; latent frames by LTX frame math. A log without a warmup has none."""
    sana = parse_warmup_shapes((SGLANG / "sana-video" / "server.log").read_text())
    assert sana == [WarmupShape(width=96, height=64, num_frames=9, steps=2, default_steps=50)]
    assert sana[0].latent_frames == 2
    ltx2 = parse_warmup_shapes((SGLANG / "ltx-2" / "server.log").read_text())
    assert ltx2 == [WarmupShape(width=64, height=64, num_frames=17, steps=2, default_steps=40)]
    assert ltx2[0].latent_frames == 3
    assert parse_warmup_shapes((SGLANG / "sana-video-diffusers" / "server.log").read_text()) == []


def test_warmup_shapes_one_per_resolution_and_not_the_failed_one():
    """Several warmup resolutions: each shape once, in order, from the progress bar's redraws and
    the CI log form; an image (no ``xNf``) is 1 frame; a request that ran out of memory is not."""
    text = (
        "\rWarmup requests:  50%|#####     | 1/2 [00:01<00:01, server warmup req (96x64x9f, 2/50 steps)]"
        "\rWarmup requests: 100%|##########| 2/2 [00:03<00:00, server warmup req (64x96x9f, 2/50 steps), last=1.20s]\n"
        "[12-04 11:34:12] Warmup requests: 2/2 server warmup req (64x96x9f, 2/50 steps)\n"
        "[12-04 11:34:13] server warmup req (128x128x33f, 2 steps) ran out of memory; retrying warmup at "
        "server warmup req (128x128x17f, 2 steps)\n"
        "[12-04 11:34:14] Warmup requests: 1/1 warmup req (512x512, 1 step)\n"
    )
    assert parse_warmup_shapes(text) == [
        WarmupShape(96, 64, 9, 2, 50),
        WarmupShape(64, 96, 9, 2, 50),
        WarmupShape(512, 512, 1, 1, None),
    ]


def test_cold_start_parts_without_a_warmup_or_clocks_say_why():
    """The diffusers backend with --warmup-mode off: /health answered 200 at its first answer, so
    no warmup part, and why; without the launch clocks and marks every part says why, never NaN."""
    text = (SGLANG / "sana-video-diffusers" / "server.log").read_text()
    clock = LaunchClock(1796384184.6789217, 5198876969702, 5198.876971512, 519887 / 100)
    health = {"first_status": 200, "t_first_503": None}
    cs = cold_start_parts(
        {}, clock.t_launch, 1796384274.0191157, log_text=text, clock=clock, health=health, engine="sglang"
    )
    assert cs["models_loaded_s"] == pytest.approx(88.919144088, abs=1e-9)
    assert cs["ready_s"] == pytest.approx(89.34019, abs=1e-5)
    assert cs["warmup_s"] is None
    assert cs["sources"]["warmup_s"] == (
        "not reported by sglang: /health answered 200 at its first answer: no startup warmup held it"
    )
    bare = cold_start_parts({}, 100.0, None, log_text=text)
    assert [bare[k] for k in ("ready_s", "process_start_s", "models_loaded_s", "warmup_s")] == [None] * 4
    assert bare["sources"]["models_loaded_s"] == (
        "not reported by the engine: no [server-load] workers_ready_monotonic_ns line in its log"
    )
    assert "process_start: not reported by the engine: no /proc/<pid>/stat" in sources_text(bare)

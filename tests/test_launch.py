"""Launch tests with real processes (tests/fake_engine.py)."""

import os
import signal
import socket
import time

import httpx
import psutil
import pytest

import fake_engine
from perfkit.engine.launch import (
    EngineExitedError,
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
        assert h.run_dir == tmp_path / "fake"
        assert h.stdout_path.exists() and h.stderr_path.exists()
        assert "perfkit-mark models_loaded" in h.tail()
        assert "fake engine pid" in h.tail(5, stream="stdout")
        recs = h.records()
        assert [r.request_id for r in recs] == ["warmup-0"] and recs[0].is_warmup
        env = h.env_added
        assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "fake" / "cache" / "inductor")
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "fake" / "cache" / "triton")
        assert env["PYTHONUNBUFFERED"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
        # the engine really runs with them and in its own process group
        penv = psutil.Process(h.pid).environ()
        assert penv["TORCHINDUCTOR_CACHE_DIR"] == env["TORCHINDUCTOR_CACHE_DIR"]
        assert penv["SGLANG_PERF_LOG_DIR"] == str(h.perf_log_dir)
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


def test_second_launch_same_label_gets_own_dir_and_cache(tmp_path):
    with launch(fake(), run_dir=tmp_path, label="x") as a:
        pass
    with launch(fake(), run_dir=tmp_path, label="x") as b:
        pass
    assert a.run_dir != b.run_dir
    assert a.env_added["TORCHINDUCTOR_CACHE_DIR"] != b.env_added["TORCHINDUCTOR_CACHE_DIR"]
    with launch(fake(share_compile_cache=True), run_dir=tmp_path, label="s1") as c:
        pass
    with launch(fake(share_compile_cache=True), run_dir=tmp_path, label="s2") as d:
        pass
    assert (
        c.env_added["TORCHINDUCTOR_CACHE_DIR"]
        == d.env_added["TORCHINDUCTOR_CACHE_DIR"]
        == str(tmp_path / "shared-cache" / "inductor")
    )


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
        with launch(fake("--mode", "hang", "--child"), run_dir=tmp_path, startup_timeout_s=2):
            pass
    assert time.monotonic() - t0 < 2 + 10 + 3  # timeout + SIGTERM grace at most
    assert "perfkit-mark warmup_done" in ei.value.log_tail
    assert ei.value.exit_code is None
    assert not surviving(started_processes()[n0:])


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    t0 = time.monotonic()
    with launch(fake("--ignore-term", "--child"), run_dir=tmp_path, grace_s=1.0) as h:
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
        with pytest.raises(EngineExitedError, match="exit code -9"):
            h.raise_if_dead()


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

"""MemoryCaps: environment, labels, host cap enforcement on real processes."""

import subprocess
import sys
import time

import httpx
import psutil
import pytest

import fake_engine
from perfkit.engine.caps import CapOutcome, MemoryCaps, cgroup2_available
from perfkit.engine.client import VideoClient, VideoRequestSpec
from perfkit.engine.launch import EngineStartError, launch
from perfkit.engine.spec import EngineSpec
from perfkit.readings.memory import HostMemoryReader


def fake(*args: str) -> EngineSpec:
    return EngineSpec(
        kind="command",
        startup_timeout_s=20,
        command_template=fake_engine.command(*args),
    )


def test_env_and_label():
    assert MemoryCaps().env() == {}
    assert MemoryCaps().label == "unlimited"
    c = MemoryCaps(device_gib=12, host_gib=32)
    assert c.label == "12GiB dev + 32GiB host"
    env = c.env()
    assert env["PERFKIT_CAP_DEVICE_MEMORY_GIB"] == "12"
    assert env["SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"] == "12"
    assert env["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] == "32"
    assert MemoryCaps(device_gib=7.5).label == "7.5GiB dev"
    assert "SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB" not in MemoryCaps(device_gib=7.5).env()
    assert MemoryCaps(host_gib=0.25).label == "0.25GiB host"
    assert MemoryCaps(host_gib=1, label="tight").label == "tight"


def test_roundtrip_and_validation(tmp_path):
    c = MemoryCaps(device_gib=12, host_gib=32, host_enforcement="watchdog")
    assert MemoryCaps.from_dict(c.to_dict()) == c
    assert "host_effective_gib" not in c.to_dict()
    r = c.resolve(_roomy_host(tmp_path))
    assert r.resolved and MemoryCaps.from_dict(r.to_dict()) == r
    assert r.to_dict()["host_effective_gib"] == 32
    with pytest.raises(ValueError, match="MemoryCaps.host_gib"):
        MemoryCaps(host_gib=-1)
    with pytest.raises(ValueError, match="host_enforcement"):
        MemoryCaps(host_enforcement="magic")


def _roomy_host(tmp_path) -> HostMemoryReader:
    """A fake /proc + cgroup tree with 64 GiB MemTotal and no cgroup limit (a 32 GiB ask holds
    on any machine)."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    (tmp_path / "proc" / "meminfo").write_text(f"MemTotal: {64 * 2**20} kB\n")
    (tmp_path / "cg").mkdir()
    return HostMemoryReader(tmp_path / "proc", tmp_path / "cg")


def test_caps_env_reaches_engine(tmp_path):
    caps = MemoryCaps(device_gib=12, host_gib=32).resolve(_roomy_host(tmp_path))
    assert caps.host_clamp is None and caps.host_effective_gib == 32
    with launch(fake(), caps=caps, run_dir=tmp_path) as h:
        env = psutil.Process(h.pid).environ()
        assert env["SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"] == "12"
        assert env["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] == "32"
        assert h.cap_outcome.enforcement in ("cgroup", "watchdog")
        assert not h.cap_outcome.exceeded
        time.sleep(0.3)
        row = h.launch_row()
    assert h.cap_outcome.peak_rss_gib > 0
    assert row["host_cap_gib"] == 32 and row["device_cap_gib"] == 12 and row["cap_exceeded"] is False
    assert row["host_cap_asked_gib"] == row["host_cap_effective_gib"] == 32 and row["host_cap_clamp"] is None
    assert row["cap_mechanism"] in ("cgroup", "watchdog-pss")
    if row["cap_mechanism"] == "cgroup":
        assert row["host_source"] == "cgroup" and row["cgroup_peak_mib"] > 0
    else:
        assert row["host_source"] == "pss" and row["host_pss_peak_mib"] > 0


def test_ask_above_this_host_is_clamped_at_launch(tmp_path):
    """No reader given: launch reads this host; an ask of a million GiB is clamped (MemTotal at
    least) and the engine is told the clamped value."""
    with launch(fake(), caps=MemoryCaps(host_gib=10**6), run_dir=tmp_path) as h:
        told = float(psutil.Process(h.pid).environ()["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"])
        row = h.launch_row()
    assert told < 10**6 and abs(told - row["host_cap_effective_gib"]) < 1e-3 * told
    assert row["host_cap_asked_gib"] == 10**6 and row["host_cap_clamp"]
    assert h.cap_outcome.host_cap_gib == row["host_cap_effective_gib"] == h.caps.host_effective_gib
    # the asked cap and the one in force each from where it is known: both columns say the ask
    assert row["host_cap_gib"] == 10**6 and row["host_cap_clamp"] == h.cap_outcome.host_cap_clamp


def test_host_cap_exceeded_after_ready_is_a_result(tmp_path):
    caps = MemoryCaps(host_gib=0.25, host_enforcement="watchdog")
    with launch(
        fake("--mode", "alloc", "--alloc-mib", "600", "--step-mib", "50"), caps=caps, run_dir=tmp_path
    ) as h:
        assert h.cap_outcome.enforcement == "watchdog"
        t0 = time.monotonic()
        while h.alive() and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        assert not h.alive(), "watchdog did not stop the engine"
        assert time.monotonic() - t0 < 10
        o = h.cap_outcome
        assert o.exceeded and "host memory cap exceeded" in o.message
        assert "> 0.25 GiB" in o.message
        assert o.mechanism == "watchdog-pss" and o.peak_pss_gib > 0.25
        # a later request fails fast instead of hanging
        t1 = time.monotonic()
        with pytest.raises(httpx.HTTPError):
            httpx.get(h.health_url, timeout=5, trust_env=False)
        assert time.monotonic() - t1 < 2
        assert not h.health()
        with VideoClient(h.base_url) as c:
            assert c.generate(VideoRequestSpec()).status == "error"
    assert h.launch_row()["cap_exceeded"] is True


def test_host_cap_exceeded_during_startup(tmp_path):
    caps = MemoryCaps(host_gib=0.25, host_enforcement="watchdog")
    with pytest.raises(EngineStartError, match="host memory cap exceeded") as ei:
        with launch(fake("--mode", "alloc", "--alloc-when", "start"), caps=caps, run_dir=tmp_path):
            pass
    assert ei.value.cap_outcome.exceeded


def test_host_cap_auto_enforcement(tmp_path):
    """auto: cgroup v2 where usable, else watchdog; either way going over is reported."""
    caps = MemoryCaps(host_gib=0.25)
    with launch(fake("--mode", "alloc", "--alloc-mib", "600"), caps=caps, run_dir=tmp_path) as h:
        t0 = time.monotonic()
        while h.alive() and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        assert not h.alive()
    o = h.cap_outcome
    assert o.enforcement in ("cgroup", "watchdog")
    if not cgroup2_available():
        assert o.enforcement == "watchdog"
    assert o.exceeded and "host memory cap exceeded" in o.message


def test_within_cap_not_exceeded(tmp_path):
    caps = MemoryCaps(host_gib=2, host_enforcement="watchdog")
    with launch(fake("--mode", "alloc", "--alloc-mib", "100"), caps=caps, run_dir=tmp_path) as h:
        time.sleep(1.0)
        assert h.alive()
    assert not h.cap_outcome.exceeded
    assert 0.05 < h.cap_outcome.peak_rss_gib < 2


def test_enforcer_directly_on_a_process():
    p = subprocess.Popen(
        [sys.executable, "-c", 'import time; x = b"x" * (300 * 2**20); time.sleep(30)'],
        start_new_session=True,
    )
    try:
        enf = MemoryCaps(host_gib=0.1, host_enforcement="watchdog").start(p.pid)
        assert p.wait(timeout=10) == -9
        o: CapOutcome = enf.finish()
        assert o.exceeded and o.message.startswith("host memory cap exceeded:")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()

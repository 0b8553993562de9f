"""MemorySampler on real processes (no GPU needed)."""

import logging
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest

from perfkit.bundle_schema import conform, sampler_frame
from perfkit.engine.launch import launch
from perfkit.engine.spec import EngineSpec
from perfkit.readings.memory import HostMemoryReader
from perfkit.readings.sampler import COLUMNS, PSS_ENV, MemorySampler, pss_enabled
from perfkit.readings.sampler.nvml import (
    NAN,
    NVML_NOT_AVAILABLE,
    DeviceReading,
    PynvmlSource,
    device_used_mib,
)

FAKE = str(Path(__file__).with_name("fake_engine.py"))

GROW = (
    "import time, sys\n"
    "hold = []\n"
    "for i in range(8):\n"
    "    hold.append(b'x' * (16 * 2**20)); time.sleep(0.1)\n"
    "time.sleep(30)\n"
)


def _nvml_here() -> bool:
    return not math.isnan(device_used_mib())


@pytest.fixture
def grower():
    p = subprocess.Popen([sys.executable, "-c", GROW])
    yield p
    p.kill()
    p.wait()


def test_sampler_host_only_covers_window(grower):
    t0 = time.time()
    with MemorySampler(grower.pid, interval_s=0.05) as s:
        time.sleep(1.5)
    t1 = time.time()
    df = s.to_frame()
    assert list(df.columns) == list(COLUMNS)
    assert len(df) >= 15
    assert df["t"].is_monotonic_increasing
    assert df["t"].iloc[0] >= t0 and df["t"].iloc[-1] <= t1
    assert df["t"].iloc[0] - t0 < 0.5 and t1 - df["t"].iloc[-1] < 0.5
    assert (df["host_rss_mib"] > 0).all()
    assert (df["host_anon_mib"] > 0).all() and (df["host_anon_mib"] <= df["host_rss_mib"]).all()
    read = df[df["host_pss_mib"].notna()]  # PSS is read within its time budget (PSS_DUTY)
    assert len(read) == s.pss_reads >= 1
    assert (read["host_pss_mib"] > 0).all() and (read["host_pss_mib"] <= read["host_rss_mib"]).all()
    assert (read["host_uss_mib"] <= read["host_pss_mib"]).all()
    assert df.loc[df["host_pss_mib"].isna(), "host_uss_mib"].isna().all()
    # the process grew by ~128 MiB during the window
    assert df["host_anon_mib"].iloc[-1] - df["host_anon_mib"].iloc[0] > 64
    if not _nvml_here():
        assert df["device_used_mib"].isna().all()
        assert df["gpu_util_pct"].isna().all()
        assert s.device_mode == "none"
        assert (df["device_source"] == "none").all()
    assert s.peak()["host_rss_mib"] == df["host_rss_mib"].max()
    assert 0 <= s.overhead_pct() < 20


def test_sampler_sums_process_tree():
    code = (
        "import subprocess, sys, time\n"
        "x = b'x' * (64 * 2**20)\n"
        "c = subprocess.Popen([sys.executable, '-c', \"import time; y = b'y' * (64 * 2**20); "
        'time.sleep(30)"])\n'
        "time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(1.0)
        s = MemorySampler(p.pid, interval_s=0.05)
        with s:
            time.sleep(0.5)
        df = s.to_frame()
        assert df["host_anon_mib"].iloc[-1] > 120  # both processes' 64 MiB
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_sampler_stops_when_process_exits():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    s = MemorySampler(p.pid, interval_s=0.05).start()
    p.wait()
    deadline = time.monotonic() + 5
    while s.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not s.running
    s.stop()
    assert len(s.to_frame()) >= 3


def test_sampler_unknown_pid_is_empty_not_error():
    s = MemorySampler(2**22 + 12345, interval_s=0.05)
    with s:
        time.sleep(0.2)
    df = s.to_frame()
    assert df.empty and list(df.columns) == list(COLUMNS)


def test_sampler_from_handle(tmp_path):
    spec = EngineSpec(
        kind="command", startup_timeout_s=20, command_template=[sys.executable, FAKE, "--port", "{port}"]
    )
    with launch(spec, run_dir=tmp_path) as h:
        with h.sampler(interval_s=0.05) as s:
            time.sleep(0.5)
    df = s.to_frame()
    assert len(df) >= 5 and (df["host_rss_mib"] > 5).all()
    if not _nvml_here():
        assert math.isnan(h.device_baseline_mib)


def test_invalid_interval():
    with pytest.raises(ValueError, match="interval_s"):
        MemorySampler(os.getpid(), interval_s=0)


def _cuda_here() -> bool:
    if not _nvml_here():
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cuda_here(), reason="needs NVML and CUDA torch")
def test_sampler_sees_device_memory():
    base = device_used_mib(0)
    code = (
        "import time, torch\n"
        "x = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1)\n"
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        s = MemorySampler(p.pid, interval_s=0.1, baseline_device_mib=base)
        with s:
            time.sleep(1.0)
        df = s.to_frame()
        assert s.device_mode in ("process", "device")
        assert df["device_used_mib"].iloc[-1] >= 2048
        assert df["gpu_util_pct"].notna().all()
    finally:
        p.kill()
        p.wait()


# ---------------------------------------------------------------------------- NVML plausibility
MIB = 2**20


class FakeNvml:
    """An NvmlSource with set values: device used/total (MiB) and per-pid usedGpuMemory (bytes
    or None)."""

    def __init__(self, used_mib: float, total_mib: float, procs: list[tuple[int, int | None]]):
        self.used_mib, self.total_mib, self.procs = used_mib, total_mib, procs
        self.opened = self.closed = 0

    def open(self, indices):
        self.opened += 1
        return True

    def close(self):
        self.closed += 1

    def device(self, index):
        return DeviceReading(int(self.used_mib * MIB), int(self.total_mib * MIB), 42.0)

    def processes(self, index):
        return list(self.procs)


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield p
    p.kill()
    p.wait()


def _sample(pid: int, nv: FakeNvml, baseline: float | None = 1000.0, n: int = 3):
    s = MemorySampler(pid, interval_s=0.05, baseline_device_mib=baseline, nvml=nv)
    s._nvml_ok = nv.open([0])
    for _ in range(n):
        assert s.sample_once()
    return s, s.to_frame()


def test_plausible_per_process_value_is_used(sleeper):
    nv = FakeNvml(used_mib=9000, total_mib=24000, procs=[(sleeper.pid, 7000 * MIB), (1, 500 * MIB)])
    s, df = _sample(sleeper.pid, nv)
    assert (df["device_used_mib"] == 7000).all()
    assert (df["device_source"] == "nvml-process").all() and s.device_mode == "process"
    assert (df["gpu_util_pct"] == 42.0).all()


def test_zero_while_device_grew_falls_back_to_device_delta(sleeper, caplog):
    nv = FakeNvml(used_mib=5000, total_mib=24000, procs=[(sleeper.pid, 0)])
    with caplog.at_level(logging.WARNING, logger="perfkit.readings.sampler"):
        s, df = _sample(sleeper.pid, nv, baseline=1000.0)
    assert (df["device_used_mib"] == 4000).all()  # used - pre-launch
    assert (df["device_source"] == "nvml-device-delta").all() and s.device_mode == "device"
    warns = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(warns) == 1 and "grew by 4000 MiB" in warns[0].getMessage()


def test_zero_while_device_did_not_grow_is_plausible(sleeper):
    nv = FakeNvml(used_mib=1100, total_mib=24000, procs=[(sleeper.pid, 0)])
    _, df = _sample(sleeper.pid, nv, baseline=1000.0)
    assert (df["device_used_mib"] == 0).all() and (df["device_source"] == "nvml-process").all()


def test_more_than_the_device_has_falls_back(sleeper, caplog):
    nv = FakeNvml(used_mib=3000, total_mib=24000, procs=[(sleeper.pid, 30000 * MIB)])
    with caplog.at_level(logging.WARNING, logger="perfkit.readings.sampler"):
        _, df = _sample(sleeper.pid, nv, baseline=1000.0)
    assert (df["device_used_mib"] == 2000).all() and (df["device_source"] == "nvml-device-delta").all()
    assert sum("more than the device has" in r.getMessage() for r in caplog.records) == 1


def test_not_available_sentinel_falls_back(sleeper, caplog):
    for value in (None, NVML_NOT_AVAILABLE):
        caplog.clear()
        nv = FakeNvml(used_mib=3000, total_mib=24000, procs=[(sleeper.pid, value)])
        with caplog.at_level(logging.WARNING, logger="perfkit.readings.sampler"):
            _, df = _sample(sleeper.pid, nv, baseline=1000.0)
        assert (df["device_used_mib"] == 2000).all() and (df["device_source"] == "nvml-device-delta").all()
        assert sum("not available" in r.getMessage() for r in caplog.records) == 1


def test_engine_not_listed_uses_device_delta_without_warning(sleeper, caplog):
    nv = FakeNvml(used_mib=3000, total_mib=24000, procs=[(1, 500 * MIB)])
    with caplog.at_level(logging.WARNING, logger="perfkit.readings.sampler"):
        _, df = _sample(sleeper.pid, nv, baseline=1000.0)
    assert (df["device_used_mib"] == 2000).all() and (df["device_source"] == "nvml-device-delta").all()
    assert not [r for r in caplog.records if "not usable" in r.getMessage()]


def test_injected_nvml_through_the_thread(sleeper):
    nv = FakeNvml(used_mib=9000, total_mib=24000, procs=[(sleeper.pid, 0)])
    with MemorySampler(sleeper.pid, interval_s=0.05, baseline_device_mib=1000.0, nvml=nv) as s:
        time.sleep(0.3)
    df = s.to_frame()
    assert len(df) >= 3 and (df["device_source"] == "nvml-device-delta").all()
    assert nv.opened == nv.closed == 1
    assert device_used_mib(0, nvml=FakeNvml(1234, 24000, [])) == 1234


# ---------------------------------------------------------------------------- clocks and power
class ClockNvml(FakeNvml):
    """Two devices with their own SM clock (MHz), power (W) and clock-event reasons."""

    def __init__(self, procs, readings):
        super().__init__(used_mib=9000, total_mib=24000, procs=procs)
        self.readings = readings

    def device(self, index):
        clock, watts, reasons = self.readings[index]
        return DeviceReading(int(self.used_mib * MIB), int(self.total_mib * MIB), 50.0, clock, watts, reasons)


def test_clocks_power_and_reasons_are_sampled_per_engine(sleeper):
    nv = ClockNvml([(sleeper.pid, 7000 * MIB)], {0: (1830.0, 640.5, 0x4), 1: (1755.0, 601.0, 0x0)})
    s = MemorySampler(sleeper.pid, interval_s=0.05, gpu_index=[0, 1], nvml=nv)
    s._nvml_ok = nv.open([0, 1])
    assert s.sample_once() and s.sample_once()
    df = s.to_frame()
    # the slowest GPU's clock, the engine's total power, the reasons of any GPU
    assert (df["sm_clock_mhz"] == 1755.0).all() and (df["power_w"] == 1241.5).all()
    assert (df["clock_event_reasons"] == 0x4).all() and str(df["clock_event_reasons"].dtype) == "Int64"
    assert s.peak()["sm_clock_mhz"] == 1755.0 and "clock_event_reasons" not in s.peak()
    # one GPU that does not report: not read (NaN / NA), never a 0 or the other GPU's figure
    nv2 = ClockNvml([(sleeper.pid, 7000 * MIB)], {0: (1830.0, 640.5, 0x4), 1: (NAN, NAN, None)})
    s2 = MemorySampler(sleeper.pid, interval_s=0.05, gpu_index=[0, 1], nvml=nv2)
    s2._nvml_ok = nv2.open([0, 1])
    assert s2.sample_once()
    row = s2.to_frame().iloc[0]
    assert (
        math.isnan(row["sm_clock_mhz"]) and math.isnan(row["power_w"]) and row["clock_event_reasons"] is pd.NA
    )
    # the bundle's memory table declares them (MHz, W, mask)
    table = conform("memory", sampler_frame(df.assign(launch="L")))
    assert list(table["sm_clock_mhz"]) == [1755.0, 1755.0] and table["clock_event_reasons"].iloc[0] == 4


def test_pynvml_source_reads_what_the_driver_gives_and_nan_for_the_rest(caplog):
    class Nv:  # the calls PynvmlSource makes, as pynvml names them; clocks unsupported here
        NVML_CLOCK_SM = 1

        def nvmlDeviceGetMemoryInfo(self, h):
            return types.SimpleNamespace(used=3 * MIB, total=10 * MIB)

        def nvmlDeviceGetUtilizationRates(self, h):
            return types.SimpleNamespace(gpu=77)

        def nvmlDeviceGetClockInfo(self, h, kind):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

        def nvmlDeviceGetPowerUsage(self, h):
            return 612_345  # mW

        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            return 0x4

    src = PynvmlSource()
    src._nv, src._handles = Nv(), {0: object()}
    with caplog.at_level(logging.INFO, logger="perfkit.readings.sampler"):
        d = src.device(0)
        src.device(0)
    assert (d.used_bytes, d.util_pct, d.power_w, d.clock_event_reasons) == (3 * MIB, 77.0, 612.345, 0x4)
    assert math.isnan(d.sm_clock_mhz)
    said = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert len(said) == 1 and "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)" in said[0]


def test_the_timeline_starts_before_start_returns():
    """A request sent right after start() lies inside the timeline: start() returns once the
    first sample was taken (CI once saw the first sample 1 ms after the first request began)."""
    s = MemorySampler(os.getpid(), interval_s=5.0)  # the second sample would come 5 s later
    t = time.time()
    s.start()
    try:
        first = s.to_frame()["t"].min()
        assert len(s.samples) == 1 and first <= time.time() and first >= t
    finally:
        s.stop()


class _TimedReader(HostMemoryReader):
    """This host's reader, noting when each smaps_rollup (PSS) tree read began and ended."""

    def __init__(self) -> None:
        super().__init__()
        self.pss_calls: list[tuple[float, float]] = []

    def tree(self, root, pids=None, pss=True):
        t0 = time.monotonic()
        out = super().tree(root, pids, pss=pss)
        if pss:
            self.pss_calls.append((t0, time.monotonic()))
        return out


def test_pss_reads_stay_within_their_time_budget_and_rss_is_read_every_sample(grower):
    """smaps_rollup stalls the sampled engine (issue 42: a capped recompile 4.96x slower at one
    read every 0.1 s): a read that took c s is followed by the next after c / pss_duty s; the
    samples between read statm (RSS), and their PSS is NaN, not a carried value."""
    reader = _TimedReader()
    duty = 0.002
    with MemorySampler(grower.pid, interval_s=0.02, reader=reader, pss_duty=duty) as s:
        time.sleep(1.5)
    df = s.to_frame()
    calls = reader.pss_calls
    assert len(calls) == s.pss_reads >= 1
    for (a0, a1), (b0, _) in zip(calls, calls[1:]):
        assert b0 - a0 >= 0.99 * (a1 - a0) / duty, (a0, a1, b0)
    # the sampler times its own call around each read: up to 1 ms more per read (CI: 5 us on one)
    slack = 1e-3 * len(calls)
    assert s.pss_read_s <= duty * (calls[-1][0] - calls[0][0]) + (calls[-1][1] - calls[-1][0]) + slack
    assert len(df) >= 30 and (df["host_rss_mib"] > 0).all()  # statm at every sample
    read = df["host_pss_mib"].notna()
    assert read.sum() == len(calls) < len(df)
    assert df.loc[~read, ["host_pss_mib", "host_uss_mib"]].isna().all().all()


def test_pss_duty_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="pss_duty"):
        MemorySampler(os.getpid(), pss_duty=0)


@pytest.mark.parametrize("duty", [0, -0.5, math.nan, math.inf, 1.5, "0.5", True, None])
def test_pss_duty_that_is_not_a_number_in_0_1_is_refused_with_its_name(duty):
    """NaN, inf, a string, a bool: a ValueError naming pss_duty (before: "0.5" was a bare
    TypeError from the comparison, True was taken as a duty of 1)."""
    with pytest.raises(ValueError, match="pss_duty"):
        MemorySampler(os.getpid(), pss_duty=duty)


@pytest.mark.parametrize(
    "raw, on",
    [(None, True), ("", True), (" 1", True), ("TRUE", True), ("yes", True), ("on", True)]
    + [("0", False), ("0 ", False), ("false", False), ("No", False), (" off\n", False)],
)
def test_pss_env_values(raw, on):
    env = {} if raw is None else {PSS_ENV: raw}
    assert pss_enabled(env) is on


@pytest.mark.parametrize("raw", ["2", "disable", "0,1", "nope"])
def test_unknown_pss_env_value_is_an_error_naming_the_variable(raw, monkeypatch):
    monkeypatch.setenv(PSS_ENV, raw)
    with pytest.raises(ValueError, match=f"PERFKIT_SAMPLER_PSS={raw!r}.*expected one of"):
        MemorySampler(os.getpid())


def test_pss_env_false_turns_pss_off(monkeypatch):
    """``PERFKIT_SAMPLER_PSS=false`` (before: anything but exactly "0" left PSS on)."""
    monkeypatch.setenv(PSS_ENV, "false")
    s = MemorySampler(os.getpid(), interval_s=0.05, nvml=FakeNvml(0.0, 1.0, []))
    for _ in range(3):
        assert s.sample_once()
    df = s.to_frame()
    assert s.pss_reads == 0 and df["host_pss_mib"].isna().all() and (df["host_rss_mib"] > 0).all()


def test_measure_refuses_an_unknown_pss_env_value_before_launching(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import perfkit.measure
    from perfkit.measure import measure_command

    # not this test's subject, and it would make the pytest process a subreaper for later tests
    monkeypatch.setattr(perfkit.measure, "become_subreaper", lambda: None)
    params = Path(__file__).resolve().parents[1] / "params" / "ci-cpu.yaml"
    monkeypatch.setenv(PSS_ENV, "flase")
    res = CliRunner().invoke(measure_command, ["--params", str(params), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert "PERFKIT_SAMPLER_PSS='flase'" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def _fake_proc(tmp_path, pid: int, rollup: str):
    """A fake /proc with one process ``pid`` (statm: 2560 resident pages) whose smaps_rollup
    is ``rollup``."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "smaps_rollup").write_text("")
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "task" / str(pid) / "children").write_text("")
    (d / "statm").write_text("10000 2560 512 1 0 2000 0\n")
    (d / "smaps_rollup").write_text(rollup)
    return HostMemoryReader(proc_root=proc, cgroup_root=tmp_path / "nocg")


def test_unreadable_pss_falls_back_to_statm_said_once(tmp_path, caplog):
    """Every PSS read fails (a smaps_rollup without Pss, as a permission error would): the
    sampler says so once, keeps sampling RSS from statm, PSS NaN, no PSS read counted."""
    reader = _fake_proc(tmp_path, 4242, "Rss: 10240 kB\n")
    s = MemorySampler(4242, interval_s=0.05, reader=reader, nvml=FakeNvml(0.0, 1.0, []))
    with caplog.at_level(logging.WARNING, logger="perfkit.readings.sampler"):
        for _ in range(4):
            assert s.sample_once()
    df = s.to_frame()
    page = os.sysconf("SC_PAGE_SIZE")
    assert (df["host_rss_mib"] == 2560 * page / 2**20).all()
    assert df["host_pss_mib"].isna().all() and s.pss_reads == 0
    warns = [r for r in caplog.records if "Pss" in r.getMessage()]
    assert len(warns) == 1 and "smaps_rollup" in warns[0].getMessage()

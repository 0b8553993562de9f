"""The one host memory reader (perfkit.readings.memory): PSS of real forked process trees, the
watchdog acting on PSS, budgets clamped by fake cgroup / meminfo trees."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from perfkit.engine.caps import HostCapEnforcer, MemoryCaps
from perfkit.engine.launch import launch
from perfkit.engine.spec import EngineSpec
from perfkit.readings.memory import DEFAULT, HostMemoryReader, MemoryReadError
from perfkit.readings.sampler import MemorySampler

FAKE = str(Path(__file__).with_name("fake_engine.py"))

GIB_KIB = 2**20  # KiB in a GiB

# A parent that allocates and touches 400 MiB, then forks two children that only read it
# ("read"), or whose first child also writes 400 MiB of its own ("write"). Prints "ready" once
# every child has done its part.
TREE = r"""
import os, sys, time
mode = sys.argv[1]
buf = b"x" * (400 * 2**20)
r, w = os.pipe()
for i in range(2):
    if os.fork() == 0:
        own = b"y" * (400 * 2**20) if (mode == "write" and i == 0) else b""
        s = sum(buf[:: 2**20])
        os.write(w, b"1")
        time.sleep(60)
        os._exit(0)
got = b""
while len(got) < 2:
    got += os.read(r, 2)
print("ready", flush=True)
time.sleep(60)
"""


def fake() -> EngineSpec:
    return EngineSpec(
        kind="command",
        startup_timeout_s=20,
        command_template=[sys.executable, FAKE, "--port", "{port}", "--perf-log-dir", "{perf_log_dir}"],
    )


def _start_tree(mode: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", TREE, mode], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert p.stdout.readline().strip() == "ready"
    return p


def _kill_tree(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


@pytest.fixture(scope="module")
def shared_tree():
    p = _start_tree("read")
    yield p
    _kill_tree(p)


# ---------------------------------------------------------------------------- real processes
def test_tree_pss_counts_shared_pages_once(shared_tree):
    pids = DEFAULT.tree_pids(shared_tree.pid)
    assert len(pids) == 3
    tm = DEFAULT.tree(shared_tree.pid)
    assert tm.source == "pss" and tm.root_alive and not tm.vanished
    assert 380 < tm.pss_mib < 0.6 * 1024, tm  # ~0.4 GiB, not 1.2
    assert tm.rss_mib > 1100, tm  # summed RSS counts the 400 MiB three times
    assert tm.uss_mib < tm.pss_mib <= tm.rss_mib


def test_watchdog_acts_on_pss_not_summed_rss(shared_tree, caplog):
    """A cap below the tree's summed RSS (1.2 GiB) and above its PSS (0.4 GiB): not killed; the
    watchdog then reads PSS for its check within CHECK_PSS_DUTY (5 %), and says so once."""
    with caplog.at_level(logging.WARNING, logger="perfkit.engine.caps"):
        enf = MemoryCaps(host_gib=0.6, host_enforcement="watchdog").start(shared_tree.pid)
        try:
            time.sleep(1.0)
            o = enf.outcome
            assert not o.exceeded, o.message
            assert o.mechanism == "watchdog-pss" and o.host_source == "pss"
            assert o.peak_pss_gib is not None and 0.35 < o.peak_pss_gib < 0.6
            assert o.peak_rss_gib > 1.0  # what the old RSS-summing watchdog would have acted on
        finally:
            enf.finish()
    assert shared_tree.poll() is None
    said = [r.getMessage() for r in caplog.records if "PSS is read for the check up to 5 %" in r.getMessage()]
    assert len(said) == 1 and "over the cap 0.6 GiB" in said[0], caplog.text


def test_sampler_records_pss_beside_rss(shared_tree):
    with MemorySampler(shared_tree.pid, interval_s=0.05) as s:
        time.sleep(0.4)
    df = s.to_frame()
    assert len(df) >= 3
    pss = df["host_pss_mib"].dropna()  # read within its time budget (PSS_DUTY), NaN between
    assert len(pss) == s.pss_reads >= 1
    assert (pss < 0.6 * 1024).all() and (pss > 380).all()
    assert (df["host_rss_mib"] > 1100).all()
    assert df["cgroup_current_mib"].isna().all()  # no cgroup of its own


def test_watchdog_kills_a_child_that_writes_its_own_memory():
    p = _start_tree("write")
    try:
        enf = MemoryCaps(host_gib=0.6, host_enforcement="watchdog").start(p.pid)
        assert p.wait(timeout=10) == -signal.SIGKILL
        o = enf.finish()
        assert o.exceeded and o.mechanism == "watchdog-pss"
        assert "> 0.6 GiB" in o.message and "PSS" in o.message
    finally:
        _kill_tree(p)


def test_vanished_and_zombie_processes_are_skipped_not_zero():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 5
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert DEFAULT.process(p.pid) is None  # a zombie: no memory map
    assert DEFAULT.process(p.pid, pss=False) is None
    p.wait()
    assert DEFAULT.process(p.pid) is None  # gone
    tm = DEFAULT.tree(os.getpid(), [os.getpid(), p.pid])
    assert tm.vanished == (p.pid,) and tm.pids == (os.getpid(),) and tm.pss_mib > 0
    assert DEFAULT.tree_pids(p.pid) == []


def test_enforcer_on_a_gone_process_is_quiet():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    enf = HostCapEnforcer(p.pid, 1.0, mode="watchdog")
    enf.start()
    assert not enf.finish().exceeded


# ---------------------------------------------------------------------------- fake trees
def _tree(tmp_path, cgroup: str, files: dict[str, str], mem_total_kib: int | None = 64 * GIB_KIB):
    """A fake /proc (self/cgroup, meminfo) and /sys/fs/cgroup under tmp_path -> reader."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    if mem_total_kib is not None:
        (proc / "meminfo").write_text(f"MemTotal:       {mem_total_kib} kB\nMemFree:  1 kB\n")
    cg.mkdir()
    for rel, text in files.items():
        f = cg / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return HostMemoryReader(proc_root=proc, cgroup_root=cg)


V2 = "0::/a/b\n"


def test_cgroup_v2_limit_clamps_budget_and_engine_env(tmp_path, caplog):
    reader = _tree(
        tmp_path,
        V2,
        {"cgroup.controllers": "memory", "a/memory.max": "max\n", "a/b/memory.max": f"{2**30}\n"},
    )
    b = reader.host_budget(32)
    assert b.asked_gib == 32 and b.effective_gib == 1.0
    assert "a/b/memory.max" in b.clamp and "cgroup-v2" in b.clamp
    with caplog.at_level(logging.WARNING, logger="perfkit.engine.caps"):
        caps = MemoryCaps(host_gib=32, host_enforcement="watchdog").resolve(reader)
    assert any("32 GiB asked" in r.getMessage() for r in caplog.records)
    assert caps.host_gib == 32 and caps.host_effective_gib == 1.0 and caps.host_clamp == b.clamp
    assert caps.label == "32GiB host"  # the case keeps its asked name
    assert caps.env()["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] == "1"
    assert caps.env()["PERFKIT_CAP_HOST_MEMORY_GIB"] == "1"
    assert MemoryCaps.from_dict(caps.to_dict()).host_effective_gib == 1.0
    with launch(fake(), caps=caps, run_dir=tmp_path / "run") as h:
        env = psutil.Process(h.pid).environ()
        assert env["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] == "1"
        row = h.launch_row()
    assert row["host_cap_asked_gib"] == 32 and row["host_cap_effective_gib"] == 1.0
    assert row["host_cap_clamp"] == b.clamp
    assert row["cap_mechanism"] == "watchdog-pss" and row["host_source"] == "pss"
    assert h.cap_outcome.host_cap_gib == 1.0 and h.cap_outcome.host_cap_asked_gib == 32


def test_max_and_v1_sentinel_are_no_limit(tmp_path):
    r2 = _tree(
        tmp_path / "v2", V2, {"cgroup.controllers": "memory", "a/memory.max": "max", "a/b/memory.max": "max"}
    )
    assert r2.cgroup_limits() == []
    b = r2.host_budget(32)
    assert b.effective_gib == 32 and b.clamp is None
    r1 = _tree(
        tmp_path / "v1",
        "4:memory:/x/y\n1:cpu:/\n",
        {
            "memory/memory.limit_in_bytes": "9223372036854771712",
            "memory/x/memory.limit_in_bytes": "9223372036854771712",
            "memory/x/y/memory.limit_in_bytes": str(2**60),
        },
    )
    assert r1.cgroup_limits() == []
    assert r1.host_budget(32).clamp is None


def test_cgroup_v1_finite_limit_clamps(tmp_path):
    r1 = _tree(
        tmp_path,
        "4:memory:/x/y\n",
        {"memory/x/memory.limit_in_bytes": str(3 * 2**30), "memory/x/y/memory.limit_in_bytes": str(2**62)},
    )
    b = r1.host_budget(8)
    assert b.effective_gib == 3.0 and "cgroup-v1" in b.clamp and "x/memory.limit_in_bytes" in b.clamp


def test_meminfo_smaller_than_ask_clamps(tmp_path):
    reader = _tree(tmp_path, V2, {"cgroup.controllers": "memory"}, mem_total_kib=24 * GIB_KIB)
    b = reader.host_budget(32)
    assert b.effective_gib == 24.0 and b.clamp.startswith("MemTotal")
    assert reader.host_budget(16).clamp is None and reader.host_budget(16).effective_gib == 16
    assert reader.host_budget(None).effective_gib is None


def test_unreadable_numbers_are_errors_naming_the_file(tmp_path):
    bad = _tree(tmp_path / "a", V2, {"cgroup.controllers": "memory", "a/b/memory.max": "lots"})
    with pytest.raises(MemoryReadError, match=r"a/b/memory.max: memory.max: not a number"):
        bad.host_budget(32)
    no_total = _tree(tmp_path / "b", V2, {"cgroup.controllers": "memory"}, mem_total_kib=None)
    with pytest.raises(MemoryReadError, match=r"meminfo: MemTotal"):
        no_total.host_budget(32)
    (tmp_path / "b" / "proc" / "meminfo").write_text("MemFree: 1 kB\n")
    with pytest.raises(MemoryReadError, match=r"meminfo: MemTotal: key not found"):
        no_total.mem_total_mib()
    # a smaps_rollup without Pss is an error, not 0
    (tmp_path / "b" / "proc" / "self" / "smaps_rollup").write_text("")
    (tmp_path / "b" / "proc" / "77").mkdir()
    (tmp_path / "b" / "proc" / "77" / "smaps_rollup").write_text("Rss: 10 kB\nAnonymous: 1 kB\n")
    with pytest.raises(MemoryReadError, match=r"77/smaps_rollup: Pss: key not found"):
        no_total.process(77)


def test_cgroup_memory_current_and_peak(tmp_path):
    d = tmp_path / "eng"
    d.mkdir()
    (d / "memory.current").write_text(f"{300 * 2**20}\n")
    m = DEFAULT.cgroup_memory(d)
    assert m.current_mib == 300 and m.peak_mib is None  # kernel without memory.peak
    (d / "memory.peak").write_text(f"{500 * 2**20}\n")
    assert DEFAULT.cgroup_memory(d).peak_mib == 500
    (d / "memory.current").write_text("?\n")
    with pytest.raises(MemoryReadError, match="memory.current: not a number"):
        DEFAULT.cgroup_memory(d)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert DEFAULT.cgroup_events(d)["oom_kill"] == 1


def test_default_reader_reads_this_host():
    assert DEFAULT.mem_total_mib() > 256
    b = DEFAULT.host_budget(10**6)  # a million GiB: clamped by something real
    assert b.clamp is not None and 0 < b.effective_gib < 10**6


def test_launch_without_caps_reads_no_limits(tmp_path):
    with launch(fake(), run_dir=tmp_path) as h:
        row = h.launch_row()
    assert row["host_cap_effective_gib"] is None and row["cap_mechanism"] == "none"


def test_enforcer_with_an_own_cgroup_reads_memory_current_and_oom_kills(tmp_path, monkeypatch):
    """The cgroup branch on a fake cgroup directory (this host may not delegate cgroup v2)."""
    from perfkit.engine import caps as caps_mod

    d = tmp_path / "perfkit-eng"
    d.mkdir()
    (d / "memory.current").write_text(f"{200 * 2**20}\n")
    (d / "memory.peak").write_text(f"{300 * 2**20}\n")
    (d / "memory.events").write_text("oom 0\noom_kill 0\n")
    cg = object.__new__(caps_mod._Cgroup)
    cg.path = d
    monkeypatch.setattr(caps_mod._Cgroup, "remove", lambda self: None)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        enf = HostCapEnforcer(p.pid, 1.0, mode="none", interval_s=0.05)
        enf._cgroup = cg
        enf.outcome.mechanism = enf.outcome.host_source = "cgroup"
        with MemorySampler(p.pid, interval_s=0.05, cgroup_path=d) as s:
            enf.start()
            time.sleep(0.6)
            assert not enf.outcome.exceeded and abs(enf.outcome.peak_cgroup_gib - 300 / 1024) < 1e-9
            (d / "memory.events").write_text("oom 1\noom_kill 1\n")
            time.sleep(1.2)
        o = enf.finish()
        assert o.exceeded and "cgroup OOM kill" in o.message
        assert (s.to_frame()["cgroup_current_mib"] == 200).all()
    finally:
        p.kill()
        p.wait()


class _ExitsBeforePss(HostMemoryReader):
    """This host's reader, whose tree's root is SIGKILLed (and reaped) just before its PSS read:
    the root exits between the watchdog's statm read and its PSS read."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__()
        self.proc = proc

    def tree(self, root, pids=None, pss=True):
        if pss and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return super().tree(root, pids, pss=pss)


def test_watchdog_whose_root_exits_between_statm_and_pss_keeps_the_statm_peak():
    """Before: the tick's statm reading was dropped with the PSS read that found the root gone,
    so the outcome said a peak summed RSS of 0.0 GiB; now the statm figure is kept, the watchdog
    ends quietly (not exceeded)."""
    p = subprocess.Popen([sys.executable, "-c", "b = b'x' * (64 * 2**20); import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while DEFAULT.process(p.pid, pss=False).rss_mib < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        enf = HostCapEnforcer(p.pid, 5.0, mode="watchdog", reader=_ExitsBeforePss(p))
        enf.start()
        enf._thread.join(5)
        assert not enf._thread.is_alive()
        o = enf.finish()
        assert not o.exceeded and o.peak_pss_gib is None
        assert o.peak_rss_gib > 60 / 1024, o
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_watchdog_acts_on_a_pss_read_over_the_cap_when_statm_rss_is_under_it(tmp_path):
    """statm's RSS (the kernel's per-mm counters, which lag by per-thread/per-CPU batches) under
    the cap, smaps_rollup's PSS over it: before, only a statm RSS over the cap led to a check, so
    a PSS read for the peak that was over the cap never killed. A fake /proc (statm 0.98 GiB,
    smaps_rollup 1.03 GiB) for a real process, cap 1 GiB."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        proc = tmp_path / "proc"
        (proc / "self").mkdir(parents=True)
        (proc / "self" / "smaps_rollup").write_text("")
        d = proc / str(p.pid)
        (d / "task" / str(p.pid)).mkdir(parents=True)
        (d / "task" / str(p.pid) / "children").write_text("")
        pages = int(0.98 * 2**30) // os.sysconf("SC_PAGE_SIZE")
        (d / "statm").write_text(f"{2 * pages} {pages} 100 1 0 {pages} 0\n")
        kib = int(1.03 * GIB_KIB)
        (d / "smaps_rollup").write_text(
            f"Rss: {kib} kB\nPss: {kib} kB\nPrivate_Clean: 0 kB\nPrivate_Dirty: {kib} kB\nAnonymous: {kib} kB\n"
        )
        reader = HostMemoryReader(proc_root=proc, cgroup_root=tmp_path / "nocg")
        enf = HostCapEnforcer(p.pid, 1.0, mode="watchdog", reader=reader)
        enf.start()
        assert p.wait(timeout=5) == -signal.SIGKILL
        o = enf.finish()
        assert o.exceeded and "1.03 GiB > 1 GiB" in o.message and "PSS" in o.message, o
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


class _SlowPss(HostMemoryReader):
    """A reader whose PSS reads take 0.2 s more (a large engine's), counted."""

    def __init__(self, proc_root) -> None:
        super().__init__(proc_root=proc_root, cgroup_root=Path(proc_root).parent / "nocg")
        self.pss_reads = 0

    def tree(self, root, pids=None, pss=True):
        if pss:
            self.pss_reads += 1
            time.sleep(0.2)
        return super().tree(root, pids, pss=pss)


def _fake_process(proc: Path, pid: int, statm_gib: float, pss_gib: float) -> None:
    """(Re)write a fake /proc entry of ``pid``: statm resident ``statm_gib``, smaps_rollup Rss
    = statm, Pss ``pss_gib``."""
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "smaps_rollup").write_text("")
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (d / "task" / str(pid) / "children").write_text("")
    pages = int(statm_gib * 2**30) // os.sysconf("SC_PAGE_SIZE")
    (d / "statm").write_text(f"{2 * pages} {pages} 100 1 0 {pages} 0\n")
    rss, p = int(statm_gib * GIB_KIB), int(pss_gib * GIB_KIB)
    (d / "smaps_rollup").write_text(
        f"Rss: {rss} kB\nPss: {p} kB\nPrivate_Clean: 0 kB\nPrivate_Dirty: {p} kB\nAnonymous: {p} kB\n"
    )


def test_watchdog_between_rss_and_pss_reads_pss_within_its_budget_and_at_once_on_growth(tmp_path):
    """Summed RSS 1.5 GiB over a 1 GiB cap, PSS 0.5 GiB under it, a PSS read of 0.2 s: before,
    PSS was read at every check (the issue-42 stall for as long as it lasted); now within
    CHECK_PSS_DUTY (one read per 4 s here). When the RSS then grows by more than the PSS's margin
    (0.5 GiB) the next check reads PSS and kills (long before the 4 s)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    proc = tmp_path / "proc"
    try:
        _fake_process(proc, p.pid, 1.5, 0.5)
        reader = _SlowPss(proc)
        enf = HostCapEnforcer(p.pid, 1.0, mode="watchdog", reader=reader)
        enf.start()
        time.sleep(1.5)
        assert reader.pss_reads == 1 and p.poll() is None  # the first check's read only
        _fake_process(proc, p.pid, 2.1, 1.1)  # +0.6 GiB RSS, PSS over the cap
        assert p.wait(timeout=2.0) == -signal.SIGKILL
        o = enf.finish()
        assert o.exceeded and "1.10 GiB > 1 GiB" in o.message and reader.pss_reads == 2, o
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_forked_tree_is_counted_once_through_the_memory_budget_entry(shared_tree):
    """A parent touches a 400 MiB block, then forks two children that read it: the sampler's
    figures through memory_budget's cap entry give the tree's memory once, 400 MiB within 15 %
    (three Python interpreters beside the block), while the anon column summed per process reads
    about 1,200 MiB and says so; USS holds none of the shared block."""
    import importlib

    from perfkit.investigations.common import ANON_SUM_LABEL
    from perfkit.investigations.memory_budget import cap_entry
    from perfkit.measuring.launch_rows import LaunchData

    with MemorySampler(shared_tree.pid, interval_s=0.05) as s:
        time.sleep(0.4)
    mem = s.to_frame()
    memory_budget = importlib.import_module("perfkit.investigations.memory_budget")
    e = cap_entry(LaunchData("unlimited", memory=mem), MemoryCaps(), repeats=0)
    assert abs(e["host_pss_peak_mib"] - 400) < 0.15 * 400, e
    assert 3 * 400 <= e["host_anon_peak_mib"] < 3 * 400 * 1.15, e
    assert mem["host_uss_mib"].dropna().max() < 0.15 * 400  # private pages only
    text = memory_budget.reading({"caps": [e]})
    assert f"host PSS peak {e['host_pss_peak_mib']:,.0f} MiB" in text and "anon" not in text
    table = memory_budget.summary_table({"caps": [e]})
    assert table[ANON_SUM_LABEL].iloc[0] == e["host_anon_peak_mib"]
    assert "host_anon_peak_mib" not in table.columns
    print(f"tree PSS {e['host_pss_peak_mib']:.1f} MiB, anon summed {e['host_anon_peak_mib']:.1f} MiB")

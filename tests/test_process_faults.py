"""Faults: every process a run starts ends with it, whatever hangs or dies first (issue 33).

A stand-in engine (tests/fake_engine.py, mode ``serve``) fails at request 1 in one of five ways:
it hangs while still answering /health, stops itself with SIGSTOP, drains in-flight jobs on
SIGTERM and so never exits, forks children (one in a session of its own) and hangs, or
SIGKILLs itself (as the OOM killer would). Each run is a real ``perfkit suite`` (papermill
kernel), ``perfkit ab`` or ``perfkit suite --partition`` subprocess; they run side by side
(one module fixture) to keep the wall time down. After each: exit 2 within the cell timeout
+ 15 s, no process the engine started is alive (checked by pid and start time, from the pid
file the engine writes, not by name), and summary.md / the report name the request and how
the engine ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import yaml

import fake_engine
from perfkit.engine.owner import alive

ROOT = Path(__file__).resolve().parents[1]
#: papermill's per-cell timeout of these runs (request 3 s + stop grace 2 s + 10 s fit in it; the
#: rest is room for kernel starts on a loaded 2-core runner)
CELL_TIMEOUT_S = 60
FAULTS = ["hang", "sigstop", "drain", "fork", "sigkill"]
#: how each fault's engine ends, as summary.md's "How the engines ended" says it
ENDED = {
    "hang": "ended on perfkit's SIGTERM",
    "sigstop": "was stopped (SIGSTOP) when perfkit ended it; ended on perfkit's SIGTERM",
    # the SIGKILL lands 2.0 s after SIGTERM on a quiet machine, 2.1 s seen under load (fresh-clone
    # run at 82b913b): the words are checked, the seconds are the grace period's measured end
    "drain": "did not exit within 2 s of SIGTERM: killed by perfkit (SIGKILL) after 2.",
    "fork": "ended on perfkit's SIGTERM",
    "sigkill": "was killed by signal 9 (SIGKILL, not sent by perfkit)",
}


def engine(fault: str, pid_file: Path, request_timeout_s: float = 3) -> dict:
    return {
        "kind": "command",
        "command": fake_engine.command(
            "--mode",
            "serve",
            "--fault",
            fault,
            "--fault-at",
            "1",
            "--load-s",
            "0",
            "--warmup-s",
            "0",
            "--pid-file",
            str(pid_file),
        ),
        "request_timeout_s": request_timeout_s,
        "stop_grace_s": 2,
    }


def params_file(d: Path, fault: str, **kw) -> Path:
    doc = {
        "name": f"fault-{fault}",
        "timeout_s": kw.pop("timeout_s", CELL_TIMEOUT_S),
        "engine": engine(fault, d / "pids.txt", **kw),
        "request": {"num_frames": 9, "height": 64, "width": 64, "num_inference_steps": 2},
        "cold_warm": {"enabled": True, "repeats": 3},
        **{n: {"enabled": False} for n in ("warmup_shapes", "memory_budget", "offload_modes")},
    }
    d.mkdir(parents=True, exist_ok=True)
    p = d / "params.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def started(d: Path) -> list[tuple[int, float]]:
    """(pid, start time) of every process the engines of run ``d`` wrote to their pid file."""
    f = d / "pids.txt"
    if not f.exists():
        return []
    return [(int(a), float(b)) for a, b in (ln.split() for ln in f.read_text().splitlines() if ln.strip())]


def fault_at(d: Path) -> float | None:
    """When the engine of run ``d`` met its fault (epoch s, from its log line), or None."""
    for log in d.rglob("stdout.log"):
        m = re.search(r"fault \w+ t=([0-9.]+)", log.read_text(errors="replace"))
        if m:
            return float(m.group(1))
    return None


def perfkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "perfkit.cli", *args]


def run(d: Path, argv: list[str], during=None, settle_s: float = 1.0) -> dict:
    """Run ``argv`` (in ``d``), ``during(proc)`` meanwhile; then the outcome, with the wall time
    and the engine processes still alive ``settle_s`` after the exit (by pid and start time)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if during is not None:
            during(proc, d)
        out, _ = proc.communicate(timeout=CELL_TIMEOUT_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    wall, t_exit = time.monotonic() - t0, time.time()
    deadline = time.monotonic() + settle_s
    while True:
        survivors = [pid for pid, ct in started(d) if alive(pid, ct)]
        if not survivors or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in survivors:  # never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    return {
        "rc": proc.returncode,
        "out": out,
        "wall": wall,
        "after_fault": t_exit - fault_at(d) if fault_at(d) else None,
        "started": started(d),
        "survivors": survivors,
    }


def _wait_for_fault(d: Path) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = list((d / "run").rglob("session*/stdout.log"))
        if logs and "fault" in logs[0].read_text():
            return True
        time.sleep(0.2)
    return False


def kill_kernel_mid_request(proc: subprocess.Popen, d: Path) -> None:
    """SIGKILL the notebook kernel (the engine's parent) once request 1 hangs: its teardown
    never runs; the engine's SIGKILL parent-death signal and the suite (the owner) must act."""
    if _wait_for_fault(d):
        psutil.Process(started(d)[0][0]).parent().kill()


def kill_suite_mid_request(proc: subprocess.Popen, d: Path) -> None:
    """SIGKILL ``perfkit suite`` itself once request 1 hangs: nothing of it runs again; its
    reaper must end the kernel, the engine and the engine's children (kernel's pid and start
    time kept in ``d/kernel.txt``)."""
    if _wait_for_fault(d):
        kernel = psutil.Process(started(d)[0][0]).parent()
        (d / "kernel.txt").write_text(f"{kernel.pid} {kernel.create_time()!r}\n")
        proc.kill()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    jobs = {}
    for fault in FAULTS:
        d = base / fault
        p = params_file(d, fault)
        jobs[fault] = (
            d,
            perfkit("suite", "--params", str(p), "--out", str(d / "run"), "-q", "--no-screenshot"),
            None,
        )
    d = base / "kernel-killed"
    p = params_file(d, "fork", request_timeout_s=15)
    jobs["kernel-killed"] = (
        d,
        perfkit("suite", "--params", str(p), "--out", str(d / "run"), "-q", "--no-screenshot"),
        kill_kernel_mid_request,
    )
    d = base / "suite-killed"
    p = params_file(d, "fork", request_timeout_s=15)
    jobs["suite-killed"] = (
        d,
        perfkit("suite", "--params", str(p), "--out", str(d / "run"), "-q", "--no-screenshot"),
        kill_suite_mid_request,
    )
    d = base / "shard"
    p = params_file(d, "hang")
    jobs["shard"] = (
        d,
        perfkit("suite", "--params", str(p), "--partition", "1/1", "--out", str(d / "shard")),
        None,
    )
    d = base / "measure"
    p = params_file(d, "drain")
    jobs["measure"] = (
        d,
        [sys.executable, "-m", "perfkit.measure", "--params", str(p), "--out", str(d / "m")],
        None,
    )
    d = base / "ab"
    d.mkdir()
    (d / "a.yaml").write_text(yaml.safe_dump(engine("none", d / "pids.txt")))
    (d / "b.yaml").write_text(yaml.safe_dump(engine("hang", d / "pids.txt")))
    jobs["ab"] = (
        d,
        perfkit(
            "ab",
            "--a",
            str(d / "a.yaml"),
            "--b",
            str(d / "b.yaml"),
            "--launches",
            "2",  # the sequential A/B's least (issue 39): one look at 2 a side, no more
            "--max-launches",
            "2",
            "--warm",
            "2",
            "--out",
            str(d / "ab"),
            "-q",
        ),
        None,
    )
    with ThreadPoolExecutor(max_workers=3) as pool:
        futs = {
            k: pool.submit(run, d, argv, during, 15.0 if k == "suite-killed" else 1.0)
            for k, (d, argv, during) in jobs.items()
        }
        return {k: (jobs[k][0], f.result()) for k, f in futs.items()}


def _common(res: dict) -> None:
    assert res["rc"] == 2, res["out"][-3000:]
    after = f", {res['after_fault']:.1f} s after the fault" if res["after_fault"] else ""
    assert res["wall"] <= CELL_TIMEOUT_S + 15, f"exit after {res['wall']:.1f} s{after}"
    assert res["started"], "the engine never started"
    assert not res["survivors"], f"alive after the run: {res['survivors']}\n{res['out'][-2000:]}"


@pytest.mark.parametrize("fault", FAULTS)
def test_suite_fault_ends_every_process_and_names_request_and_end(runs, fault):
    d, res = runs[fault]
    _common(res)
    if fault == "fork":
        assert len(res["started"]) == 3  # the engine, a child in its group, one in its own session
    summary = (d / "run" / "summary.md").read_text()
    assert "### How the engines ended" in summary
    row = next(ln for ln in summary.splitlines() if ln.startswith("| cold_warm | session |"))
    assert "| 1 |" in row and ENDED[fault] in row, row
    html = (d / "run" / "report.html").read_text()
    assert "request 1" in html and "How the engines ended" in html
    if fault == "sigkill":  # the engine was killed (signal 9) during request 1; the OOM record was read
        assert "was killed by signal 9 (SIGKILL, not sent by perfkit) during request 1" in html
        assert "no record found" in row or "kernel log:" in row or "cgroup" in row
    else:
        assert "request 1 (id req-1)" in html or fault == "sigstop"
    # the bundle names it too
    import pandas as pd

    la = pd.read_parquet(d / "run" / "cold_warm" / "launches.parquet")
    info = json.loads((d / "run" / "run.json").read_text())
    assert all(n["in_flight"] is None for n in info["notebooks"])  # the launch ended in the kernel
    assert int(la["failed_request"].iloc[0]) == 1 and ENDED[fault] in la["ended"].iloc[0]


def test_kernel_killed_mid_request_leaves_nothing(runs):
    """The kernel dies before its teardown: the engine goes with it (SIGKILL parent-death
    signal), its children (one outside its session) are ended by the suite, their owner."""
    d, res = runs["kernel-killed"]
    _common(res)
    assert len(res["started"]) == 3
    info = json.loads((d / "run" / "run.json").read_text())
    nb = next(n for n in info["notebooks"] if n["name"] == "cold_warm")
    assert nb["status"] == "error"
    ended = {e["pid"] for e in nb["outlived"]}
    children = {pid for pid, _ in res["started"][1:]}
    assert children <= ended, (nb["outlived"], res["started"])
    # the request in flight when the kernel stopped is named, from the kernel's progress events
    assert nb["in_flight"] == {"launch": "session", "request": 1}
    assert "the kernel stopped during launch 'session', request 1" in nb["error"]
    summary = (d / "run" / "summary.md").read_text()
    engine_pid = res["started"][0][0]
    row = next(
        ln for ln in summary.splitlines() if ln.startswith(f"| cold_warm | pid {engine_pid} session |")
    )
    assert "| 1 |" in row and "had ended on signal 9 (SIGKILL)" in row, row


def test_suite_killed_mid_request_leaves_nothing(runs):
    """``perfkit suite`` SIGKILLed while a request hangs: its reaper (a process of its own
    session) ends the kernel, the engine and both of the engine's children within seconds."""
    d, res = runs["suite-killed"]
    assert res["rc"] == -signal.SIGKILL
    assert len(res["started"]) == 3
    assert not res["survivors"], res["survivors"]
    kpid, kct = (d / "kernel.txt").read_text().split()
    assert alive(int(kpid), float(kct)) is None, "the kernel outlived the killed suite"


def test_shard_run_with_a_hung_engine(runs):
    d, res = runs["shard"]
    _common(res)
    manifest = json.loads((d / "shard" / "shard.json").read_text())
    err = manifest["outcomes"][0]["error"]
    assert "request 1 (id req-1) timed out" in err and ENDED["hang"] in err, err


def test_measure_with_an_engine_that_never_exits(runs):
    d, res = runs["measure"]
    _common(res)
    err = json.loads((d / "m" / "measure.json").read_text())["cold_warm"]["error"]
    assert "request 1 (id req-1) timed out" in err and ENDED["drain"] in err, err


def test_ab_with_a_hung_b_side(runs):
    d, res = runs["ab"]
    _common(res)
    summary = (d / "ab" / "summary.md").read_text()
    assert "B00" in summary and "request 1 (id req-1) timed out" in summary, summary
    assert ENDED["hang"] in summary


def test_oom_record_is_read_never_guessed(tmp_path):
    """The OOM-kill record comes from the kernel log's own lines (or the cgroup's
    memory.events); without one it says what was read."""
    from perfkit.readings.memory import oom_record

    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000000,-;eth0: link up\n"
        "4,101,6000000,-;python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0\n"
        " SUBSYSTEM=memory\n"
        "6,102,6000100,-;oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=4242,uid=0\n"
        "3,103,6000200,-;Out of memory: Killed process 4242 (python) total-vm:9000kB, anon-rss:8000kB\n"
    )
    rec = oom_record([4242, 4243], kmsg=str(kmsg))
    assert rec.startswith("kernel log: oom-kill:") and "Killed process 4242 (python)" in rec
    assert oom_record([42], kmsg=str(kmsg)) == f"no record found (read {kmsg})"
    assert "not readable: FileNotFoundError" in oom_record([42], kmsg=str(tmp_path / "none"))
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert oom_record([42], cgroup_path=cg, kmsg=str(kmsg)) == f"cgroup {cg}: memory.events oom_kill 1"
    # a record older than the engine (the same pid, reused) is not its record
    boot = psutil.boot_time()
    assert oom_record([4242], kmsg=str(kmsg), since=boot + 8.0).startswith("no record found")
    assert oom_record([4242], kmsg=str(kmsg), since=boot + 6.0).startswith("kernel log:")


def _suite_killing_its_engine(
    argv: list[str], out: Path, label: str, lines: int, wait_s: float
) -> tuple[int, str, float | None]:
    """Run the suite ``argv`` (output ``out``); once the performance.log of the launch whose path
    holds ``label`` has ``lines`` lines, SIGKILL that launch's reference engine (its process
    group) from outside. Returns (exit code, output, when it was killed or None)."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at = None
    try:
        deadline = time.monotonic() + wait_s
        while killed_at is None and time.monotonic() < deadline and proc.poll() is None:
            logs = [p for p in out.rglob("performance.log") if label in str(p)]
            if logs and len(logs[0].read_text().splitlines()) >= lines:
                victim = next(
                    p for p in psutil.Process(proc.pid).children(recursive=True)
                    if label in " ".join(p.cmdline()) and "perfkit.refengine" in " ".join(p.cmdline())
                )  # fmt: skip
                os.killpg(os.getpgid(victim.pid), signal.SIGKILL)
                killed_at = time.time()
            time.sleep(0.05)
        text, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, text, killed_at


@pytest.mark.slow
def test_an_engine_lost_during_a_load_level_is_an_error_naming_each_request(tmp_path):
    """Found by the breaker: the tiny reference engine SIGKILLed (its process group) during a
    concurrency level read as exit 1, REGRESSION, its failed-request cell "–". Now: exit 2,
    ERROR, the lost requests named by level and index, every request ended within seconds of
    the kill (not one request timeout each), the failed-request cell a number."""
    out = tmp_path / "run"
    argv = perfkit(
        "suite", "--params", "params/ci-cpu.yaml", "--only", "load", "--set", "load.enabled=true",
        "--set", "engine.request_timeout_s=300", "--out", str(out), "-q", "--no-screenshot",
    )  # fmt: skip
    # 3 warm-up requests and level c1's 8 done, 2 more: inside level c2
    code, text, killed_at = _suite_killing_its_engine(argv, out, "", 13, 240)
    assert killed_at is not None, "the load levels never started"
    assert code == 2, text[-3000:]
    summary = (out / "summary.md").read_text()
    assert "ERROR (exit 2)" in summary.splitlines()[0], summary[:500]
    assert "REGRESSION" not in summary.splitlines()[0]
    rows = json.loads((out / "load" / "results.json").read_text())["per_request"]
    lost = [r for r in rows if r["status"] != "completed"]
    assert lost and all(r["phase"] == "closed" for r in lost), lost
    # each lost request ended within seconds of the kill (a request timeout is 300 s)
    assert max(r["t_end_s"] for r in lost) - killed_at < 10.0, [r["t_end_s"] - killed_at for r in lost]
    err = json.loads((out / "load" / "results.json").read_text())["error"]
    assert "was killed by signal 9 (SIGKILL, not sent by perfkit)" in err, err
    levels = {r["level"] for r in lost}
    assert all(re.search(rf"concurrency {k}: requests \d", err) for k in levels), err
    assert "How the engines ended" in summary and "| load | session | –" not in summary
    failed_cell = re.search(r"\| load \| session \| (\d+) \|", summary)
    assert failed_cell and int(failed_cell.group(1)) == min(r["i"] for r in lost), summary


def test_the_load_client_ends_a_hung_call_once_the_engine_is_dead():
    """A socket that accepts and never answers (a dead engine's port held by a leftover child):
    the request in flight ends within a poll of ``alive`` turning False, the next is not sent;
    without ``alive`` it would wait its whole timeout."""
    import asyncio
    import socket

    from perfkit.engine.client import ALIVE_EVERY_S, AsyncVideoClient, VideoRequestSpec

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepted by the kernel, never answered
    dead_at = float("inf")

    async def go():
        nonlocal dead_at
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        async with AsyncVideoClient(url, 2, 60.0, 0.01, alive=lambda: time.monotonic() < dead_at) as c:
            # from here: httpx's import and the client's making take up to 1 s on a loaded host
            dead_at = time.monotonic() + 0.5
            first = await c.generate(VideoRequestSpec(), slot=0)
            t = time.monotonic()
            second = await c.generate(VideoRequestSpec(), slot=1)
            return first, second, time.monotonic() - t

    try:
        first, second, t_second = asyncio.run(go())
    finally:
        srv.close()
    assert first.status == "error" and first.error == "lost the engine while submitting", first
    assert first.t_end - first.t_submit < 0.5 + 3 * ALIVE_EVERY_S + 0.5, first.client_ms
    assert second.error == "not sent: the engine was gone" and t_second < 0.05


def test_a_stopped_engine_costs_one_timeout_then_the_level_ends_as_an_error(monkeypatch):
    """Found by the breaker: a SIGSTOPped engine (alive, answering nothing) made ``load`` wait
    each remaining request's whole timeout. Now the first timeout asks ``GET /health``; no
    answer and the engine counts as lost: the requests in flight end at once, the rest are not
    sent, and load's error names it with each request by level and index (exit 2)."""
    import asyncio
    import socket

    from perfkit.engine import client as C
    from perfkit.investigations.load import engine_lost

    monkeypatch.setattr(C, "HEALTH_AFTER_TIMEOUT_S", 0.5)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # accepted by the kernel, never answered: a stopped process's port

    async def go():
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        async with C.AsyncVideoClient(url, 2, 2.0, 0.01, alive=lambda: True) as c:
            t = time.monotonic()
            outs = await C.closed_loop(c, [C.VideoRequestSpec()] * 6, 2)
            return outs, time.monotonic() - t, c.lost_why

    try:
        outs, wall, why = asyncio.run(go())
    finally:
        srv.close()
    assert [o.status for o in outs][:2] == ["timeout", "timeout"], outs
    assert all(
        o.status == "error" and o.error.startswith("not sent: the engine stopped answering") for o in outs[2:]
    )
    assert why and "GET /health had no answer within 0.5 s" in why
    # one 2 s timeout and one health check (2.5 s), not three rounds of timeouts (6 s)
    assert wall < 2.0 + 0.5 + 2.0, wall
    rows = [
        {"status": o.status, "phase": "closed", "level": 2, "slot": i, "error": o.error}
        for i, o in enumerate(outs)
    ]
    err = engine_lost({"end_by_perfkit": True}, rows, why)
    assert err.startswith("the engine stopped answering") and "concurrency 2: requests 0-5" in err, err
    assert engine_lost({"end_by_perfkit": True}, rows) is None  # ended by perfkit, answering: no loss


def test_a_capped_launch_lost_to_an_outside_sigkill_is_an_error(tmp_path):
    """Found by the breaker: the engine of a capped launch (8GiB host) SIGKILLed by something
    other than its cap read as "did not complete, held" and PASS. Now the bundle check raises
    (exit 2) naming the launch, its budget and how it ended; with an OOM record it stays a verdict."""
    from perfkit.engine.caps import MemoryCaps
    from perfkit.engine.spec import EngineSpec
    from perfkit.investigations import memory_budget as mb
    from perfkit.investigations.registry import InvestigationError

    spec = EngineSpec.from_dict(engine("sigkill", tmp_path / "pids", request_timeout_s=30))
    b = mb.memory_budget(spec, caps=[MemoryCaps(host_gib=8)], repeats=3, run_dir=tmp_path / "mb")
    c = b.results["caps"][0]
    assert c["label"] == "8GiB host" and not c["completed"] and c["n_completed"] == 1, c
    with pytest.raises(InvestigationError, match=r"launch cap0 \(8GiB host\) lost its engine") as exc:
        mb.check_bundle(b)
    assert "was killed by signal 9 (SIGKILL, not sent by perfkit)" in str(exc.value)
    # the same launch with the cap's OOM record (a cgroup OOM kill) is the cap's verdict
    b.tables["launches"].loc[0, "oom_record"] = "cgroup /sys/fs/cgroup/x: memory.events oom_kill 1"
    mb.check_bundle(b)
    # and so is a CUDA OOM under the cap (cap_held False)
    b.tables["launches"].loc[0, "oom_record"] = "no record found (read /dev/kmsg)"
    with pytest.raises(InvestigationError):
        mb.check_bundle(b)
    c["cap_held"] = False
    mb.check_bundle(b)


def test_a_capped_engine_lost_before_it_was_ready_is_an_error_and_a_cap_kill_a_verdict(tmp_path):
    """Found by the breaker: memory_budget's engine SIGKILLed from outside before it was ready
    read as "did not complete, held" and PASS (the start failure's launch row said nothing of
    how the engine ended). Now it carries the signal: the bundle check raises; a host cap that
    ends the engine during start is the cap's verdict (not held), no error."""
    import fake_engine
    from perfkit.engine.caps import MemoryCaps
    from perfkit.engine.spec import EngineSpec
    from perfkit.investigations import memory_budget as mb
    from perfkit.investigations.registry import InvestigationError

    def spec(*args):
        return EngineSpec(kind="command", command_template=fake_engine.command(*args), startup_timeout_s=20)

    lost = mb.memory_budget(
        spec("--mode", "exit", "--exit-signal", "9"),
        caps=[MemoryCaps(host_gib=8)],
        repeats=1,
        run_dir=tmp_path / "a",
    )
    assert lost.launches.loc[0, "end_signal"] == 9 and lost.launches.loc[0, "end_by_perfkit"] == False  # noqa: E712
    with pytest.raises(InvestigationError, match=r"launch cap0 \(8GiB host\) lost its engine") as exc:
        mb.check_bundle(lost)
    assert "was killed by signal 9 (SIGKILL, not sent by perfkit)" in str(exc.value)
    capped = mb.memory_budget(
        spec("--mode", "alloc", "--alloc-when", "start"),
        caps=[MemoryCaps(host_gib=0.25, host_enforcement="watchdog")],
        repeats=1,
        run_dir=tmp_path / "b",
    )
    c = capped.results["caps"][0]
    assert not c["completed"] and c["cap_held"] is False, c
    mb.check_bundle(capped)  # the cap's verdict: a check, not an error


@pytest.mark.slow
def test_suite_with_a_capped_engine_sigkilled_from_outside_exits_2(tmp_path):
    """The breaker's run: ci-cpu's memory_budget (its 8GiB-host budget alone, cap0), the
    launch's engine SIGKILLed once its performance.log has 2 lines. Was exit 0, PASS, "did not
    complete, held"; now exit 2, ERROR naming the launch and how it ended."""
    out = tmp_path / "run"
    argv = perfkit(
        "suite", "--params", "params/ci-cpu.yaml", "--only", "memory_budget", "--out", str(out),
        "--set", "memory_budget.caps=[{label: 8GiB host, host_gib: 8}]", "-q", "--no-screenshot",
    )  # fmt: skip
    code, text, killed_at = _suite_killing_its_engine(argv, out, "cap0", 2, 300)
    assert killed_at is not None, "the capped launch never got 2 records"
    assert code == 2, text[-3000:]
    summary = (out / "summary.md").read_text()
    assert "ERROR (exit 2)" in summary.splitlines()[0] and "PASS" not in summary.splitlines()[0], summary[
        :500
    ]
    err = "launch cap0 (8GiB host) lost its engine, not to its cap: it was killed by signal 9 (SIGKILL, not sent by perfkit)"
    assert err in summary, summary[:3000]

"""The owner's reap and a launch's teardown (issue 42's first live H200 A/B): an engine's own
child that ends on the teardown's SIGTERM after the engine exited (torch inductor's compile
workers) is re-parented to the owner as a zombie; it ended with the teardown and is not named
as outliving the launch. One that ended on SIGKILL (an engine killed by its parent-death
signal) still is, unless it is an engine's child registered at teardown (``... (child)``): the
teardown SIGKILLs the group; one that exited 0 ended cleanly (real sglang's resource tracker and
worker). Real processes, in a subprocess of its own (the owner becomes a subreaper)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    import psutil
    from perfkit.engine.owner import Watch, become_subreaper

    assert become_subreaper()
    out = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        watch = Watch.start()
        # the "engine": starts a child of its own in its group, prints its pid, exits at once
        eng = subprocess.run(
            [sys.executable, "-c",
             "import subprocess as s; p = s.Popen(['sleep', '60'], stdout=s.DEVNULL, stderr=s.DEVNULL);"
             " print(p.pid)"],
            capture_output=True, text=True, check=True,
        )
        pid = int(eng.stdout)
        child = psutil.Process(pid)  # re-parented here (the subreaper)
        assert child.ppid() == os.getpid(), child.ppid()
        os.kill(pid, sig)  # the teardown's signal (SIGTERM), or a parent-death SIGKILL
        for _ in range(200):
            if child.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        ended = watch.reap(grace_s=1.0)
        out[sig.name] = {
            "returned": [e.how for e in ended if e.pid == pid],
            "gone": [e.how for e in watch.gone if e.pid == pid],
            "teardown": [e.how for e in watch.ended_on_teardown if e.pid == pid],
        }
    # a process that exited 0, and an engine's child (registered at teardown) on the group's SIGKILL
    import tempfile
    from perfkit.engine.owner import register
    reg = os.path.join(tempfile.mkdtemp(), "r.processes.jsonl")
    for name, code in (("child exit 0", "sleep 0.3"), ("child SIGKILL", "sleep 60")):
        watch = Watch.start(reg)
        eng = subprocess.run(
            [sys.executable, "-c",
             f"import subprocess as s; p = s.Popen(['sh', '-c', {code!r}], stdout=s.DEVNULL,"
             " stderr=s.DEVNULL); print(p.pid)"],
            capture_output=True, text=True, check=True,
        )
        pid = int(eng.stdout)
        child = psutil.Process(pid)
        if name == "child SIGKILL":  # exit 0 needs no registration: a clean end is no leftover
            register(pid, os.getpgid(pid), child.create_time(), "eng (child)", path=reg)
            os.kill(pid, signal.SIGKILL)
        for _ in range(300):
            if child.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        ended = watch.reap(grace_s=1.0)
        out[name] = {
            "returned": [e.how for e in ended if e.pid == pid],
            "teardown": [e.how for e in watch.ended_on_teardown if e.pid == pid],
        }
    print(json.dumps(out))
    """
)


def test_reap_names_no_zombie_that_ended_on_the_teardowns_sigterm():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    term, kill = out["SIGTERM"], out["SIGKILL"]
    # ended on SIGTERM: reaped and kept, not returned (not a launch error)
    assert term["returned"] == []
    assert (
        term["gone"]
        == term["teardown"]
        == ["had ended on signal 15 (SIGTERM) by the time its launcher was gone"]
    )
    # ended on SIGKILL: still named as found after its launcher
    assert kill["returned"] == ["had ended on signal 9 (SIGKILL) by the time its launcher was gone"]
    assert kill["teardown"] == []
    # exited 0 (not registered), or an engine's registered child ended on the group's SIGKILL
    assert out["child exit 0"] == {
        "returned": [],
        "teardown": ["had exited with code 0 by the time its launcher was gone"],
    }
    assert out["child SIGKILL"] == {
        "returned": [],
        "teardown": ["had ended on signal 9 (SIGKILL) by the time its launcher was gone"],
    }

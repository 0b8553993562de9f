"""The owner of every process perfkit starts: registered, found again, ended on a deadline
(subreaper, registry file, :class:`Watch`, the reaper process, :func:`run_bounded`); what remains
when the launcher itself is gone. See docs/robustness.md ("The owner", "The suite's reaper").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import psutil

log = logging.getLogger(__name__)

#: environment variable naming the owner's registry file (JSON lines)
REGISTRY_ENV = "PERFKIT_OWNER_REGISTRY"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: start times within this many seconds are the same process (psutil rounds to clock ticks)
SAME_START_S = 0.05


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except OSError:
        return False


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux; True when set), so that
    :class:`Watch` still sees an orphan below it."""
    ok = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if not ok:
        log.info("PR_SET_CHILD_SUBREAPER not available: orphans go to init (the registry still finds them)")
    return ok


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """``PR_SET_PDEATHSIG``: ``sig`` to this process when the thread that forked it dies (``preexec_fn``)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))


def register(pid: int, pgid: int, create_time: float, label: str, path: str | Path | None = None) -> None:
    """Append one started process to the registry file (default :data:`REGISTRY_ENV`'s). Never raises."""
    target = path or os.environ.get(REGISTRY_ENV)
    if not target:
        return
    line = json.dumps(
        {"pid": pid, "pgid": pgid, "create_time": create_time, "label": label, "owner_pid": os.getpid()}
    )
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError as exc:
        log.warning("cannot register pid %d with the owner (%s): %s", pid, target, exc)


def registered(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a registry file, or of a directory's ``*.processes.jsonl`` (bad lines skipped)."""
    path = Path(path)
    if path.is_dir():
        return [e for f in sorted(path.glob("*.processes.jsonl")) for e in registered(f)]
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    for ln in text.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(ln)
            if isinstance(d, dict) and "pid" in d and "create_time" in d:
                out.append(d)
    return out


def alive(pid: int, create_time: float) -> psutil.Process | None:
    """The process ``pid`` if it runs and started at ``create_time`` (not a zombie), else None."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) > SAME_START_S or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.Error:
        return None


def marked(prefix: str | Path) -> list[psutil.Process]:
    """Running processes whose environment has :data:`REGISTRY_ENV` under ``prefix`` (a file or a
    directory); those whose environment cannot be read are skipped."""
    pre = str(prefix)
    out = []
    me = os.getpid()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            v = p.pid != me and p.environ().get(REGISTRY_ENV)
            if v and (v == pre or v.startswith(pre.rstrip("/") + "/")) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return (p.pid, p.create_time())
    except psutil.Error:
        return None


def descendants() -> dict[tuple[int, float], psutil.Process]:
    """This process's descendants by (pid, start time)."""
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return {}
    return {k: p for p in kids if (k := _key(p)) is not None}


@dataclass
class Ended:
    """How one process the owner ended went: ``how`` in words (``ended on SIGTERM after 0.2 s``)."""

    pid: int
    label: str
    how: str
    killed: bool
    after_s: float
    stopped: bool = False


def kill_tree(groups: Iterable[int], procs: Iterable[psutil.Process], sig: int) -> None:
    """Signal process groups and processes (which may have left them); the gone are skipped."""
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _wait_gone(procs: list[psutil.Process], timeout: float, t0: float, gone_at: dict[int, float]) -> list:
    """Wait up to ``timeout`` s for ``procs`` to end (into ``gone_at``); returns the rest."""
    deadline = time.monotonic() + timeout
    rest = list(procs)
    while True:
        for p in [p for p in rest if not _running(p)]:
            gone_at[p.pid] = time.monotonic() - t0
            rest.remove(p)
        if not rest or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    psutil.wait_procs([p for p in procs if p not in rest], timeout=0)  # sets our children's returncode
    return rest


def end_processes(procs: dict[psutil.Process, str], grace_s: float) -> list[Ended]:
    """SIGTERM (+ SIGCONT) each process and its process group, wait up to ``grace_s``, SIGKILL
    what is left (groups included), reap our own children; returns how each ended."""
    if not procs:
        return []
    stopped = {p.pid: False for p in procs}
    groups = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            stopped[p.pid] = p.status() == psutil.STATUS_STOPPED
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p.pid))
    groups.discard(os.getpgrp())  # never our own group
    t0 = time.monotonic()
    for sig in (signal.SIGTERM, signal.SIGCONT):
        kill_tree(groups, procs, sig)
    gone_at: dict[int, float] = {}
    rest = _wait_gone(list(procs), grace_s, t0, gone_at)
    t_kill = time.monotonic() - t0
    kill_tree(groups, rest, signal.SIGKILL)
    _wait_gone(rest, 5, t0, {})
    out = []
    for p, label in procs.items():
        was = " (it was stopped)" if stopped[p.pid] else ""
        killed = p in rest
        t = t_kill if killed else gone_at.get(p.pid, 0.0)
        how = (
            f"did not exit within {grace_s:g} s of SIGTERM{was}: killed by perfkit (SIGKILL) after {t:.1f} s"
            if killed
            else f"ended on SIGTERM{was} after {t:.1f} s"
        )
        out.append(Ended(p.pid, label, how, killed, round(t, 2), stopped[p.pid]))
    return out


def tree(pid: int, pgid: int | None = None, since: float | None = None) -> list[psutil.Process]:
    """Process ``pid`` (started at ``since``, if given), its descendants and every process of group
    ``pgid`` (default ``pid``) started since; never this process."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        if since is None or abs(root.create_time() - since) <= SAME_START_S:
            found = {q.pid: q for q in (root, *root.children(recursive=True))}
    group = pid if pgid is None else pgid
    for q in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if q.pid not in found and os.getpgid(q.pid) == group:
                if since is None or q.create_time() >= since - SAME_START_S:
                    found[q.pid] = q
    found.pop(os.getpid(), None)
    return list(found.values())


def run_bounded(
    args: str | list[str], timeout_s: float | None = None, grace_s: float = 2.0, **popen: Any
) -> "subprocess.CompletedProcess[Any]":
    """:func:`subprocess.run` in its own session whose whole tree is ended past ``timeout_s`` or on
    an interrupt; subprocess.TimeoutExpired (its tree already ended)."""
    if popen.pop("capture_output", False):
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    # made first, so that an interrupt while it starts (after the fork) still finds its pid
    proc = subprocess.Popen.__new__(subprocess.Popen)
    try:
        proc.__init__(args, start_new_session=True, **popen)
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        if getattr(proc, "pid", None) is not None:
            ended = end_processes(dict.fromkeys(tree(proc.pid), ""), grace_s)
            log.info("ended %s with %d process(es) of its tree", args, len(ended))
            with contextlib.suppress(Exception):
                proc.__exit__(None, None, None)  # its pipes closed, itself reaped
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def signal_name(n: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number that names none."""
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _ended_alone(code: int | None) -> str:
    if code is not None and code < 0:
        return f"had ended on signal {-code} ({signal_name(-code)}) by the time its launcher was gone"
    return f"had exited with code {code} by the time its launcher was gone"


def _teardown_end(code: int | None, label: str) -> bool:
    """Whether a zombie found at reap ended with its launch's teardown (docs/robustness.md)."""
    return code in (0, -signal.SIGTERM) or (label.endswith(" (child)") and code == -signal.SIGKILL)


@dataclass
class Watch:
    """Everything under this process (and in ``registry``, a file or directory) before a piece of
    work; see :meth:`reap`."""

    registry: Path | None = None
    before: set[tuple[int, float]] = field(default_factory=set)
    gone: list[Ended] = field(default_factory=list)  # new descendants found already ended
    ended_on_teardown: list[Ended] = field(default_factory=list)

    @classmethod
    def start(cls, registry: str | Path | None = None) -> "Watch":
        """Snapshot this process's descendants now."""
        return cls(Path(registry) if registry else None, set(descendants()))

    def leftovers(self) -> dict[psutil.Process, str]:
        """Processes started since :meth:`start` that still run, with their labels; a new zombie
        is reaped into :attr:`gone`."""
        entries = registered(self.registry) if self.registry else []
        by_pid = {int(e["pid"]): str(e.get("label") or "") for e in entries}
        by_group = {int(e.get("pgid") or 0): str(e.get("label") or "") for e in entries}
        found: dict[tuple[int, float], tuple[psutil.Process, str]] = {}
        for k, p in descendants().items():
            if k in self.before:
                continue
            label = by_pid.get(p.pid, "")
            if not label:
                with contextlib.suppress(OSError):
                    label = f"{by_group[os.getpgid(p.pid)]} (child)" if os.getpgid(p.pid) in by_group else ""
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    with contextlib.suppress(psutil.Error, ChildProcessError):
                        code = p.wait(timeout=0)
                        e = Ended(p.pid, label, _ended_alone(code), False, 0.0)
                        self.gone.append(e)
                        if _teardown_end(code, label):
                            self.ended_on_teardown.append(e)
                    continue
            except psutil.Error:
                continue
            found[k] = (p, label or "started under it, not registered")
        for e in entries:
            p = alive(int(e["pid"]), float(e["create_time"]))
            if p is None:
                continue
            # it, and the rest of its group (children that were re-parented elsewhere)
            label = str(e.get("label") or "")
            for q in tree(p.pid, int(e.get("pgid") or 0) or p.pid, float(e["create_time"])):
                qk = _key(q)
                if qk is not None and qk not in self.before and (q.pid == p.pid or qk not in found):
                    found[qk] = (q, label if q.pid == p.pid else f"{label} (child)")
        if self.registry is not None:  # whatever still carries this registry in its environment
            for p in marked(self.registry):
                k = _key(p)
                if k is not None and k not in found and k not in self.before:
                    found[k] = (p, "started under it (its environment names this run)")
        return {p: label for p, label in found.values() if p.pid != os.getpid()}

    def reap(self, grace_s: float = 5.0) -> list[Ended]:
        """End every leftover on a deadline; returns how each ended, with the zombies found ended
        except :attr:`ended_on_teardown`, and logs a warning for each."""
        self.gone = []
        self.ended_on_teardown = []
        left = self.leftovers()
        for e in self.ended_on_teardown:
            log.info(
                "ended with its engine's teardown (reaped here): pid %d %s: %s", e.pid, e.label or "", e.how
            )
        ended = [e for e in self.gone if e not in self.ended_on_teardown] + end_processes(left, grace_s)
        for e in ended:
            log.warning("left running after its launcher: pid %d %s: %s", e.pid, e.label or "", e.how)
        return ended


def describe(ended: list[Ended]) -> str:
    """One sentence naming what the owner had to end (``""`` for nothing)."""
    if not ended:
        return ""
    parts = [f"pid {e.pid}{' ' + repr(e.label) if e.label else ''} {e.how}" for e in ended]
    n = len(ended)
    return (
        f"{n} process{'es' if n != 1 else ''} found after {'their' if n != 1 else 'its'} launcher ended: "
        + "; ".join(parts)
    )


# ---------------------------------------------------------------------------- this process's engines
@dataclass(frozen=True)
class StartedProcess:
    """An engine process this process launched: pid, group, create time (epoch s), label, command."""

    pid: int
    pgid: int
    create_time: float
    label: str
    command: tuple[str, ...]


_REGISTRY: list[StartedProcess] = []
_REGISTRY_LOCK = threading.Lock()


def started_processes() -> list[StartedProcess]:
    """Every engine process (and descendant seen at teardown) launched in this process, oldest first."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY)


def _register(p: StartedProcess) -> None:
    with _REGISTRY_LOCK:
        _REGISTRY.append(p)
    register(p.pid, p.pgid, p.create_time, p.label)


def surviving(procs: list[StartedProcess]) -> list[StartedProcess]:
    """Those of ``procs`` still alive (same pid and start time, not a zombie)."""
    return [sp for sp in procs if alive(sp.pid, sp.create_time) is not None]


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------- the reaper
def spawn_reaper(directory: str | Path, grace_s: float) -> "subprocess.Popen[bytes] | None":
    """Start the reaper of this run (docs/robustness.md "The suite's reaper"): once this process is
    gone it ends what ``directory``'s registries name; None when it cannot be started (logged)."""
    me = psutil.Process()
    job = {"owner": me.pid, "start": me.create_time(), "dir": str(directory), "grace": float(grace_s)}
    argv = [sys.executable, "-m", "perfkit.engine.owner", json.dumps(job)]
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True
        )
    except OSError as exc:
        log.warning("no reaper for %s: %s", directory, exc)
        return None


def stop_reaper(proc: "subprocess.Popen[bytes] | None") -> None:
    """End a reaper started by :func:`spawn_reaper` (the owner ended normally)."""
    if proc is None:
        return
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


def _reaper_main(job: str) -> int:
    a = json.loads(job)
    while alive(a["owner"], a["start"]) is not None:
        time.sleep(0.5)
    d = Path(a["dir"])
    ended = end_processes(Watch(d).leftovers(), a["grace"])
    if ended:
        with contextlib.suppress(OSError):
            with open(d / "reaper.log", "a", encoding="utf-8") as fh:
                fh.write(describe(ended) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_reaper_main(sys.argv[1]))

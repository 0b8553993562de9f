"""The processes :func:`perfkit.engine.launch.launch` started: this Python process's registry
(:func:`started_processes`, :func:`surviving`, for tests to assert that none survives), the
parent-death signal, cgroup kill, and the words saying how an engine ended.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from perfkit.engine import owner as _owner


# ---------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class StartedProcess:
    pid: int
    pgid: int
    create_time: float
    label: str
    command: tuple[str, ...]


_REGISTRY: list[StartedProcess] = []
_REGISTRY_LOCK = threading.Lock()


def started_processes() -> list[StartedProcess]:
    """Every engine process (and descendant seen at teardown) started by :func:`launch` in
    this Python process, oldest first."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY)


def _register(p: StartedProcess) -> None:
    with _REGISTRY_LOCK:
        _REGISTRY.append(p)


def surviving(procs: list[StartedProcess]) -> list[StartedProcess]:
    """Those of ``procs`` still alive (same pid and start time, not a zombie)."""
    out = []
    for sp in procs:
        try:
            p = psutil.Process(sp.pid)
            if abs(p.create_time() - sp.create_time) > 0.05:
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(sp)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            out.append(sp)
    return out


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _end_words(
    rc_before: int | None,
    rc: int | None,
    stopped: bool,
    killed: bool,
    waited_s: float,
    grace_s: float,
    pids: list[int],
    cgroup_path: Path | None,
    since: float | None = None,
) -> dict[str, Any]:
    """How an engine ended, as :attr:`EngineHandle.end` holds it (see there)."""
    from perfkit.readings.oom import oom_record

    code = rc_before if rc_before is not None else rc
    sig = -code if code is not None and code < 0 else None
    oom = None
    if rc_before is not None:  # it ended by itself, before perfkit's teardown
        if sig is not None:
            how = f"was killed by signal {sig} ({_signal_name(sig)}, not sent by perfkit)"
            oom = oom_record(pids, cgroup_path, since=since)
        else:
            how = f"exited with code {code}"
        by_perfkit = False
    elif killed:
        how = f"did not exit within {grace_s:g} s of SIGTERM: killed by perfkit (SIGKILL) after {waited_s:.1f} s"
        by_perfkit = True
    else:
        how = f"ended on perfkit's SIGTERM after {waited_s:.1f} s (exit code {code})"
        by_perfkit = True
    if stopped:
        how = f"was stopped (SIGSTOP) when perfkit ended it; {how}"
    return {
        "how": how,
        "exit_code": code,
        "signal": sig,
        "by_perfkit": by_perfkit,
        "after_s": round(waited_s, 2),
        "stopped": stopped,
        "oom": oom,
    }


def _cgroup_kill(path: Path | None) -> None:
    """``cgroup.kill`` of the engine's own cgroup v2 (Linux >= 5.14), when it has one."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        (Path(path) / "cgroup.kill").write_text("1")


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when my launcher dies (Linux ``PR_SET_PDEATHSIG``).

    The engine runs in its own session (so its group can be signalled as a whole), which also
    means a killed launcher (a notebook kernel shut down by papermill, ``perfkit suite`` stopped
    by a CI cancel) would leave it running; the death signal closes that gap. SIGKILL, not
    SIGTERM: a stopped engine, or one that drains in-flight jobs on SIGTERM, would not act on
    SIGTERM. The engine's own children are ended by the owner (:mod:`perfkit.engine.owner`).
    Elsewhere: no-op.
    """
    _owner.die_with_parent(signal.SIGKILL)

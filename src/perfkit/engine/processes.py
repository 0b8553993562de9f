"""The processes :func:`perfkit.engine.launch.launch` started: this Python process's registry
(:func:`started_processes`, :func:`surviving`, for tests to assert that none survives), cgroup
kill, and the words saying how an engine ended.
"""

from __future__ import annotations

import contextlib
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
    return [sp for sp in procs if _owner.alive(sp.pid, sp.create_time) is not None]


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
            how = f"was killed by signal {sig} ({_owner.signal_name(sig)}, not sent by perfkit)"
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

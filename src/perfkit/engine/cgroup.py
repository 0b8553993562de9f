"""cgroup v2 children for a memory cap, and signalling a process tree.

:class:`Cgroup` creates a child cgroup with ``memory.max`` (and ``memory.swap.max=0``) under this
process's own cgroup or its parent, where the memory controller is delegated; the kernel then
OOM-kills what is moved into it when over (the Linux kernel's cgroup v2 memory interface,
Documentation/admin-guide/cgroup-v2.rst). Used by :mod:`perfkit.engine.caps`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from pathlib import Path

import psutil

from perfkit.readings.memory import HostMemoryReader

log = logging.getLogger(__name__)

#: where cgroup v2 is mounted
CGROUP_ROOT = Path("/sys/fs/cgroup")


def kill_tree(pgid: int | None, procs: list[psutil.Process], sig: int = signal.SIGKILL) -> None:
    """Signal a process group and any listed processes (which may have left the group)."""
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            p.send_signal(sig)


def cgroup2_available() -> bool:
    """True when /sys/fs/cgroup is a cgroup v2 mount."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(p[1:3] == [str(CGROUP_ROOT), "cgroup2"] for p in map(str.split, mounts))


def own_cgroup() -> Path | None:
    """This process's cgroup v2 directory (from /proc/self/cgroup's ``0::`` line), None when
    it has none or the file is not readable."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_ROOT / line[3:].lstrip("/")
    return None


class Cgroup:
    """A child cgroup v2 with memory.max; raises OSError when that is not possible."""

    def __init__(self, cap_bytes: int, name: str) -> None:
        if not cgroup2_available():
            raise OSError("/sys/fs/cgroup is not cgroup v2")
        own = own_cgroup()
        if own is None or not own.is_dir():
            raise OSError("own cgroup not found")
        candidates = [own, own.parent] if own != CGROUP_ROOT else [own]
        last: Exception | None = None
        for parent in candidates:
            path = parent / f"perfkit-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                # may already be on, or not allowed; the child's controllers tell
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text("+memory")
                path.mkdir()
                try:
                    if "memory" not in (path / "cgroup.controllers").read_text().split():
                        raise OSError(f"memory controller not delegated to {parent}")
                    (path / "memory.max").write_text(str(cap_bytes))
                    with contextlib.suppress(OSError):
                        (path / "memory.swap.max").write_text("0")
                except Exception:
                    path.rmdir()
                    raise
                self.path = path
                return
            except OSError as exc:
                last = exc
        raise OSError(f"cannot create a memory cgroup: {last}")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self, reader: HostMemoryReader) -> int:
        """``oom_kill`` of memory.events (0 when the key is absent: no OOM kill counted yet).

        Raises:
            MemoryReadError: memory.events is not readable or not ``key number`` lines.
        """
        return reader.cgroup_events(self.path).get("oom_kill", 0)

    def remove(self) -> None:
        for _ in range(20):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)
        log.warning("could not remove cgroup %s", self.path)

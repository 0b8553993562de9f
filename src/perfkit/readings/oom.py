"""The host's out-of-memory kill record of a process: read, never guessed.

Sources, in order: the engine's own cgroup (v2 ``memory.events``: ``oom_kill N``), then the
kernel log (``/dev/kmsg``, the lines Linux writes on an OOM kill: ``oom-kill:...,pid=N,...``
and ``Out of memory: Killed process N (name) ...`` / ``Memory cgroup out of memory: Killed
process N``). Absence is said as such, with what was read (``no record found (read /dev/kmsg)``),
and an unreadable source is named (``kernel log not readable: PermissionError``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

KMSG = "/dev/kmsg"
_KILLED = re.compile(r"Killed process (\d+)")
#: a /dev/kmsg record: "priority,sequence,microseconds,flags;message"
_RECORD = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")
_OOMKILL = re.compile(r"oom-kill:.*?[,:]pid=(\d+)")


def kernel_log_lines(path: str = KMSG, max_records: int = 100_000, since: float | None = None) -> list[str]:
    """Every record of the kernel log ring buffer now (message text only; ``path`` may also be
    a file of such records, one a line, as tests write). ``since``: only records written at or
    after this epoch time (s; a record's time is the boot time plus its microseconds).

    Raises:
        OSError: the log cannot be opened (no permission: ``kernel.dmesg_restrict``).
    """
    boot = psutil.boot_time() if since is not None else 0.0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out: list[str] = []
    try:
        while len(out) < max_records:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:  # EPIPE: a record was overwritten while reading; go on
                if exc.errno == 32:
                    continue
                raise
            if not rec:
                break
            for ln in rec.decode("utf-8", errors="replace").splitlines():
                if ln.startswith(" "):  # a record's continuation (SUBSYSTEM=, DEVICE=)
                    continue
                m = _RECORD.match(ln)
                if m and since is not None and boot + int(m.group(1)) / 1e6 < since - 1.0:
                    continue
                out.append(m.group(2) if m else ln)
    finally:
        os.close(fd)
    return out


def oom_record(
    pids: list[int], cgroup_path: str | Path | None = None, kmsg: str = KMSG, since: float | None = None
) -> str:
    """The OOM-kill record of any of ``pids`` (the engine and its descendants) as one line:
    ``"cgroup <path>: memory.events oom_kill 1"``, ``"kernel log: <line>"`` (up to three, joined
    by `` | ``) or ``"no record found (<what was read>)"``; ``since``: the engine's start (epoch s),
    so an older record of a reused pid is not it. Never raises: an unreadable source is named."""
    read: list[str] = []
    if cgroup_path is not None:
        ev = Path(cgroup_path) / "memory.events"
        try:
            counts = dict(ln.split() for ln in ev.read_text().splitlines() if len(ln.split()) == 2)
            n = int(counts.get("oom_kill", "0"))
            if n > 0:
                return f"cgroup {cgroup_path}: memory.events oom_kill {n}"
            read.append(f"{ev}: oom_kill 0")
        except (OSError, ValueError) as exc:
            read.append(f"{ev} not readable: {type(exc).__name__}")
    want = {str(p) for p in pids}
    try:
        lines = kernel_log_lines(kmsg, since=since)
        hits = [
            ln
            for ln in lines
            if any(m.group(1) in want for m in (*_KILLED.finditer(ln), *_OOMKILL.finditer(ln)))
        ]
        if hits:
            return "kernel log: " + " | ".join(hits[:3])
        read.append(f"read {kmsg}")
    except OSError as exc:
        read.append(f"kernel log {kmsg} not readable: {type(exc).__name__}")
    return f"no record found ({'; '.join(read)})"

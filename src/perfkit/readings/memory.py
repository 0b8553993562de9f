"""The host memory reader: process trees (PSS, USS, RSS), cgroups, limits, MemTotal (MiB unless
GiB is named), OOM-kill records (:func:`oom_record`); every number as in the file or an error.
Rules: docs/suite.md, "Measurement rules"; the OOM record: docs/robustness.md."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

#: the largest share of wall time a poller spends reading ``smaps_rollup`` (docs/suite.md)
PSS_DUTY = 0.01


@dataclass
class ReadBudget:
    """Paces a costly read to ``duty`` of the wall time: one at ``t0`` taking ``took`` s (monotonic)
    makes the next due at ``t0 + took / duty``."""

    duty: float
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        """Whether a read may be taken at ``now`` (monotonic s)."""
        return now >= self.next_at

    def spent(self, t0: float, took: float) -> None:
        """A read began at ``t0`` and took ``took`` s: the next one waits by the duty cycle."""
        self.next_at = t0 + took / self.duty


MIB = 2**20
GIB = 2**30
NAN = float("nan")
#: from here on no limit (cgroup v1 writes "unlimited" as PAGE_COUNTER_MAX pages)
UNLIMITED_SENTINEL = 2**60

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryReadError(RuntimeError):
    """A memory figure could not be read: :attr:`path` the file, :attr:`key` the key."""

    def __init__(self, path: str | Path, key: str, why: str) -> None:
        super().__init__(f"{path}: {key}: {why}")
        self.path = str(path)
        self.key = key


@dataclass(frozen=True)
class ProcessMemory:
    """Host memory of one process, MiB; ``source`` ``smaps_rollup``, or ``statm`` (PSS, USS NaN)."""

    pid: int
    rss_mib: float
    pss_mib: float
    uss_mib: float
    anon_mib: float
    source: str


@dataclass(frozen=True)
class TreeMemory(ProcessMemory):
    """Host memory of the tree rooted at ``pid`` (MiB) summed over ``pids``; ``vanished`` skipped."""

    root_alive: bool
    pids: tuple[int, ...]
    vanished: tuple[int, ...]


@dataclass(frozen=True)
class CgroupMemory:
    """A cgroup v2's ``memory.current`` and ``memory.peak`` (MiB; peak None before Linux 5.19)."""

    path: str
    current_mib: float
    peak_mib: float | None


@dataclass(frozen=True)
class MemoryLimit:
    """One memory limit (GiB) and its ``source`` (``cgroup-v2``, ``cgroup-v1``, ``meminfo``)."""

    source: str
    path: str
    gib: float


@dataclass(frozen=True)
class HostBudget:
    """The host budget (GiB): min(ask, every limit), and ``clamp`` why it is below the ask."""

    asked_gib: float | None
    effective_gib: float | None
    clamp: str | None


def _kib_lines(text: str, path: Path, keys: tuple[str, ...]) -> dict[str, int]:
    """``Key:   123 kB`` lines -> key -> bytes; MemoryReadError for a missing or bad key."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        k, sep, rest = line.partition(":")
        if not sep or k not in keys:
            continue
        parts = rest.split()
        try:
            v = int(parts[0])
        except (IndexError, ValueError):
            raise MemoryReadError(path, k, f"not a number: {rest.strip()!r}") from None
        unit = parts[1].lower() if len(parts) > 1 else ""
        if unit not in ("kb", ""):
            raise MemoryReadError(path, k, f"unknown unit {parts[1]!r}")
        found[k] = v * 1024 if unit == "kb" else v
    missing = [k for k in keys if k not in found]
    if missing:
        raise MemoryReadError(path, missing[0], "key not found")
    return found


def _read(path: Path, key: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise MemoryReadError(path, key, f"not readable: {exc}") from None


def _int(text: str, path: Path, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise MemoryReadError(path, key, f"not a number: {text!r}") from None


def _proc_file(path: Path, key: str) -> str | None:
    """A /proc file's text; None when its process vanished."""
    try:
        return path.read_text()
    except PermissionError as exc:
        raise MemoryReadError(path, key, f"not readable: {exc}") from None
    except OSError as exc:
        log.debug("%s: process vanished before it was read (%s)", path, exc)
        return None


class HostMemoryReader:
    """Reads host memory from ``proc_root`` and ``cgroup_root`` (tests pass fake trees)."""

    def __init__(self, proc_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
        self.proc_root = Path(proc_root)
        self.cgroup_root = Path(cgroup_root)
        self._has_rollup: bool | None = None

    def tree_pids(self, root: int) -> list[int]:
        """``root`` and its descendants (empty when root is gone)."""
        if not (self.proc_root / str(root) / "task" / str(root) / "children").exists():
            if not (self.proc_root / str(root)).exists():
                return []
            try:
                return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                return []
            except psutil.AccessDenied:
                return [root]
        out: list[int] = []
        todo = [root]
        seen: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                tids = os.listdir(self.proc_root / str(pid) / "task")
            except OSError:
                if pid == root:
                    return []
                log.debug("pid %d vanished while listing the tree of %d", pid, root)
                continue
            out.append(pid)
            for tid in tids:
                try:
                    data = (self.proc_root / str(pid) / "task" / tid / "children").read_bytes()
                except OSError:  # the thread or process ended meanwhile
                    continue
                todo.extend(int(c) for c in data.split())
        return out

    def has_smaps_rollup(self) -> bool:
        """True when this kernel has ``/proc/<pid>/smaps_rollup`` (Linux >= 4.14)."""
        if self._has_rollup is None:
            self._has_rollup = (self.proc_root / "self" / "smaps_rollup").exists()
        return self._has_rollup

    def process(self, pid: int, pss: bool = True) -> ProcessMemory | None:
        """Host memory of one process (MiB) from ``smaps_rollup`` (``pss``: costly) or ``statm``
        (PSS/USS NaN); None when it vanished. Raises MemoryReadError naming the file and key."""
        if pss and self.has_smaps_rollup():
            path = self.proc_root / str(pid) / "smaps_rollup"
            text = _proc_file(path, "Pss")
            if text is None:
                return None
            if not text.strip():  # a zombie (or a kernel thread) has no memory map
                log.debug("pid %d has an empty %s (zombie or exited): skipped", pid, path)
                return None
            v = _kib_lines(text, path, ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Anonymous"))
            uss = (v["Private_Clean"] + v["Private_Dirty"]) / MIB
            return ProcessMemory(
                pid, v["Rss"] / MIB, v["Pss"] / MIB, uss, v["Anonymous"] / MIB, "smaps_rollup"
            )
        path = self.proc_root / str(pid) / "statm"
        text = _proc_file(path, "resident")
        if text is None:
            return None
        fields = text.split()
        try:
            resident, shared = int(fields[1]), int(fields[2])
        except (IndexError, ValueError):
            raise MemoryReadError(path, "resident", f"not 'size resident shared ...': {fields!r}") from None
        if resident == 0:  # a zombie
            log.debug("pid %d has no resident memory (zombie): skipped", pid)
            return None
        # statm's resident - shared is the kernel's RssAnon
        anon = max(0, resident - shared) * _PAGE / MIB
        return ProcessMemory(pid, resident * _PAGE / MIB, NAN, NAN, anon, "statm")

    def tree(self, root: int, pids: list[int] | None = None, pss: bool = True) -> TreeMemory:
        """:meth:`process` summed over ``pids`` (default: :meth:`tree_pids`), MiB."""
        pids = self.tree_pids(root) if pids is None else pids
        got = [(pid, self.process(pid, pss=pss)) for pid in pids]
        read = [m for _, m in got if m is not None]
        gone = [pid for pid, m in got if m is None]
        by_pss = all(m.source == "smaps_rollup" for m in read) if read else pss and self.has_smaps_rollup()
        return TreeMemory(
            pid=root,
            root_alive=any(m.pid == root for m in read),
            pids=tuple(m.pid for m in read),
            vanished=tuple(gone),
            rss_mib=sum(m.rss_mib for m in read),
            pss_mib=sum(m.pss_mib for m in read) if by_pss else NAN,
            uss_mib=sum(m.uss_mib for m in read) if by_pss else NAN,
            anon_mib=sum(m.anon_mib for m in read),
            source="pss" if by_pss else "rss",
        )

    def mem_total_mib(self) -> float:
        """``MemTotal`` in MiB. Raises MemoryReadError."""
        path = self.proc_root / "meminfo"
        return _kib_lines(_read(path, "MemTotal"), path, ("MemTotal",))["MemTotal"] / MIB

    def _v2_root(self) -> Path | None:
        for d in (self.cgroup_root, self.cgroup_root / "unified"):
            if (d / "cgroup.controllers").exists():
                return d
        return None

    def own_cgroups(self) -> list[tuple[str, Path, Path]]:
        """(``cgroup-v2`` | ``cgroup-v1``, hierarchy root, directory) of this process's cgroups."""
        path = self.proc_root / "self" / "cgroup"
        try:
            text = path.read_text()
        except OSError as exc:
            log.debug("%s not readable (%s): no cgroup limits", path, exc)
            return []
        out: list[tuple[str, Path, Path]] = []
        for line in text.splitlines():
            hid, _, rest = line.partition(":")
            ctrls, _, rel = rest.partition(":")
            rel = rel.strip().lstrip("/")
            if hid == "0" and ctrls == "":
                root = self._v2_root()
                if root is not None:
                    out.append(("cgroup-v2", root, root / rel))
            elif "memory" in ctrls.split(","):
                root = self.cgroup_root / ctrls
                if not root.is_dir():
                    root = self.cgroup_root / "memory"
                if root.is_dir():
                    out.append(("cgroup-v1", root, root / rel))
        return out

    def cgroup_limits(self) -> list[MemoryLimit]:
        """Every memory limit (GiB) of this process's cgroups and ancestors. Raises MemoryReadError."""
        out: list[MemoryLimit] = []
        for kind, top, d in self.own_cgroups():
            key = "memory.max" if kind == "cgroup-v2" else "memory.limit_in_bytes"
            for level in [d, *[p for p in d.parents if p == top or top in p.parents]]:
                f = level / key
                try:
                    text = f.read_text().strip()
                except FileNotFoundError:
                    log.debug("%s: not there, no limit at this level", f)
                    continue
                except PermissionError as exc:
                    raise MemoryReadError(f, key, f"not readable: {exc}") from None
                v = None if text == "max" else _int(text, f, key)
                if v is not None and v < UNLIMITED_SENTINEL:
                    out.append(MemoryLimit(kind, str(f), v / GIB))
        return out

    def cgroup_memory(self, path: str | Path) -> CgroupMemory:
        """:class:`CgroupMemory` of the cgroup v2 directory ``path``. Raises MemoryReadError."""
        d = Path(path)

        def mib(key: str) -> float:
            return _int(_read(d / key, key).strip(), d / key, key) / MIB

        cur = mib("memory.current")
        return CgroupMemory(str(d), cur, mib("memory.peak") if (d / "memory.peak").exists() else None)

    def cgroup_events(self, path: str | Path) -> dict[str, int]:
        """``memory.events`` of the cgroup v2 directory ``path``. Raises MemoryReadError."""
        f = Path(path) / "memory.events"
        lines = (line.partition(" ") for line in _read(f, "memory.events").splitlines())
        return {k: _int(v, f, k) for k, _, v in lines}

    def host_budget(self, asked_gib: float | None) -> HostBudget:
        """min(``asked_gib``, :meth:`cgroup_limits`, MemTotal), GiB. Raises MemoryReadError."""
        if asked_gib is None:
            return HostBudget(None, None, None)
        lims = [
            *self.cgroup_limits(),
            MemoryLimit("meminfo", str(self.proc_root / "meminfo"), self.mem_total_mib() / 1024),
        ]
        low = min(lims, key=lambda m: m.gib)
        if not low.gib < asked_gib:
            return HostBudget(float(asked_gib), float(asked_gib), None)
        name = "MemTotal" if low.source == "meminfo" else low.source
        why = f"{name} {low.path} = {low.gib:.4g} GiB < asked {asked_gib:g} GiB"
        return HostBudget(float(asked_gib), low.gib, why)


DEFAULT = HostMemoryReader()


KMSG = "/dev/kmsg"
_KILLED = re.compile(r"Killed process (\d+)")
#: a /dev/kmsg record: "priority,sequence,microseconds,flags;message"
_RECORD = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")
_OOMKILL = re.compile(r"oom-kill:.*?[,:]pid=(\d+)")


def kernel_log_lines(path: str = KMSG, max_records: int = 100_000, since: float | None = None) -> list[str]:
    """Every kernel log message (written from ``since``, epoch s). Raises OSError when the log
    cannot be opened (``kernel.dmesg_restrict``)."""
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
    """The OOM-kill record of any of ``pids`` (from ``since``, epoch s) as one line, or ``"no record
    found (<what was read>)"``. Never raises: an unreadable source is named."""
    read: list[str] = []
    if cgroup_path is not None:
        try:
            n = DEFAULT.cgroup_events(cgroup_path).get("oom_kill", 0)
            if n > 0:
                return f"cgroup {cgroup_path}: memory.events oom_kill {n}"
            read.append(f"{Path(cgroup_path) / 'memory.events'}: oom_kill 0")
        except MemoryReadError as exc:
            read.append(str(exc))
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

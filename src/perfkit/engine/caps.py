"""MemoryCaps: device and host memory budgets -> environment + enforcement.

Device budget: passed to the engine through the environment (``PERFKIT_CAP_DEVICE_MEMORY_GIB``
for the reference engine, ``SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB`` for sglang, whose worker
turns it into ``torch.cuda.set_per_process_memory_fraction``). The engine enforces it.

Host budget: told to the engine (``SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB``,
``PERFKIT_CAP_HOST_MEMORY_GIB``) and enforced from outside:

- ``cgroup``: where ``/sys/fs/cgroup`` is cgroup v2 and perfkit may create a child cgroup with the
  memory controller, the engine is moved into one with ``memory.max`` (and ``memory.swap.max=0``);
  the kernel OOM-kills it when over.
- ``watchdog``: otherwise a thread sums RSS over the engine's process tree every
  ``interval_s`` and kills the process group when the sum exceeds the cap.

Going over the cap is a result, not a hang: the engine is killed, its sockets close, later
requests fail fast, and :class:`CapOutcome` says ``exceeded`` with a message like
``host memory cap exceeded: 0.31 GiB > 0.25 GiB``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

log = logging.getLogger(__name__)

GIB = 2**30
CGROUP_ROOT = Path("/sys/fs/cgroup")
ENFORCEMENTS = ("auto", "cgroup", "watchdog", "none")


def _fmt_gib(x: float) -> str:
    return f"{x:g}GiB"


class MemoryCaps:
    """Device and host memory budgets for one engine launch.

    Args:
        device_gib: device (GPU) budget in GiB, or None for no cap.
        host_gib: host budget in GiB, or None for no cap.
        label: display label (default: derived, e.g. ``"12GiB dev + 32GiB host"``).
        host_enforcement: ``auto`` (cgroup where possible, else watchdog), ``cgroup``
            (fail when not possible), ``watchdog`` or ``none`` (environment only).
        interval_s: watchdog sampling interval.
    """

    def __init__(
        self,
        device_gib: float | None = None,
        host_gib: float | None = None,
        label: str | None = None,
        host_enforcement: str = "auto",
        interval_s: float = 0.1,
    ) -> None:
        for name, v in (("device_gib", device_gib), ("host_gib", host_gib)):
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ValueError(f"MemoryCaps.{name} must be a positive number or None, got {v!r}")
        if host_enforcement not in ENFORCEMENTS:
            raise ValueError(
                f"MemoryCaps.host_enforcement must be one of {ENFORCEMENTS}, got {host_enforcement!r}"
            )
        if not 0.01 <= interval_s <= 5:
            raise ValueError(f"MemoryCaps.interval_s must be in [0.01, 5], got {interval_s!r}")
        self.device_gib = float(device_gib) if device_gib is not None else None
        self.host_gib = float(host_gib) if host_gib is not None else None
        self._label = label
        self.host_enforcement = host_enforcement
        self.interval_s = float(interval_s)

    @property
    def label(self) -> str:
        """``unlimited``, ``12GiB dev``, ``32GiB host`` or ``12GiB dev + 32GiB host``."""
        if self._label:
            return self._label
        parts = []
        if self.device_gib is not None:
            parts.append(f"{_fmt_gib(self.device_gib)} dev")
        if self.host_gib is not None:
            parts.append(f"{_fmt_gib(self.host_gib)} host")
        return " + ".join(parts) if parts else "unlimited"

    @property
    def unlimited(self) -> bool:
        return self.device_gib is None and self.host_gib is None

    def env(self) -> dict[str, str]:
        """Environment variables telling the engine its budgets."""
        out: dict[str, str] = {}
        if self.device_gib is not None:
            v = f"{self.device_gib:g}"
            out["PERFKIT_CAP_DEVICE_MEMORY_GIB"] = v
            out["SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB"] = v
        if self.host_gib is not None:
            v = f"{self.host_gib:g}"
            out["SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB"] = v
            out["PERFKIT_CAP_HOST_MEMORY_GIB"] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_gib": self.device_gib,
            "host_gib": self.host_gib,
            "label": self.label,
            "host_enforcement": self.host_enforcement,
            "interval_s": self.interval_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "MemoryCaps":
        d = dict(d or {})
        unknown = set(d) - {"device_gib", "host_gib", "label", "host_enforcement", "interval_s"}
        if unknown:
            raise ValueError(f"MemoryCaps: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemoryCaps) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.device_gib, self.host_gib, self.label))

    def __repr__(self) -> str:
        return f"MemoryCaps(device_gib={self.device_gib!r}, host_gib={self.host_gib!r}, label={self.label!r})"

    def start(
        self, pid: int, name: str = "engine", on_exceeded: Callable[["CapOutcome"], None] | None = None
    ) -> "HostCapEnforcer":
        """Start enforcing the host budget on the process tree rooted at ``pid``."""
        enf = HostCapEnforcer(
            pid,
            self.host_gib,
            mode=self.host_enforcement,
            interval_s=self.interval_s,
            name=name,
            on_exceeded=on_exceeded,
        )
        enf.start()
        return enf


@dataclass
class CapOutcome:
    """What happened with the host budget during one launch.

    Attributes:
        enforcement: ``cgroup``, ``watchdog`` or ``none``.
        exceeded: the engine went over the host cap (and was killed).
        message: ``host memory cap exceeded: X GiB > Y GiB`` when exceeded, else a short note.
        peak_rss_gib: highest RSS summed over the process tree that was seen.
        host_cap_gib: the cap (None: no host cap).
        t_exceeded: epoch seconds when the cap was found exceeded.
    """

    enforcement: str = "none"
    exceeded: bool = False
    message: str = ""
    peak_rss_gib: float = 0.0
    host_cap_gib: float | None = None
    t_exceeded: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------- process tree helpers
def tree_processes(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its live descendants (empty when root is gone)."""
    try:
        return [root] + root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    except psutil.AccessDenied:
        return [root]


def tree_rss_bytes(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total


def kill_tree(pgid: int | None, procs: list[psutil.Process], sig: int = signal.SIGKILL) -> None:
    """Signal a process group and any listed processes (which may have left the group)."""
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass


# ---------------------------------------------------------------------------- cgroup v2
def cgroup2_available() -> bool:
    """True when /sys/fs/cgroup is a cgroup v2 mount."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == str(CGROUP_ROOT) and parts[2] == "cgroup2":
                return True
    except OSError:
        pass
    return False


def _own_cgroup() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_ROOT / line[3:].lstrip("/")
    except OSError:
        pass
    return None


class _Cgroup:
    """A child cgroup v2 with memory.max; raises OSError when that is not possible."""

    def __init__(self, cap_bytes: int, name: str) -> None:
        if not cgroup2_available():
            raise OSError("/sys/fs/cgroup is not cgroup v2")
        own = _own_cgroup()
        if own is None or not own.is_dir():
            raise OSError("own cgroup not found")
        candidates = [own, own.parent] if own != CGROUP_ROOT else [own]
        last: Exception | None = None
        for parent in candidates:
            path = parent / f"perfkit-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                try:
                    (parent / "cgroup.subtree_control").write_text("+memory")
                except OSError:
                    pass  # may already be on, or not allowed; the child's controllers tell
                path.mkdir()
                try:
                    if "memory" not in (path / "cgroup.controllers").read_text().split():
                        raise OSError(f"memory controller not delegated to {parent}")
                    (path / "memory.max").write_text(str(cap_bytes))
                    try:
                        (path / "memory.swap.max").write_text("0")
                    except OSError:
                        pass
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

    def oom_kills(self) -> int:
        try:
            for line in (self.path / "memory.events").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> int | None:
        try:
            return int((self.path / "memory.peak").read_text())
        except (OSError, ValueError):
            return None

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


# ---------------------------------------------------------------------------- enforcer
class HostCapEnforcer:
    """Enforces a host budget on a process tree; always tracks the peak tree RSS.

    Use :meth:`MemoryCaps.start`. ``outcome`` is live; :meth:`stop` ends the thread (call it
    before terminating the engine on purpose so that the teardown is not taken for a cap event).
    """

    def __init__(
        self,
        pid: int,
        host_gib: float | None,
        mode: str = "auto",
        interval_s: float = 0.1,
        name: str = "engine",
        on_exceeded: Callable[[CapOutcome], None] | None = None,
    ) -> None:
        self.pid = pid
        self.host_gib = host_gib
        self.interval_s = interval_s
        self.on_exceeded = on_exceeded
        self.outcome = CapOutcome(host_cap_gib=host_gib)
        self.known: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cgroup: _Cgroup | None = None
        try:
            self._root: psutil.Process | None = psutil.Process(pid)
            self._pgid: int | None = os.getpgid(pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            self._root, self._pgid = None, None
        if host_gib is None or mode == "none":
            self.outcome.enforcement = "none"
            self.outcome.message = "no host cap" if host_gib is None else "host cap not enforced"
            return
        if mode in ("auto", "cgroup"):
            try:
                cg = _Cgroup(int(host_gib * GIB), name)
                try:
                    cg.add(pid)
                except OSError:
                    cg.remove()
                    raise
                self._cgroup = cg
                self.outcome.enforcement = "cgroup"
                self.outcome.message = f"within host cap {host_gib:g} GiB (cgroup)"
                log.info("host cap %.3g GiB enforced by cgroup %s", host_gib, cg.path)
            except OSError as exc:
                if mode == "cgroup":
                    raise
                log.info("host cap %.3g GiB enforced by watchdog (cgroup v2 not usable: %s)", host_gib, exc)
                self.outcome.enforcement = "watchdog"
        else:
            self.outcome.enforcement = "watchdog"
        if self.outcome.enforcement == "watchdog":
            self.outcome.message = f"within host cap {host_gib:g} GiB (watchdog)"

    def start(self) -> None:
        if self._root is None:
            return
        self._thread = threading.Thread(target=self._run, name=f"perfkit-capwatch-{self.pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        root = self._root
        assert root is not None
        cap = self.host_gib * GIB if self.host_gib is not None else None
        refresh = 0.0
        procs: list[psutil.Process] = [root]
        while not self._stop.is_set():
            now = time.monotonic()
            # the tree scan walks all of /proc: rescan every 0.5 s (1 s when only tracking the
            # peak) and read the RSS of the known processes in between
            if now >= refresh:
                procs = tree_processes(root)
                refresh = now + (0.5 if cap is not None else 1.0)
                for p in procs:
                    self.known.setdefault(p.pid, p)
            if not procs or not root.is_running():
                break
            rss = tree_rss_bytes(procs)
            gib = rss / GIB
            if gib > self.outcome.peak_rss_gib:
                self.outcome.peak_rss_gib = gib
            if self._cgroup is not None:
                if self._cgroup.oom_kills() > 0:
                    self._exceeded(
                        max(gib, (self._cgroup.peak_bytes() or 0) / GIB), kill=False, how="cgroup OOM kill"
                    )
                    break
            elif cap is not None and rss > cap:
                self._exceeded(gib, kill=True, how="watchdog")
                break
            self._stop.wait(self.interval_s if cap is not None else max(self.interval_s, 0.5))

    def _exceeded(self, gib: float, kill: bool, how: str) -> None:
        o = self.outcome
        o.exceeded = True
        o.t_exceeded = time.time()
        o.peak_rss_gib = max(o.peak_rss_gib, gib)
        o.message = f"host memory cap exceeded: {gib:.2f} GiB > {self.host_gib:g} GiB ({how}; engine killed)"
        log.warning("%s (pid %d)", o.message, self.pid)
        if kill:
            kill_tree(self._pgid, list(self.known.values()))
        if self.on_exceeded is not None:
            try:
                self.on_exceeded(o)
            except Exception:  # noqa: BLE001
                log.exception("on_exceeded callback failed")

    def stop(self, timeout: float = 2.0) -> CapOutcome:
        """Stop watching (the cap is no longer enforced by the watchdog). Returns the outcome."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return self.outcome

    def finish(self) -> CapOutcome:
        """After the engine is gone: read cgroup OOM events, remove the cgroup."""
        self.stop()
        if self._cgroup is not None:
            if not self.outcome.exceeded and self._cgroup.oom_kills() > 0:
                peak = (self._cgroup.peak_bytes() or 0) / GIB
                self._exceeded(max(peak, self.outcome.peak_rss_gib), kill=False, how="cgroup OOM kill")
            peak = self._cgroup.peak_bytes()
            if peak is not None:
                self.outcome.peak_rss_gib = max(self.outcome.peak_rss_gib, peak / GIB)
            self._cgroup.remove()
            self._cgroup = None
        return self.outcome

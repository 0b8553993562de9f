"""MemoryCaps: device and host memory budgets -> the engine's environment, and the host budget
enforced from outside (a cgroup v2 child with ``memory.max``, else a PSS watchdog); going over is
:class:`CapOutcome` ``exceeded``. See docs/suite.md ("Measurement rules") and docs/robustness.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from perfkit.engine.owner import kill_tree
from perfkit.readings.memory import DEFAULT as _DEFAULT_READER
from perfkit.readings.memory import PSS_DUTY, HostMemoryReader, MemoryReadError, ReadBudget

log = logging.getLogger(__name__)

GIB = 2**30
#: the largest fraction of time the watchdog reads PSS for its check while RSS > cap >= PSS
CHECK_PSS_DUTY = 0.05
ENFORCEMENTS = ("auto", "cgroup", "watchdog", "none")
_CAPS_FIELDS = ("device_gib", "host_gib", "label", "host_enforcement", "interval_s")


def cgroup2_available() -> bool:
    """True when this process has a cgroup v2 directory."""
    return _own_v2() is not None


def _own_v2() -> tuple[Path, Path] | None:
    return next(((top, d) for kind, top, d in _DEFAULT_READER.own_cgroups() if kind == "cgroup-v2"), None)


class _Cgroup:
    """A child cgroup v2 with memory.max, under this process's cgroup or its parent (else OSError)."""

    def __init__(self, cap_bytes: int, name: str) -> None:
        top, own = _own_v2() or (None, None)
        if own is None or not own.is_dir():
            raise OSError("own cgroup v2 not found")
        candidates = [own, own.parent] if own != top else [own]
        last: Exception | None = None
        for parent in candidates:
            path = parent / f"perfkit-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
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


@dataclass(unsafe_hash=True)
class MemoryCaps:
    """Device and host memory budgets for one launch (GiB, None: no cap). host_enforcement:
    ``auto`` (cgroup, else watchdog), ``cgroup``, ``watchdog`` or ``none`` (environment only);
    host_effective_gib, host_clamp: the budget in force after :meth:`resolve` and why it is lower.
    ValueError: a budget not positive, an unknown enforcement, ``interval_s`` outside [0.01, 5].
    """

    device_gib: float | None = None
    host_gib: float | None = None
    label: str | None = None
    host_enforcement: str = "auto"
    interval_s: float = 0.1
    host_effective_gib: float | None = field(default=None, init=False)
    host_clamp: str | None = field(default=None, init=False)
    resolved: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        for name in ("device_gib", "host_gib"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"MemoryCaps.{name} must be a positive number or None, got {v!r}")
            setattr(self, name, float(v) if v is not None else None)
        if self.host_enforcement not in ENFORCEMENTS:
            raise ValueError(
                f"MemoryCaps.host_enforcement must be one of {ENFORCEMENTS}, got {self.host_enforcement!r}"
            )
        if not 0.01 <= self.interval_s <= 5:
            raise ValueError(f"MemoryCaps.interval_s must be in [0.01, 5], got {self.interval_s!r}")
        self.interval_s = float(self.interval_s)
        self.host_effective_gib = self.host_gib
        parts = [
            f"{v:g}GiB {w}" for v, w in ((self.device_gib, "dev"), (self.host_gib, "host")) if v is not None
        ]
        self.label = self.label or " + ".join(parts) or "unlimited"

    def resolve(self, reader: HostMemoryReader | None = None) -> "MemoryCaps":
        """A copy with the host budget clamped to min(``host_gib``, every cgroup limit above this
        process, MemTotal); MemoryReadError when one could not be read as a number."""
        out = replace(self)
        out.resolved = True
        if self.host_gib is None:
            return out
        b = (reader or _DEFAULT_READER).host_budget(self.host_gib)
        out.host_effective_gib = b.effective_gib
        out.host_clamp = b.clamp
        if b.clamp:
            log.warning(
                "host memory cap %g GiB asked, %.4g GiB in force: %s", self.host_gib, b.effective_gib, b.clamp
            )
        return out

    @property
    def unlimited(self) -> bool:
        """True when neither a device nor a host cap is set."""
        return self.device_gib is None and self.host_gib is None

    def env(self) -> dict[str, str]:
        """Environment variables telling the engine its budgets (GiB; the host one in force)."""
        gib = {
            "PERFKIT_CAP_DEVICE_MEMORY_GIB": self.device_gib,
            "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB": self.device_gib,
            "SGLANG_DIFFUSION_TEST_FORCE_HOST_AVAILABLE_GIB": self.host_effective_gib,
            "PERFKIT_CAP_HOST_MEMORY_GIB": self.host_effective_gib,
        }
        return {k: f"{v:g}" for k, v in gib.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """The caps as asked; a resolved one adds ``host_effective_gib`` and ``host_clamp``."""
        keys = _CAPS_FIELDS + (("host_effective_gib", "host_clamp") if self.resolved else ())
        return {k: getattr(self, k) for k in keys}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "MemoryCaps":
        """Inverse of :meth:`to_dict`; ValueError for unknown fields or bad values."""
        d = dict(d or {})
        resolved = "host_effective_gib" in d or "host_clamp" in d
        eff = d.pop("host_effective_gib", None)
        clamp = d.pop("host_clamp", None)
        unknown = set(d) - set(_CAPS_FIELDS)
        if unknown:
            raise ValueError(f"MemoryCaps: unknown field(s) {', '.join(sorted(unknown))}")
        out = cls(**d)
        if resolved:
            out.resolved = True
            out.host_effective_gib = float(eff) if eff is not None else None
            out.host_clamp = clamp
        return out

    def start(self, pid: int, name: str = "engine") -> "HostCapEnforcer":
        """Start enforcing the host budget in force on ``pid``'s tree; MemoryReadError (see
        :meth:`resolve`), OSError (``host_enforcement="cgroup"`` and no cgroup could be made)."""
        caps = self if self.resolved else self.resolve()
        enf = HostCapEnforcer(
            pid,
            caps.host_effective_gib,
            mode=self.host_enforcement,
            interval_s=self.interval_s,
            name=name,
            asked_gib=caps.host_gib,
            clamp=caps.host_clamp,
        )
        enf.start()
        return enf


@dataclass
class CapOutcome:
    """What happened with the host budget during one launch (GiB; None: not read or no cap).
    peak_rss_gib sums the tree's RSS (over-counts shared pages); mechanism: ``cgroup``,
    ``watchdog-pss``, ``watchdog-rss`` or ``none``; host_source: ``cgroup``, ``pss``, ``rss``, ``none``."""

    enforcement: str = "none"
    exceeded: bool = False
    message: str = ""
    peak_rss_gib: float = 0.0
    peak_pss_gib: float | None = None
    peak_cgroup_gib: float | None = None
    host_cap_gib: float | None = None
    host_cap_asked_gib: float | None = None
    host_cap_clamp: str | None = None
    mechanism: str = "none"
    host_source: str = "none"


class HostCapEnforcer:
    """Enforces a host budget (GiB; None: only track the peak) on a process tree (its cgroup, else
    its PSS); made by :meth:`MemoryCaps.start`. ``outcome`` is live; call :meth:`stop` before
    ending the engine on purpose. OSError: ``mode="cgroup"`` and no cgroup could be made."""

    def __init__(
        self,
        pid: int,
        host_gib: float | None,
        mode: str = "auto",
        interval_s: float = 0.1,
        name: str = "engine",
        reader: HostMemoryReader | None = None,
        asked_gib: float | None = None,
        clamp: str | None = None,
    ) -> None:
        self.pid = pid
        self.host_gib = host_gib
        self.interval_s = interval_s
        self.reader = reader or _DEFAULT_READER
        self.outcome = CapOutcome(
            host_cap_gib=host_gib,
            host_cap_asked_gib=asked_gib if asked_gib is not None else host_gib,
            host_cap_clamp=clamp,
        )
        self.known: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cgroup: _Cgroup | None = None
        self._errors: set[str] = set()
        try:
            self._root: psutil.Process | None = psutil.Process(pid)
            self._pgid: int | None = os.getpgid(pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            self._root, self._pgid = None, None
        self.outcome.host_source = "pss" if self.reader.has_smaps_rollup() else "rss"
        if host_gib is None or mode == "none":  # enforcement and mechanism stay "none"
            self.outcome.message = "no host cap" if host_gib is None else "host cap not enforced"
            return
        if mode in ("auto", "cgroup"):
            try:
                cg = _Cgroup(int(host_gib * GIB), name)
                try:
                    (cg.path / "cgroup.procs").write_text(str(pid))
                except OSError:
                    cg.remove()
                    raise
                self._cgroup = cg
                self.outcome.enforcement = self.outcome.mechanism = self.outcome.host_source = "cgroup"
                self.outcome.message = f"within host cap {host_gib:g} GiB (cgroup)"
                log.info("host cap %.3g GiB enforced by cgroup %s", host_gib, cg.path)
            except OSError as exc:
                if mode == "cgroup":
                    raise
                log.info("host cap %.3g GiB enforced by watchdog (cgroup v2 not usable: %s)", host_gib, exc)
        if self._cgroup is None:
            self.outcome.enforcement = "watchdog"
            self.outcome.mechanism = "watchdog-" + self.outcome.host_source
            self.outcome.message = f"within host cap {host_gib:g} GiB ({self.outcome.mechanism})"
            if self.outcome.host_source != "pss":
                log.warning(
                    "host cap watchdog reads summed RSS: %s/self/smaps_rollup is not there, so pages "
                    "shared between forked processes count once per process",
                    self.reader.proc_root,
                )

    @property
    def cgroup_path(self) -> Path | None:
        """The engine's own cgroup directory (None: it has none)."""
        return self._cgroup.path if self._cgroup is not None else None

    def start(self) -> None:
        """Start the watching thread (no-op when the process was already gone)."""
        if self._root is None:
            return
        self._thread = threading.Thread(target=self._run, name=f"perfkit-capwatch-{self.pid}", daemon=True)
        self._thread.start()

    def _error_once(self, exc: Exception) -> None:
        msg = str(exc)
        if msg not in self._errors:
            self._errors.add(msg)
            log.error("host cap watchdog of pid %d: %s", self.pid, msg)

    def _run(self) -> None:
        root = self._root
        assert root is not None
        o = self.outcome
        cap = self.host_gib
        pss = o.host_source != "rss"
        watch = self._cgroup is None and cap is not None
        refresh = 0.0
        peak_budget = ReadBudget(PSS_DUTY)  # PSS reads for the peak
        check_budget = ReadBudget(CHECK_PSS_DUTY)  # for the cap check while RSS > cap >= PSS
        last_rss = last_pss = 0.0  # MiB at the last PSS read
        between = False  # summed RSS over the cap, PSS under it (said once)
        pids: list[int] = [self.pid]
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= refresh:  # rescan the tree
                pids = self.reader.tree_pids(self.pid)
                refresh = now + (0.5 if watch else 1.0)
                for pid in pids:
                    if pid not in self.known:
                        try:
                            self.known[pid] = psutil.Process(pid)
                        except psutil.Error:
                            log.debug("pid %d vanished before it was recorded", pid)
            if not pids or not root.is_running():
                self._cgroup_oom()
                break
            t0 = time.monotonic()
            try:
                tm = self.reader.tree(self.pid, pids, pss=False)
            except MemoryReadError as exc:
                self._error_once(exc)
                tm = None
            if tm is not None and tm.root_alive:  # kept even when the root exits before the PSS read
                o.peak_rss_gib = max(o.peak_rss_gib, tm.rss_mib / 1024)
            # PSS reads stall the engine (docs/suite.md): only near the cap or within the peak's budget
            over = watch and tm is not None and tm.rss_mib / 1024 > cap
            check = over and (check_budget.due(now) or tm.rss_mib - last_rss > cap * 1024 - last_pss)
            if pss and tm is not None and tm.root_alive and (check or peak_budget.due(now)):
                t1 = time.monotonic()
                try:
                    tp = self.reader.tree(self.pid, pids, pss=True)
                except MemoryReadError as exc:  # PSS not readable (permissions): RSS, said once
                    log.warning("host cap watchdog: %s; falling back to summed RSS (statm)", exc)
                    pss = False
                    o.host_source = "rss" if self._cgroup is None else o.host_source
                    if o.mechanism == "watchdog-pss":
                        o.mechanism = "watchdog-rss"
                else:
                    took = time.monotonic() - t1
                    peak_budget.spent(t1, took)
                    check_budget.spent(t1, took)
                    if tp.source == "pss":
                        last_rss, last_pss = tm.rss_mib, tp.pss_mib
                        tm = tp
            cost = time.monotonic() - t0
            if tm is not None and not tm.root_alive:  # the root exited (or is a zombie)
                self._cgroup_oom()
                break
            if tm is not None:
                o.peak_rss_gib = max(o.peak_rss_gib, tm.rss_mib / 1024)
                if tm.source == "pss":
                    o.peak_pss_gib = max(o.peak_pss_gib or 0.0, tm.pss_mib / 1024)
            if self._cgroup is not None:
                if self._cgroup_oom():
                    break
            elif cap is not None and tm is not None and (tm.source == "pss" or (over and not pss)):
                # every PSS read is checked, a peak read too (statm's RSS may lag the page tables)
                gib = (tm.pss_mib if tm.source == "pss" else tm.rss_mib) / 1024
                if over and gib <= cap and not between:
                    between = True
                    log.warning(
                        "host cap watchdog of pid %d: the tree's summed RSS %.2f GiB is over the cap "
                        "%g GiB and its PSS %.2f GiB is not, so PSS is read for the check up to "
                        "%g %% of the time while this lasts (and whenever the RSS grows past the "
                        "PSS's margin); smaps_rollup reads stall the engine's mmap/munmap (issue "
                        "42): its timings may be slowed; a cgroup cap avoids it",
                        self.pid,
                        tm.rss_mib / 1024,
                        cap,
                        gib,
                        100 * CHECK_PSS_DUTY,
                    )
                if gib > cap:
                    self._exceeded(
                        gib, kill=True, how=f"{o.mechanism}, {'PSS' if tm.source == 'pss' else 'RSS'}"
                    )
                    break
            # smaps_rollup walks page tables: never spend more than ~20% of a core on it
            wait = self.interval_s if watch else max(self.interval_s, 0.5)
            self._stop.wait(max(wait, 4 * cost))

    def _cgroup_oom(self) -> bool:
        """Its cgroup's peak into the outcome; True (exceeded) on an ``oom_kill`` in memory.events."""
        if self._cgroup is None:
            return False
        o = self.outcome
        try:
            m = self.reader.cgroup_memory(self._cgroup.path)
            o.peak_cgroup_gib = max(
                o.peak_cgroup_gib or 0.0, m.current_mib / 1024, (m.peak_mib or 0.0) / 1024
            )
        except MemoryReadError as exc:
            self._error_once(exc)
        try:
            kills = self.reader.cgroup_events(self._cgroup.path).get("oom_kill", 0)
        except MemoryReadError as exc:
            self._error_once(exc)
            return False
        if kills > 0 and not o.exceeded:
            self._exceeded(o.peak_cgroup_gib or 0.0, kill=False, how="cgroup OOM kill")
        return kills > 0

    def _exceeded(self, gib: float, kill: bool, how: str) -> None:
        o = self.outcome
        o.exceeded = True
        if self._cgroup is None and o.host_source == "rss":
            o.peak_rss_gib = max(o.peak_rss_gib, gib)
        o.message = f"host memory cap exceeded: {gib:.2f} GiB > {self.host_gib:g} GiB ({how}; engine killed)"
        log.warning("%s (pid %d)", o.message, self.pid)
        if kill:
            kill_tree(
                [self._pgid] if self._pgid is not None else [], list(self.known.values()), signal.SIGKILL
            )

    def stop(self, timeout: float = 2.0) -> CapOutcome:
        """Stop watching (the cap is no longer enforced by the watchdog). Returns the outcome."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return self.outcome

    def finish(self) -> CapOutcome:
        """After the engine is gone: read the cgroup's OOM events and peak, remove the cgroup."""
        self.stop()
        if self._cgroup is not None:
            self._cgroup_oom()
            self._cgroup.remove()
            self._cgroup = None
        return self.outcome

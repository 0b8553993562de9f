"""Memory timeline sampler (:class:`MemorySampler`, columns :data:`COLUMNS`) of an engine's device
(NVML, :mod:`~perfkit.readings.sampler.nvml`) and host memory. Columns: docs/sglang.md, "Readers"."""

from __future__ import annotations

import functools
import logging
import math
import operator
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from perfkit.readings.memory import DEFAULT as _DEFAULT_READER
from perfkit.readings.memory import PSS_DUTY, HostMemoryReader, MemoryReadError, ReadBudget
from perfkit.readings.sampler.nvml import MIB, NAN, NVML_NOT_AVAILABLE, NvmlSource, PynvmlSource, _indices

log = logging.getLogger(__name__)


COLUMNS = tuple(
    (
        "t device_used_mib host_rss_mib host_anon_mib host_pss_mib host_uss_mib cgroup_current_mib "
        "gpu_util_pct sm_clock_mhz power_w clock_event_reasons device_source"
    ).split()
)
NUMERIC = tuple(c for c in COLUMNS if c != "device_source")
#: how often the engine's process tree is re-scanned (s)
TREE_REFRESH_S = 1.0
#: a per-process NVML figure of 0 while the device grew by more than this (MiB) is not true
IMPLAUSIBLE_GROWTH_MIB = 256.0


#: turns the sampler's PSS reads off (unset or empty: on)
PSS_ENV = "PERFKIT_SAMPLER_PSS"
_PSS_ON = ("1", "true", "yes", "on")
_PSS_OFF = ("0", "false", "no", "off")


def pss_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the sampler reads host PSS (:data:`PSS_ENV` in ``environ``, default ``os.environ``).
    Raises ValueError naming the variable for a value it does not take."""
    raw = (os.environ if environ is None else environ).get(PSS_ENV)
    v = (raw or "").strip().lower()
    if v in ("", *_PSS_ON):
        return True
    if v in _PSS_OFF:
        return False
    raise ValueError(
        f"environment variable {PSS_ENV}={raw!r}: expected one of {', '.join(_PSS_ON + _PSS_OFF)} "
        "(or unset/empty: PSS on)"
    )


class MemorySampler:
    """Background memory sampler of the engine tree rooted at ``pid`` (a context manager).
    ``gpu_index``: one or several (summed); ``baseline_device_mib``: the device's used MiB before
    launch (the ``nvml-device-delta`` fallback); ``pss_duty``: see ``ReadBudget``. Raises
    ValueError: ``interval_s`` <= 0, ``pss_duty`` not in (0, 1], or a bad :data:`PSS_ENV`."""

    def __init__(
        self,
        pid: int,
        interval_s: float = 0.1,
        gpu_index: int | Sequence[int] = 0,
        baseline_device_mib: float | None = None,
        cgroup_path: str | Path | None = None,
        nvml: NvmlSource | None = None,
        reader: HostMemoryReader | None = None,
        pss_duty: float = PSS_DUTY,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"MemorySampler.interval_s must be > 0, got {interval_s!r}")
        if isinstance(pss_duty, bool) or not isinstance(pss_duty, (int, float)) or not 0 < pss_duty <= 1:
            raise ValueError(f"MemorySampler.pss_duty must be a number in (0, 1], got {pss_duty!r}")
        self.pss_duty = float(pss_duty)
        self.pss_reads = 0
        self.pss_read_s = 0.0
        self._pss_budget = ReadBudget(self.pss_duty)
        self.pid = pid
        self.interval_s = float(interval_s)
        self.gpu_indices = _indices(gpu_index)
        self.baseline_device_mib = baseline_device_mib
        self.cgroup_path = Path(cgroup_path) if cgroup_path is not None else None
        self.nvml: NvmlSource = nvml if nvml is not None else PynvmlSource()
        self.reader = reader or _DEFAULT_READER
        self.device_source = "none"
        self.cpu_seconds = 0.0
        self.t_started: float | None = None
        self.t_stopped: float | None = None
        self._samples: list[tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first = threading.Event()  # the first sample was taken (or tried)
        self._nvml_ok = False
        self._warned_implausible = False
        self._pss = pss_enabled()
        self._errors: set[str] = set()
        self._tree: list[int] = [pid]
        self._tree_t = 0.0
        self._clocks: tuple[float, float, int | None] = (NAN, NAN, None)

    @property
    def device_mode(self) -> str:
        """The last sample's source: ``process``, ``device`` or ``none``."""
        return {"nvml-process": "process", "nvml-device-delta": "device"}.get(self.device_source, "none")

    def start(self) -> "MemorySampler":
        """Start sampling; returns after the first sample. RuntimeError when already started."""
        if self._thread is not None:
            raise RuntimeError("MemorySampler already started")
        self._nvml_ok = bool(self.nvml.open(self.gpu_indices))
        if not self._nvml_ok:
            log.debug("sampler for pid %d: no NVML, host memory only", self.pid)
        self.t_started = time.time()
        self._thread = threading.Thread(target=self._run, name=f"perfkit-sampler-{self.pid}", daemon=True)
        self._thread.start()
        self._first.wait(timeout=max(2.0, 5 * self.interval_s))
        return self

    def stop(self) -> "MemorySampler":
        """Stop the thread and release NVML; returns the sampler."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(2.0, 5 * self.interval_s))
        if self._nvml_ok:
            self.nvml.close()
            self._nvml_ok = False
        if self.t_stopped is None:
            self.t_stopped = time.time()
        if self.pss_reads:
            log.info(
                "sampler of pid %d: host PSS read %d times (%.1f ms each on average, at most %g %% of the time)",
                self.pid,
                self.pss_reads,
                1000 * self.pss_read_s / self.pss_reads,
                100 * self.pss_duty,
            )
        return self

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        c0 = time.thread_time()
        try:
            next_t = time.monotonic()
            while not self._stop.is_set():
                try:
                    alive = self.sample_once()
                except Exception:  # noqa: BLE001 - a sampler must never take the run down
                    log.exception("memory sample failed")
                    alive = True
                finally:
                    self._first.set()
                if not alive:
                    log.debug("sampler: pid %d is gone, stopping", self.pid)
                    break
                self.cpu_seconds = time.thread_time() - c0
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind: no burst
                    next_t = time.monotonic()
                    delay = 0
                self._stop.wait(delay)
        finally:
            self._first.set()
            self.cpu_seconds = time.thread_time() - c0
            self.t_stopped = time.time()

    def _error_once(self, exc: Exception) -> None:
        if str(exc) not in self._errors:
            self._errors.add(str(exc))
            log.warning("sampler of pid %d: %s", self.pid, exc)

    def _host(self) -> tuple[float, float, float, float, bool]:
        """(rss, anon, pss, uss) MiB of the tree and whether the root is alive."""
        now = time.monotonic()
        if now - self._tree_t >= TREE_REFRESH_S:
            self._tree = self.reader.tree_pids(self.pid)
            self._tree_t = now
        if self._pss and self._pss_budget.due(now):
            t0 = time.monotonic()
            try:
                tm = self.reader.tree(self.pid, self._tree, pss=True)
            except MemoryReadError as exc:
                self._error_once(f"{exc}; host PSS/USS not read from now on (NaN), RSS from statm")
                self._pss = False
                tm = self.reader.tree(self.pid, self._tree, pss=False)
            else:
                cost = time.monotonic() - t0
                self.pss_reads += 1
                self.pss_read_s += cost
                self._pss_budget.spent(t0, cost)
        else:
            tm = self.reader.tree(self.pid, self._tree, pss=False)
        if not tm.root_alive:  # the root is gone (or a zombie)
            return NAN, NAN, NAN, NAN, False
        return tm.rss_mib, tm.anon_mib, tm.pss_mib, tm.uss_mib, True

    def _cgroup(self) -> float:
        if self.cgroup_path is None:
            return NAN
        try:
            return self.reader.cgroup_memory(self.cgroup_path).current_mib
        except MemoryReadError as exc:
            if self.cgroup_path.exists():
                self._error_once(exc)
            return NAN  # the cgroup is removed at teardown

    def _device(self) -> tuple[float, float, str]:
        """(device MiB, utilisation %, source); sets ``self._clocks`` (slowest, summed W, OR)."""
        self._clocks = (NAN, NAN, None)
        if not self._nvml_ok:
            return NAN, NAN, "none"
        devs = []
        for i in self.gpu_indices:
            try:
                devs.append(self.nvml.device(i))
            except Exception as exc:  # noqa: BLE001
                self._error_once(f"NVML device {i} not read: {exc}")
                return NAN, NAN, "none"
        used = sum(d.used_bytes for d in devs) / MIB
        total = sum(d.total_bytes for d in devs) / MIB
        utils = [d.util_pct for d in devs if not math.isnan(d.util_pct)]
        util = sum(utils) / len(utils) if utils else NAN
        clocks = [d.sm_clock_mhz for d in devs]
        reasons = [d.clock_event_reasons for d in devs]
        self._clocks = (  # a NaN part makes the figure NaN
            min(clocks) if devs and not any(map(math.isnan, clocks)) else NAN,
            sum(d.power_w for d in devs) if devs else NAN,
            functools.reduce(operator.or_, map(int, reasons)) if devs and None not in reasons else None,
        )
        tree = set(self._tree)
        per_proc, matched, bad = 0.0, False, []
        for i in self.gpu_indices:
            try:
                procs = self.nvml.processes(i)
            except Exception as exc:  # noqa: BLE001
                log.debug("NVML processes of device %d not read: %s", i, exc)
                procs = []
            for pid, mem in procs:
                if pid not in tree:
                    continue
                matched = True
                if mem is None or mem >= NVML_NOT_AVAILABLE:
                    bad.append(f"pid {pid} on device {i}: usedGpuMemory not available")
                else:
                    per_proc += mem / MIB
        base = self.baseline_device_mib
        has_base = base is not None and not math.isnan(base)
        delta = max(0.0, used - base) if has_base else used
        if matched and not bad:
            if per_proc == 0 and has_base and used - base > IMPLAUSIBLE_GROWTH_MIB:
                bad.append(
                    f"usedGpuMemory is 0 while the device grew by {used - base:.0f} MiB since before launch"
                )
            elif per_proc > total:
                bad.append(f"usedGpuMemory {per_proc:.0f} MiB is more than the device has ({total:.0f} MiB)")
        if matched and not bad:
            return per_proc, util, "nvml-process"
        if bad and not self._warned_implausible:
            self._warned_implausible = True
            log.warning(
                "NVML per-process memory of pid %d's tree is not usable (%s): using the device's used "
                "memory minus the pre-launch reading (device_source nvml-device-delta)",
                self.pid,
                "; ".join(bad),
            )
        return delta, util, "nvml-device-delta"

    def sample_once(self) -> bool:
        """Take one sample; False when the process is gone. Raises MemoryReadError."""
        rss, anon, pss, uss, alive = self._host()
        if not alive:
            return False
        cg = self._cgroup()
        dev, util, src = self._device()
        clock, watts, reasons = self._clocks
        self.device_source = src
        with self._lock:
            self._samples.append(
                (time.time(), dev, rss, anon, pss, uss, cg, util, clock, watts, reasons, src)
            )
        return True

    @property
    def samples(self) -> list[tuple]:
        """A copy of the samples (tuples in :data:`COLUMNS` order)."""
        with self._lock:
            return list(self._samples)

    def to_frame(self):  # -> pandas.DataFrame
        """The samples as a DataFrame with :data:`COLUMNS`."""
        import pandas as pd

        df = pd.DataFrame(self.samples, columns=list(COLUMNS))
        for c in NUMERIC:
            df[c] = df[c].astype("Int64" if c == "clock_event_reasons" else "float64")
        df["device_source"] = df["device_source"].astype("string")
        return df

    def peak(self) -> dict[str, float]:
        """Numeric column -> max over the samples (NaN when none)."""
        rows = self.samples
        cols = [
            (i, c) for i, c in enumerate(COLUMNS) if c in NUMERIC and c not in ("t", "clock_event_reasons")
        ]
        return {c: max((r[i] for r in rows if not math.isnan(r[i])), default=NAN) for i, c in cols}

    def overhead_pct(self) -> float:
        """The sampler thread's CPU time as a % of one core over its running time."""
        t0 = self.t_started
        if t0 is None:
            return 0.0
        t1 = self.t_stopped if self.t_stopped is not None else time.time()
        return 100.0 * self.cpu_seconds / max(t1 - t0, 1e-9)

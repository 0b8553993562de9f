"""Memory timeline sampler: device memory (NVML) and host memory (/proc, psutil) of an engine.

:class:`MemorySampler` runs a background thread that every ``interval_s`` records one sample:

- ``t``: epoch seconds (``time.time()``, the clock of request spans and records).
- ``device_used_mib``: the engine's GPU memory. When NVML lists the engine (or one of its
  descendants) among the device's compute processes with a usable per-process figure, the sum of
  those; otherwise the device's used memory minus ``baseline_device_mib`` (the reading taken
  before launch, see :func:`device_used_mib`) — inside containers NVML reports host pids, so
  the per-process figure is often not usable. NaN without NVML.
- ``host_rss_mib`` / ``host_anon_mib``: RSS and anonymous RSS (the kernel's ``RssAnon``, read as
  resident − shared from ``/proc/<pid>/statm``) summed over the process tree.
- ``gpu_util_pct``: NVML utilisation (NaN without NVML).

Without a GPU or NVML it samples the host only, with NaN device columns, and no error. Its own
CPU cost is measured (:attr:`MemorySampler.cpu_seconds`, :meth:`MemorySampler.overhead_pct`).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any, Sequence

import psutil

log = logging.getLogger(__name__)

MIB = 2**20
NAN = float("nan")
COLUMNS = ("t", "device_used_mib", "host_rss_mib", "host_anon_mib", "gpu_util_pct")

_nvml_lock = threading.Lock()
_nvml_refs = 0


def _nvml_init() -> Any | None:
    """pynvml module when NVML works here, else None (reference counted; pair with _nvml_shutdown)."""
    global _nvml_refs
    try:
        import pynvml
    except ImportError:
        return None
    with _nvml_lock:
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no driver / no GPU is normal
            log.debug("NVML not available: %s", exc)
            return None
        _nvml_refs += 1
        return pynvml


def _nvml_shutdown(nv: Any) -> None:
    global _nvml_refs
    with _nvml_lock:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        _nvml_refs = max(0, _nvml_refs - 1)


def _indices(gpu_index: int | Sequence[int]) -> list[int]:
    return [int(gpu_index)] if isinstance(gpu_index, int) else [int(i) for i in gpu_index]


def device_used_mib(gpu_index: int | Sequence[int] = 0) -> float:
    """Used memory of the device(s) in MiB (summed), or NaN without NVML. Take it before a launch
    and pass it as ``MemorySampler(baseline_device_mib=...)``."""
    nv = _nvml_init()
    if nv is None:
        return NAN
    try:
        total = 0.0
        for i in _indices(gpu_index):
            total += nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used / MIB
        return total
    except Exception as exc:  # noqa: BLE001
        log.debug("NVML read failed: %s", exc)
        return NAN
    finally:
        _nvml_shutdown(nv)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _read_statm(pid: int) -> tuple[float, float] | None:
    """(RSS, anonymous RSS) in bytes from /proc/<pid>/statm; None when gone or a zombie.

    statm's ``resident - shared`` is the kernel's RssAnon (shared = RssFile + RssShmem), and
    statm is several times cheaper to read than /proc/<pid>/status.
    """
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            fields = fh.read().split()
    except OSError:
        return None
    try:
        resident, shared = int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None
    if resident == 0:
        return None
    return resident * _PAGE, max(0, resident - shared) * _PAGE


def _children_file_ok(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants. Reads /proc/<pid>/task/<tid>/children (cost grows with the
    tree, not with the host's process count); falls back to a psutil scan."""
    if not _children_file_ok(root):
        try:
            return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []
        except psutil.AccessDenied:
            return [root]
    out: list[int] = []
    todo = [root]
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            if pid == root:
                return []
            continue
        out.append(pid)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return out


class MemorySampler:
    """Background memory sampler of an engine process tree.

    Args:
        pid: root process of the engine.
        interval_s: sampling interval.
        gpu_index: NVML device index, or several (summed; utilisation is their mean).
        baseline_device_mib: device used memory read before the launch; subtracted in the
            device-total fallback (None: not subtracted).
        tree_refresh_s: how often the process tree is re-scanned (reading RSS of known processes
            is cheap; scanning /proc for descendants is not).

    Use as a context manager or call :meth:`start`/:meth:`stop`. :meth:`to_frame` gives the
    samples as a DataFrame with columns :data:`COLUMNS`.
    """

    def __init__(
        self,
        pid: int,
        interval_s: float = 0.1,
        gpu_index: int | Sequence[int] = 0,
        baseline_device_mib: float | None = None,
        tree_refresh_s: float = 1.0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"MemorySampler.interval_s must be > 0, got {interval_s!r}")
        self.pid = pid
        self.interval_s = float(interval_s)
        self.gpu_indices = _indices(gpu_index)
        self.baseline_device_mib = baseline_device_mib
        self.tree_refresh_s = tree_refresh_s
        self.device_mode = "none"  # "process" | "device" | "none"
        self.cpu_seconds = 0.0
        self.t_started: float | None = None
        self.t_stopped: float | None = None
        self._samples: list[tuple[float, float, float, float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: Any | None = None
        self._handles: list[Any] = []
        self._tree: list[int] = [pid]
        self._tree_t = 0.0
        self._use_proc = os.path.exists(f"/proc/{os.getpid()}/statm")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "MemorySampler":
        if self._thread is not None:
            raise RuntimeError("MemorySampler already started")
        self._nv = _nvml_init()
        if self._nv is not None:
            try:
                self._handles = [self._nv.nvmlDeviceGetHandleByIndex(i) for i in self.gpu_indices]
            except Exception as exc:  # noqa: BLE001
                log.info("NVML device %s not available (%s); sampling host only", self.gpu_indices, exc)
                _nvml_shutdown(self._nv)
                self._nv, self._handles = None, []
        if self._nv is None:
            log.debug("sampler for pid %d: no NVML, host memory only", self.pid)
        self.t_started = time.time()
        self._thread = threading.Thread(target=self._run, name=f"perfkit-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "MemorySampler":
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(2.0, 5 * self.interval_s))
        if self._nv is not None:
            _nvml_shutdown(self._nv)
            self._nv, self._handles = None, []
        if self.t_stopped is None:
            self.t_stopped = time.time()
        return self

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ sampling
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
                if not alive:
                    log.debug("sampler: pid %d is gone, stopping", self.pid)
                    break
                self.cpu_seconds = time.thread_time() - c0
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay < 0:  # fell behind: do not burst
                    next_t = time.monotonic()
                    delay = 0
                self._stop.wait(delay)
        finally:
            self.cpu_seconds = time.thread_time() - c0
            self.t_stopped = time.time()

    def _refresh_tree(self) -> None:
        self._tree = tree_pids(self.pid)

    def _host(self) -> tuple[float, float, bool]:
        now = time.monotonic()
        if now - self._tree_t >= self.tree_refresh_s:
            self._refresh_tree()
            self._tree_t = now
        rss = anon = 0.0
        seen = False
        for pid in self._tree:
            if self._use_proc:
                r = _read_statm(pid)
                if r is None:
                    continue
                rss += r[0]
                anon += r[1]
            else:
                try:
                    rss += psutil.Process(pid).memory_info().rss
                    anon = NAN
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
            seen = seen or pid == self.pid
        if not seen:  # the root is gone (or a zombie)
            return NAN, NAN, False
        return rss / MIB, anon / MIB, True

    def _device(self) -> tuple[float, float]:
        nv = self._nv
        if nv is None:
            return NAN, NAN
        tree = set(self._tree)
        per_proc = 0.0
        matched = False
        used = 0.0
        utils = []
        for h in self._handles:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # noqa: BLE001
                procs = []
            for p in procs:
                mem = getattr(p, "usedGpuMemory", None)
                if p.pid in tree and mem is not None:
                    matched = True
                    per_proc += mem / MIB
            try:
                used += nv.nvmlDeviceGetMemoryInfo(h).used / MIB
            except Exception:  # noqa: BLE001
                used = NAN
            try:
                utils.append(float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            except Exception:  # noqa: BLE001
                pass
        util = sum(utils) / len(utils) if utils else NAN
        if matched:
            self.device_mode = "process"
            return per_proc, util
        self.device_mode = "device"
        base = self.baseline_device_mib
        if base is not None and not math.isnan(base):
            used = max(0.0, used - base)
        return used, util

    def sample_once(self) -> bool:
        """Take one sample now. Returns False when the process is gone (no sample recorded)."""
        rss, anon, alive = self._host()
        if not alive:
            return False
        dev, util = self._device()
        with self._lock:
            self._samples.append((time.time(), dev, rss, anon, util))
        return True

    # ------------------------------------------------------------------ results
    @property
    def samples(self) -> list[tuple[float, float, float, float, float]]:
        """A copy of the samples as (t, device_used_mib, host_rss_mib, host_anon_mib, gpu_util_pct)."""
        with self._lock:
            return list(self._samples)

    def to_frame(self):  # -> pandas.DataFrame
        """Samples as a DataFrame with columns :data:`COLUMNS` (float64)."""
        import pandas as pd

        return pd.DataFrame(self.samples, columns=list(COLUMNS), dtype="float64")

    def peak(self) -> dict[str, float]:
        """Column -> max over the samples (NaN when none)."""
        rows = self.samples
        out = {}
        for i, c in enumerate(COLUMNS[1:], start=1):
            vals = [r[i] for r in rows if not math.isnan(r[i])]
            out[c] = max(vals) if vals else NAN
        return out

    def overhead_pct(self) -> float:
        """CPU time used by the sampler thread as a % of one core over its running time."""
        t0 = self.t_started
        if t0 is None:
            return 0.0
        t1 = self.t_stopped if self.t_stopped is not None else time.time()
        return 100.0 * self.cpu_seconds / max(t1 - t0, 1e-9)

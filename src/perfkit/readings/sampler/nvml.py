"""NVML for the sampler and the launcher: the source protocol (:class:`NvmlSource`, read by
:class:`PynvmlSource`), the devices (:func:`nvml_inventory`), ``CUDA_VISIBLE_DEVICES`` resolved
by UUID (:func:`resolve_visible_gpus`) and used memory (:func:`device_used_mib`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol, Sequence

log = logging.getLogger(__name__)


MIB = 2**20
NAN = float("nan")
#: NVML_VALUE_NOT_AVAILABLE (unsigned long long -1), as some pynvml versions pass it through
NVML_NOT_AVAILABLE = 2**64 - 1

_nvml_lock = threading.Lock()


def _nvml_init() -> Any | None:
    """pynvml when NVML works here, else None (NVML counts inits: pair with _nvml_shutdown)."""
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
        return pynvml


def _nvml_shutdown(nv: Any) -> None:
    with _nvml_lock, contextlib.suppress(Exception):
        nv.nvmlShutdown()


def _indices(gpu_index: int | Sequence[int]) -> list[int]:
    return [int(gpu_index)] if isinstance(gpu_index, int) else [int(i) for i in gpu_index]


#: NVML's clock-event reason bits (nvml.h) for power (SwPowerCap, HwPowerBrakeSlowdown)
POWER_REASONS = 0x04 | 0x80


@dataclass(frozen=True)
class DeviceReading:
    """One device's memory (bytes), utilisation (%), SM clock (MHz), power (W) and clock-event
    reasons (NVML's bitmask); NaN / None: not reported."""

    used_bytes: int
    total_bytes: int
    util_pct: float = NAN
    sm_clock_mhz: float = NAN
    power_w: float = NAN
    clock_event_reasons: int | None = None


class NvmlSource(Protocol):
    """What the sampler needs from NVML (a fake in tests, :class:`PynvmlSource` otherwise)."""

    def open(self, indices: Sequence[int]) -> bool:
        """Prepare the devices; False when NVML or a device is not available."""

    def close(self) -> None:
        """Release what :meth:`open` took."""

    def device(self, index: int) -> DeviceReading:
        """Used/total memory (bytes) and utilisation of device ``index``. May raise."""

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, usedGpuMemory bytes or None) of the compute processes on ``index``. May raise."""


@dataclass(frozen=True)
class GpuRef:
    """One GPU as NVML knows it (``index`` in PCI bus order)."""

    index: int
    uuid: str
    name: str


class GpuResolveError(ValueError):
    """CUDA_VISIBLE_DEVICES names a device NVML does not have (or a MIG instance)."""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _with_nvml(read: Callable[[Any], Any], default: Any) -> Any:
    """``read(pynvml)`` in an NVML session; ``default`` without NVML or when it raises."""
    nv = _nvml_init()
    if nv is None:
        return default
    try:
        return read(nv)
    except Exception as exc:  # noqa: BLE001 - no GPU (or a failing driver) is a normal case
        log.debug("NVML read failed: %s", exc)
        return default
    finally:
        _nvml_shutdown(nv)


def _gpus(nv: Any) -> list[tuple[GpuRef, Any]]:
    """(GpuRef, NVML handle) of every device, by NVML index."""
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    return [
        (GpuRef(i, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))), h)
        for i, h in enumerate(handles)
    ]


def nvml_inventory(nvml: Any = None) -> list[GpuRef] | None:
    """Every GPU NVML sees, by index, or None without NVML (``nvml``: a fake with ``inventory()``)."""
    if nvml is not None:
        inv = getattr(nvml, "inventory", None)
        return list(inv()) if inv is not None else None
    return _with_nvml(lambda nv: [g for g, _ in _gpus(nv)], None)


def _facts(nv: Any) -> dict[str, Any]:
    gpus = [
        {**asdict(g), "total_mib": round(nv.nvmlDeviceGetMemoryInfo(h).total / MIB)} for g, h in _gpus(nv)
    ]
    return {
        "gpu_name": gpus[0]["name"],
        "gpu_driver": _text(nv.nvmlSystemGetDriverVersion()),
        "gpu_count": len(gpus),
        "gpu_total_mib": gpus[0]["total_mib"],
        "gpus": gpus,
    }


def gpu_facts() -> dict[str, Any]:
    """This host's GPUs for meta.json (the first's name and MiB, every GPU); None, 0 without NVML."""
    return _with_nvml(_facts, {"gpu_name": None, "gpu_driver": None, "gpu_count": 0, "gpu_total_mib": None})


def resolve_visible_gpus(visible: str | None, nvml: Any = None) -> list[GpuRef]:
    """The NVML devices a CUDA process with ``CUDA_VISIBLE_DEVICES`` = ``visible`` sees, in CUDA
    order (parsed as CUDA does; docs/scale-out.md); [] without NVML. Raises GpuResolveError: an
    entry names no device, an ambiguous UUID prefix, or a MIG instance."""
    inv = nvml_inventory(nvml)
    if inv is None:
        return []
    if visible is None:
        return list(inv)
    out: list[GpuRef] = []
    for raw in visible.split(","):
        e = raw.strip()
        if not e:
            break
        if e.startswith("MIG-"):
            raise GpuResolveError(f"CUDA_VISIBLE_DEVICES entry {e!r} is a MIG instance: not sampled by UUID")
        if e.startswith("GPU-"):
            hits = [g for g in inv if g.uuid.startswith(e)]
            if len(hits) != 1:
                what = "no NVML device has" if not hits else "several NVML devices have"
                raise GpuResolveError(f"CUDA_VISIBLE_DEVICES entry {e!r}: {what} that UUID")
            out.append(hits[0])
            continue
        try:
            i = int(e)
        except ValueError:
            break
        if i < 0:
            break
        if i >= len(inv):
            raise GpuResolveError(
                f"CUDA_VISIBLE_DEVICES entry {e!r}: NVML sees {len(inv)} GPU(s) (indices 0-{len(inv) - 1})"
            )
        out.append(inv[i])
    return out


class PynvmlSource:
    """:class:`NvmlSource` over pynvml (reference-counted nvmlInit/nvmlShutdown)."""

    def __init__(self) -> None:
        self._nv: Any | None = None
        self._handles: dict[int, Any] = {}
        self._unsupported: set[str] = set()

    def open(self, indices: Sequence[int]) -> bool:
        """Start NVML for devices ``indices``; False (logged) when NVML or a device is not there."""
        self._nv = _nvml_init()
        if self._nv is None:
            return False
        try:
            self._handles = {i: self._nv.nvmlDeviceGetHandleByIndex(i) for i in indices}
        except Exception as exc:  # noqa: BLE001
            log.info("NVML device %s not available (%s); sampling host only", list(indices), exc)
            self.close()
            return False
        return True

    def close(self) -> None:
        """Shut NVML down (safe to call twice)."""
        if self._nv is not None:
            _nvml_shutdown(self._nv)
        self._nv, self._handles = None, {}

    def _optional(self, what: str, read: Callable[[], Any], default: Any = NAN) -> Any:
        """``read()``, or ``default`` when NVML cannot give it (logged once per reading)."""
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - not supported on some devices (MIG, old drivers)
            if what not in self._unsupported:
                self._unsupported.add(what)
                log.info("NVML %s not read (%s): its column is NaN", what, exc)
            return default

    def device(self, index: int) -> DeviceReading:
        """One reading of device ``index`` (KeyError: not opened)."""
        nv, h = self._nv, self._handles[index]
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        util = self._optional(
            "nvmlDeviceGetUtilizationRates", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        )
        clock = self._optional(
            "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
            lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        )
        power = self._optional("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        reasons = self._optional("nvmlDeviceGetCurrentClocksEventReasons", lambda: int(reasons_fn(h)), None)
        return DeviceReading(int(mem.used), int(mem.total), util, clock, float(power), reasons)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None) of each compute process on device ``index``."""
        procs = self._nv.nvmlDeviceGetComputeRunningProcesses(self._handles[index])
        return [(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in procs]


def device_used_mib(gpu_index: int | Sequence[int] = 0, nvml: NvmlSource | None = None) -> float:
    """Used memory of the device(s) in MiB (summed), or NaN without NVML."""
    src = nvml or PynvmlSource()
    idx = _indices(gpu_index)
    if not src.open(idx):
        return NAN
    try:
        return sum(src.device(i).used_bytes for i in idx) / MIB
    except Exception as exc:  # noqa: BLE001
        log.debug("NVML read failed: %s", exc)
        return NAN
    finally:
        src.close()

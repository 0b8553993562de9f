"""Memory timeline sampler: device memory (NVML) and host memory (/proc, cgroup) of an engine.

:class:`MemorySampler` runs a background thread that every ``interval_s`` records one sample:

- ``t``: epoch seconds (``time.time()``, the clock of request spans and records).
- ``device_used_mib``: the engine's GPU memory, from the source named in ``device_source``:

  - ``nvml-process``: the sum of NVML's per-process ``usedGpuMemory`` over the engine's process
    tree, when NVML lists them with a plausible figure;
  - ``nvml-device-delta``: the device's used memory minus ``baseline_device_mib`` (read before
    the launch, see :func:`device_used_mib`), when NVML does not list the engine (inside
    containers NVML reports host pids) or its per-process figure cannot be true: NVML's "not
    available" value, 0 while the device's used memory grew by more than
    :data:`~perfkit.readings.sampler.timeline.IMPLAUSIBLE_GROWTH_MIB` since before the launch, or more than the device has (a
    warning is logged once per sampler);
  - ``none``: no NVML (NaN).
- ``host_pss_mib`` / ``host_uss_mib``: PSS (the tree's memory, shared pages once) and USS
  summed over the process tree (:mod:`perfkit.readings.memory`); NaN on the samples between
  reads (within :data:`~perfkit.readings.memory.PSS_DUTY` of the wall time; never a carried
  value) and where PSS is not readable or turned off (:func:`pss_enabled`).
- ``host_rss_mib`` / ``host_anon_mib``: RSS and anonymous RSS summed per process (a page shared
  copy-on-write counts once per process), at every sample.
- ``cgroup_current_mib``: ``memory.current`` of the engine's own cgroup (NaN without one).
- ``gpu_util_pct``, ``sm_clock_mhz``, ``power_w``, ``clock_event_reasons``: NVML's (NaN/NA
  without it).

Without NVML it samples the host only, with NaN device columns, and no error; its own CPU cost
is measured (:attr:`MemorySampler.cpu_seconds`). :mod:`~perfkit.readings.sampler.timeline`: the
sampler; :mod:`~perfkit.readings.sampler.nvml`: NVML sources (tests pass a fake), devices,
``CUDA_VISIBLE_DEVICES`` resolved by UUID; the names other modules use are re-exported here.
"""

from __future__ import annotations

from perfkit.readings.sampler.nvml import (  # noqa: F401 (the names other modules use, re-exported)
    NAN,
    NVML_NOT_AVAILABLE,
    POWER_REASONS,
    DeviceReading,
    GpuRef,
    GpuResolveError,
    PynvmlSource,
    device_used_mib,
    resolve_visible_gpus,
)
from perfkit.readings.sampler.timeline import COLUMNS, PSS_ENV, MemorySampler, pss_enabled  # noqa: F401

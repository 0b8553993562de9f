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
- ``host_pss_mib`` / ``host_uss_mib``: PSS and USS summed over the process tree (the one reader,
  :mod:`perfkit.readings.memory`; pages shared copy-on-write between forked processes count
  once in PSS). Read within :data:`perfkit.readings.memory.PSS_DUTY` of the wall time, so NaN on
  the samples between reads (never a carried value), and on every sample where ``smaps_rollup``
  is not readable or ``PERFKIT_SAMPLER_PSS`` turns it off (:func:`pss_enabled`).
- ``host_rss_mib`` / ``host_anon_mib``: RSS and anonymous RSS summed per process over the tree
  (a page shared copy-on-write counts once per process: a 400 MiB block in a parent and two
  forked children sums to 1,200 MiB), from ``statm`` or the PSS read, at every sample. USS
  (private pages) holds no shared block at all; PSS is the tree's memory counted once.
- ``cgroup_current_mib``: ``memory.current`` of the engine's own cgroup (NaN without one).
- ``gpu_util_pct``: NVML utilisation (NaN without NVML).

NVML is reached through an :class:`NvmlSource` (default :class:`PynvmlSource`); tests pass a fake.
Without a GPU or NVML it samples the host only, with NaN device columns, and no error. Its own
CPU cost is measured (:attr:`MemorySampler.cpu_seconds`, :meth:`MemorySampler.overhead_pct`).

The package: :mod:`perfkit.readings.sampler.timeline` (the sampler) and
:mod:`perfkit.readings.sampler.nvml` (NVML: sources, devices, ``CUDA_VISIBLE_DEVICES`` resolved
by UUID); the names other modules use are re-exported here.
"""

from __future__ import annotations

from perfkit.readings.sampler.nvml import (
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
from perfkit.readings.sampler.timeline import COLUMNS, PSS_ENV, MemorySampler, pss_enabled

__all__ = [
    "COLUMNS",
    "DeviceReading",
    "GpuRef",
    "GpuResolveError",
    "MemorySampler",
    "NAN",
    "NVML_NOT_AVAILABLE",
    "POWER_REASONS",
    "PSS_ENV",
    "PynvmlSource",
    "device_used_mib",
    "pss_enabled",
    "resolve_visible_gpus",
]

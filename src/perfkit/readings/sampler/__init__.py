"""Memory timeline sampler (:class:`MemorySampler`, :mod:`~perfkit.readings.sampler.timeline`)
of an engine's device memory (NVML, :mod:`~perfkit.readings.sampler.nvml`: tests pass a fake) and
host memory (/proc, cgroup); the names other modules use are re-exported here. The columns and
the device sources: docs/sglang.md, "Readers".
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

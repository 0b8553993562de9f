"""Readers of what engines write and of memory: sglang's per-request records
(:mod:`~perfkit.readings.records`), stage names (:mod:`~perfkit.readings.stages`) and the memory
sampler (:mod:`~perfkit.readings.sampler`). The lowest layer above :mod:`perfkit.common`."""

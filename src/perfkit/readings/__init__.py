"""Readers of what engines write (records, perf dumps, stages, traces, config, snapshots) and of
memory (:mod:`~perfkit.readings.sampler`); the lowest layer above :mod:`perfkit.common`."""

"""Baseline JSON in sglang's ``perf_baselines`` layout (docs/sglang.md "Interop facts"): files
(sglang's rules, load, save), derive (entries, update, compare); the public names re-exported."""

# ruff: noqa: F401 (the public API, re-exported)
from __future__ import annotations

from perfkit.gate.baseline.derive import (
    baseline_from_bundles,
    check_overlap,
    compare,
    entry_from_records,
    from_bundle,
    set_case,
    update_baseline,
)
from perfkit.gate.baseline.files import (
    DEFAULT_TOLERANCES,
    SCALAR_TIMING_METRICS,
    TOP_LEVEL_CASE_MAPS,
    BaselineError,
    classify_stage,
    dumps_baseline,
    is_flat,
    load_baseline,
    loads_baseline,
    new_baseline,
    save_baseline,
    tolerance_profile,
)

"""Baseline JSON in sglang's ``perf_baselines`` layout: load, derive, compare, update.

Layout (sglang diffusion CI, see docs/sglang.md "Interop facts"; ``tests/fixtures/perf_baselines_5090.json``
is a real file)::

    {"metadata": {"model", "hardware", "description", "last_updated": "YYYY-MM-DD", ...},
     "tolerances": {"pr_test": {"e2e", "denoise_stage", "non_denoise_stage", "denoise_step",
                                "denoise_agg", "load_peak_vram", "runtime_peak_vram", ["load"]},
                    "long_term": {...}, <any other profile>: {...}}
                   (older files: one flat set, {"e2e", "stage", "denoise_step", "denoise_agg"};
                   :func:`tolerance_profile` reads both as sglang does),
     "improvement_reporting": {"threshold": 0.2},
     "sampling": {"step_fractions": [0.0, 0.2, ...]},
     "scenarios": {case_id: {"stages_ms": {stage: ms}, "denoise_step_ms": {"<step index>": ms},
                             "expected_e2e_ms", "expected_avg_denoise_ms",
                             "expected_median_denoise_ms", ["expected_load_ms",
                             "load_peak_vram_mb", "runtime_peak_vram_mb", "warmup_peak_vram_mb",
                             "load_peak_allocated_mb", "runtime_peak_allocated_mb",
                             "estimated_full_test_time_s", "notes"]}},
     ["load_peak_vram_mb": {case_id: MiB}, "runtime_peak_vram_mb": {case_id: MiB}]}

Documents are plain ``dict`` objects in file order, so unknown keys survive a load/save round trip
(the 5090 fixture saves back byte for byte: 4-space indent, trailing newline).

Units: times in ms (``*_s`` in seconds), memory in MiB.

The package, one module per job: :mod:`perfkit.gate.baseline.rules` (sglang's tolerances, pads,
stage classes, the pass bound), :mod:`perfkit.gate.baseline.files` (new, load, save: atomic),
:mod:`perfkit.gate.baseline.derive` (entries from bundles or records),
:mod:`perfkit.gate.baseline.compare` (verdict rows), :mod:`perfkit.gate.baseline.update` (one
case's entry written into a file); what other modules use of them is re-exported here.

The verdict's table and words are elsewhere: :func:`perfkit.checks.overall_status`,
:func:`perfkit.report.notebook.verdict_markdown`.
"""

# ruff: noqa: F401 (the public API, re-exported)
from __future__ import annotations

from perfkit.gate.baseline.compare import check_overlap, compare, improvement_snippets
from perfkit.gate.baseline.derive import baseline_from_bundles, entry_from_records, from_bundle, set_scenario
from perfkit.gate.baseline.files import (
    BaselineError,
    dumps_baseline,
    load_baseline,
    loads_baseline,
    new_baseline,
    save_baseline,
)
from perfkit.gate.baseline.rules import (
    DEFAULT_TOLERANCES,
    SCALAR_TIMING_METRICS,
    TOP_LEVEL_CASE_MAPS,
    classify_stage,
    is_flat,
    tolerance_profile,
)
from perfkit.gate.baseline.update import update_baseline

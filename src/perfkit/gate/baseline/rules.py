"""The baseline gate's rules: sglang's tolerances, pads and stage classes, and the pass bound.

Source: sglang's diffusion perf CI check (multimodal_gen perf baselines validation), as
paraphrased in docs/sglang.md "Interop facts". Units: ms and MiB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from perfkit.readings.records import MAX_READING
from perfkit.readings.stages import baseline_class as classify_stage  # noqa: F401 (re-exported)

# ---------------------------------------------------------------------------------------------
# Constants: every number the check uses (source: the module doc). A metric passes when
#     actual <= max(expected * (1 + tol), expected + pad)
# with the pads and tolerance overrides below. The default tolerance profiles are the numbers in
# sglang's RTX 5090 baseline file (fixtures/sglang/perf_baselines_5090.json).
# ---------------------------------------------------------------------------------------------

#: sglang: default absolute pad (ms) for any timing without a more specific rule
#: (e2e, denoise stages, denoise aggregates, load time).
DEFAULT_PAD_MS = 20.0
#: sglang: pad (ms) for non-denoise stages (text encoding, latent preparation, ...).
NON_DENOISE_STAGE_PAD_MS = 120.0
#: sglang: decoding stages use max(tol, 0.9) ...
DECODING_STAGE_MIN_TOL = 0.9
#: ... and a 450 ms pad.
DECODING_STAGE_PAD_MS = 450.0
#: sglang: denoising step 0 (first step, pays setup) uses tolerance 4.0 ...
STEP0_TOL = 4.0
#: ... and an 80 ms pad.
STEP0_PAD_MS = 80.0
#: sglang: other denoising steps of video models use a 160 ms pad.
VIDEO_STEP_PAD_MS = 160.0
#: other denoising steps of image models: the default pad (``compare(..., video=False)``).
IMAGE_STEP_PAD_MS = DEFAULT_PAD_MS
#: perfkit choice (not from sglang): VRAM peaks get no absolute pad, so the relative tolerance
#: (1% load, 2% runtime in sglang's profiles) is the whole budget. Peaks come from torch's
#: max_memory_reserved and are reproducible to the MiB on the same hardware.
VRAM_PAD_MB = 0.0
#: sglang: ``improvement_reporting.threshold`` default; faster than expected * (1 - threshold)
#: prints an improvement hint.
DEFAULT_IMPROVEMENT_THRESHOLD = 0.2
#: sglang: ``sampling.step_fractions`` default; sampled step index = round(fraction * (n - 1)).
DEFAULT_STEP_FRACTIONS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
#: sglang's tolerance profiles, copied from its RTX 5090 baseline file.
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "long_term": {
        "e2e": 0.15,
        "denoise_stage": 0.1,
        "non_denoise_stage": 0.5,
        "denoise_step": 0.25,
        "denoise_agg": 0.15,
        "load_peak_vram": 0.01,
        "runtime_peak_vram": 0.02,
    },
    "pr_test": {
        "e2e": 0.25,
        "denoise_stage": 0.25,
        "non_denoise_stage": 0.8,
        "denoise_step": 0.3,
        "denoise_agg": 0.2,
        "load_peak_vram": 0.01,
        "runtime_peak_vram": 0.02,
    },
}
#: sglang's name for flat tolerances (one set, no profiles), which it reads for any profile asked.
FLAT_PROFILE = "legacy/flat"
#: The oldest flat files' single ``stage`` tolerance bounded every stage in the sglang of their
#: time, so it stands for both stage keys of later files (see :func:`tolerance_profile`).
LEGACY_STAGE_KEYS = ("denoise_stage", "non_denoise_stage")
#: sglang 0.5.23: VRAM tolerances a set may leave out, and the value it then uses.
VRAM_TOLERANCE_DEFAULTS = {"load_peak_vram": 0.01, "runtime_peak_vram": 0.02}
#: Rounding of values written by :func:`from_bundle` (sglang dumps ms with 2 decimals).
MS_DECIMALS = 2
MB_DECIMALS = 1
S_DECIMALS = 1

#: Scalar timing metrics of a case entry -> (tolerance key, pad ms).
SCALAR_TIMING_METRICS: dict[str, tuple[str, float]] = {
    "expected_e2e_ms": ("e2e", DEFAULT_PAD_MS),
    "expected_avg_denoise_ms": ("denoise_agg", DEFAULT_PAD_MS),
    "expected_median_denoise_ms": ("denoise_agg", DEFAULT_PAD_MS),
    # optional: only gated when the profile has a "load" tolerance
    "expected_load_ms": ("load", DEFAULT_PAD_MS),
    # perfkit extension (sglang has no such key): time to first result, launch until the first
    # successful request ended; optional, gated when the profile has a "first_result" tolerance
    "expected_first_result_ms": ("first_result", DEFAULT_PAD_MS),
}
#: Memory metrics (MiB) -> (tolerance key, pad MiB). Keys without a tolerance in the profile are
#: reported as skipped (informational): sglang only gates load/runtime peak VRAM.
MEMORY_METRICS: dict[str, tuple[str, float]] = {
    f"{key}_mb": (key, VRAM_PAD_MB)
    for key in (
        "load_peak_vram",
        "runtime_peak_vram",
        "warmup_peak_vram",
        "load_peak_allocated",
        "runtime_peak_allocated",
    )
}
#: Both tables: every scalar metric of a case entry -> (tolerance key, pad).
SCALAR_METRICS = {**SCALAR_TIMING_METRICS, **MEMORY_METRICS}
#: sglang's per-frame time stage key: null in its baselines when not measured; skipped for
#: video cases by its check (``_validate_stages``).
PER_FRAME_METRIC = "stages_ms.per_frame_generation"
#: Tolerance keys that may be absent from a profile without it being an error.
OPTIONAL_TOLERANCES = {
    "load",
    "first_result",
    "warmup_peak_vram",
    "load_peak_allocated",
    "runtime_peak_allocated",
}
#: Top-level per-case maps some sglang files carry (case id -> MiB).
TOP_LEVEL_CASE_MAPS = ("load_peak_vram_mb", "runtime_peak_vram_mb")
#: perfkit's key in a case entry (sglang's readers skip it): what the engine really ran, as it
#: reported (``compile_active``, ``compile_backend``, ``dtype``, ``device``); a case measured
#: otherwise than this run is not compared (:func:`perfkit.gate.baseline.compare.compare`)
ENGINE_KEY = "perfkit_engine"
#: Keys of a case entry that :func:`from_bundle` derives (replaced on update; others kept).
DERIVED_KEYS = (
    ENGINE_KEY,
    "stages_ms",
    "denoise_step_ms",
    *SCALAR_METRICS,
    "estimated_full_test_time_s",
)


def is_flat(tolerances: Mapping[str, Any]) -> bool:
    """Whether a ``tolerances`` map is one flat set (``e2e`` is a number, not a profile), as
    sglang 0.5.23 tells them apart (``ToleranceConfig.load_profile``)."""
    return "e2e" in tolerances and not isinstance(tolerances["e2e"], Mapping)


def tolerance_profile(
    tolerances: Mapping[str, Any] | None, profile: str = "pr_test"
) -> tuple[str, dict[str, float]]:
    """The tolerance set a check with ``profile`` uses, read as sglang reads a baseline file
    (rules and sources: docs/sglang.md "Interop facts"): ``(name, {key: fraction})``, ``name``
    :data:`FLAT_PROFILE` for a flat file (:func:`is_flat`: the one set whatever is asked; an old
    single ``stage`` key fills both :data:`LEGACY_STAGE_KEYS`), else ``tolerances[profile]``;
    absent VRAM keys take :data:`VRAM_TOLERANCE_DEFAULTS`, other absent keys stay absent.

    Raises:
        KeyError: a profiled map without ``profile`` (listing the ones it has): unlike sglang's
            fallback to ``pr_test``, a misspelt ``--profile`` never gates with another set.
    """
    tolerances = tolerances or {}
    if is_flat(tolerances):
        name, tols = FLAT_PROFILE, dict(tolerances)
        if "stage" in tols:
            for key in LEGACY_STAGE_KEYS:
                tols.setdefault(key, tols["stage"])
    elif profile in tolerances:
        name, tols = profile, dict(tolerances[profile])
    else:
        raise KeyError(f"tolerance profile {profile!r} not in baseline (has: {sorted(tolerances)})")
    for key, default in VRAM_TOLERANCE_DEFAULTS.items():
        tols.setdefault(key, default)
    return name, tols


#: a stage name -> its class by sglang's rules (``denoise``, ``decoding``, ``non_denoise``)
StageClassifier = Callable[[str], str]


def _number_problem(v: Any) -> str | None:
    """Why ``v`` is not a metric value (a finite JSON number in [0, :data:`~perfkit.readings.records.MAX_READING`]), or None."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return f"({type(v).__name__}) is not a number"
    if isinstance(v, float) and not math.isfinite(v):  # an int is finite (math.isnan(10**400) overflows)
        return "is not a finite number"
    if v < 0:
        return "is negative"
    if v > MAX_READING:
        return f"is above {MAX_READING:g} (no ms, MiB, s or tolerance is that large)"
    return None


def bound(expected: float, tol: float, pad: float) -> float:
    """sglang's pass bound: ``max(expected * (1 + tol), expected + pad)``."""
    return max(expected * (1.0 + tol), expected + pad)


def _metric_rule(
    metric: str, tols: Mapping[str, float], classify: StageClassifier, video: bool
) -> tuple[float | None, float, str]:
    """(tolerance or None if the profile lacks it, pad, rule description) for a metric path."""
    if metric.startswith("stages_ms."):
        cls = classify(metric.split(".", 1)[1])
        if cls == "denoise":
            return tols.get("denoise_stage"), DEFAULT_PAD_MS, "denoise_stage"
        if cls == "decoding":
            t = tols.get("non_denoise_stage")
            tol = None if t is None else max(t, DECODING_STAGE_MIN_TOL)
            return tol, DECODING_STAGE_PAD_MS, f"decoding: max(non_denoise_stage, {DECODING_STAGE_MIN_TOL})"
        return tols.get("non_denoise_stage"), NON_DENOISE_STAGE_PAD_MS, "non_denoise_stage"
    if metric.startswith("denoise_step_ms."):
        if metric.split(".", 1)[1] == "0":
            return STEP0_TOL, STEP0_PAD_MS, "step 0"
        pad = VIDEO_STEP_PAD_MS if video else IMAGE_STEP_PAD_MS
        return tols.get("denoise_step"), pad, "denoise_step"
    if metric in SCALAR_METRICS:
        key, pad = SCALAR_METRICS[metric]
        return tols.get(key), pad, key
    return None, DEFAULT_PAD_MS, "unknown"

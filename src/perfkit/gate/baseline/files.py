"""Baseline files: sglang's rules (tolerances, pads, stage classes, the pass bound), a new
document, load (checked), dump and save (atomic).

Source of the rules: sglang's diffusion perf CI check (multimodal_gen perf baselines
validation), as paraphrased in docs/sglang.md "Interop facts". Units: ms and MiB.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfkit.common import jsonsafe
from perfkit.common.slugs import did_you_mean
from perfkit.readings.records import MAX_READING, short_repr
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
#: otherwise than this run is not compared (:func:`perfkit.gate.baseline.compare`)
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


#: the largest baseline file read (bytes): sglang's perf_baselines files are about 100 KB
MAX_BASELINE_BYTES = 32 * 2**20


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file (and line/column)."""


def new_baseline(hardware: str | None = None, *, description: str = "") -> dict[str, Any]:
    """An empty baseline document with sglang's default tolerances (:data:`DEFAULT_TOLERANCES`),
    improvement threshold and step fractions."""
    return {
        "metadata": {
            "model": "Diffusion Server",
            "hardware": hardware or "unknown",
            "description": description,
            "last_updated": _dt.date.today().isoformat(),
        },
        "tolerances": copy.deepcopy(DEFAULT_TOLERANCES),
        "improvement_reporting": {"threshold": DEFAULT_IMPROVEMENT_THRESHOLD},
        "sampling": {"step_fractions": list(DEFAULT_STEP_FRACTIONS)},
        "scenarios": {},
    }


def metric_value(v: Any, where: str, nullable: bool = True) -> float | None:
    """A metric as written: None for JSON null ("not measured", sglang writes it), else a finite,
    non-negative number; anything else raises :class:`BaselineError` naming ``where`` (never 0)."""
    if v is None and nullable:
        return None
    problem = _number_problem(v)
    if problem:
        raise BaselineError(f"{where}: {short_repr(v)} {problem}")
    return float(v)


def _validate(doc: Any, source: str) -> None:
    def bad(where: str, what: str) -> BaselineError:
        return BaselineError(f"{source}: {where}: {what}")

    if not isinstance(doc, dict):
        raise bad("top level", f"is {type(doc).__name__}, expected a JSON object")
    sections = ("metadata", "tolerances", "improvement_reporting", "sampling", "scenarios")
    for key in (*sections, *TOP_LEVEL_CASE_MAPS):
        if key in doc and not isinstance(doc[key], dict):
            raise bad(key, f"is {type(doc[key]).__name__}, expected an object")

    def number(where: str, v: Any, nullable: bool = True) -> None:
        metric_value(v, f"{source}: {where}", nullable)

    imp = doc.get("improvement_reporting") or {}
    if "threshold" in imp:
        # sglang: faster than expected * (1 - threshold) is an improvement, so a threshold is a
        # fraction in [0, 1]; a string ("0.2"), NaN or -5 would turn every row into "improved"
        number("improvement_reporting.threshold", imp["threshold"], nullable=False)
        if imp["threshold"] > 1:
            raise bad("improvement_reporting.threshold", f"{imp['threshold']!r} is above 1 (a fraction)")
    all_tols = doc.get("tolerances") or {}
    flat = is_flat(all_tols)  # one set for every profile, as sglang reads it (tolerance_profile)
    for prof, tols in all_tols.items():
        if flat:
            if isinstance(tols, dict):
                raise bad(
                    f"tolerances.{prof}", "an object among flat tolerances (tolerances.e2e is a number)"
                )
            number(f"tolerances.{prof}", tols, nullable=False)
        elif not isinstance(tols, dict):
            raise bad(f"tolerances.{prof}", "expected an object")
        else:
            for k, v in tols.items():
                number(f"tolerances.{prof}.{k}", v, nullable=False)
    fr = (doc.get("sampling") or {}).get("step_fractions")
    if fr is not None:
        if not isinstance(fr, list):
            raise bad("sampling.step_fractions", "expected a list of numbers")
        for i, x in enumerate(fr):
            number(f"sampling.step_fractions[{i}]", x, nullable=False)
            if x > 1:
                raise bad(f"sampling.step_fractions[{i}]", f"{x!r} is above 1 (a fraction of the steps)")
    for case, entry in (doc.get("scenarios") or {}).items():
        if not isinstance(entry, dict):
            raise bad(f"scenarios.{case}", "expected an object")
        for k in entry:  # a renamed key would read as "nothing in the baseline": every stage new
            if k not in DERIVED_KEYS and (near := did_you_mean(k, DERIVED_KEYS, 0.8)):
                raise bad(f"scenarios.{case}.{k}", f"unknown key{near}")
        if all(entry.get(k, {}) == {} for k in DERIVED_KEYS if k != ENGINE_KEY):  # empty maps hold none
            raise bad(f"scenarios.{case}", f"no metric (keys: {', '.join(map(str, entry)) or 'none'})")
        for mkey in ("stages_ms", "denoise_step_ms"):
            if mkey not in entry:
                continue
            m = entry[mkey]
            if not isinstance(m, dict):
                raise bad(f"scenarios.{case}.{mkey}", f"{m!r} is not an object")
            for k, v in m.items():
                number(f"scenarios.{case}.{mkey}.{k}", v)
        for mkey in (*SCALAR_METRICS, "estimated_full_test_time_s"):
            if mkey in entry:
                number(f"scenarios.{case}.{mkey}", entry[mkey])
        ran = entry.get(ENGINE_KEY, {})
        if not isinstance(ran, dict) or any(
            not isinstance(v, bool if k == "compile_active" else str) for k, v in ran.items()
        ):
            raise bad(
                f"scenarios.{case}.{ENGINE_KEY}", f"{ran!r}: expected strings (compile_active: a boolean)"
            )
    for key in TOP_LEVEL_CASE_MAPS:
        for case, v in (doc.get(key) or {}).items():
            number(f"{key}.{case}", v)


def loads_baseline(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse baseline JSON text. Raises :class:`BaselineError` naming ``source`` and line/column."""
    try:
        doc = json.loads(text, object_pairs_hook=jsonsafe.unique_keys)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except ValueError as exc:  # a key twice
        raise BaselineError(f"{source}: {exc}") from None
    except RecursionError:
        raise BaselineError(f"{source}: nested too deeply to be a baseline file") from None
    _validate(doc, source)
    return doc


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Load a baseline file (sglang ``perf_baselines`` layout) as a plain dict, unknown keys kept.

    Raises:
        FileNotFoundError: when the file does not exist.
        BaselineError: when it is larger than :data:`MAX_BASELINE_BYTES`, not valid JSON (message: ``<file>: invalid JSON at line L column
            C: ...``) or has the wrong shape (message names the file and the key path).
    """
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_BASELINE_BYTES:
        raise BaselineError(f"{p}: {size:,} bytes, more than a baseline file holds ({MAX_BASELINE_BYTES:,})")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise BaselineError(f"{p}:{line}: invalid UTF-8 at byte {exc.start + 1}") from None
    return loads_baseline(text, source=str(p))


def dumps_baseline(doc: Mapping[str, Any]) -> str:
    """Serialise like sglang's files: 4-space indent, key order kept, trailing newline."""
    return jsonsafe.dumps(doc, indent=4, ensure_ascii=False) + "\n"


def save_baseline(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``doc`` to ``path`` atomically (see :func:`atomic_write_text`). Returns the path."""
    _validate(doc, "<document to save>")
    p = Path(path)
    atomic_write_text(p, dumps_baseline(doc))
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically.

    Writes a temp file in the same directory, flushes and fsyncs it, then ``os.replace``s it over
    the target (and fsyncs the directory, best effort). On any error the temp file is removed and
    the old file is left untouched. The new file keeps the old file's permission bits (or gets
    0o666 minus the umask when it is new).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        mode = p.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

"""Baseline files: sglang's rules (tolerances, pads, stage classes, the pass bound; source:
sglang's multimodal_gen perf baselines check, docs/sglang.md "Interop facts"), a new document,
load (checked), dump and save (atomic). Units: ms and MiB."""

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

# sglang's numbers (docs/sglang.md "Interop facts"); pass: actual <= max(expected * (1 + tol), expected + pad)
DEFAULT_PAD_MS = 20.0  # any timing without a more specific rule
NON_DENOISE_STAGE_PAD_MS = 120.0
DECODING_STAGE_MIN_TOL = 0.9  # decoding stages: max(tol, 0.9) and a 450 ms pad
DECODING_STAGE_PAD_MS = 450.0
STEP0_TOL = 4.0  # denoising step 0 pays setup
STEP0_PAD_MS = 80.0
VIDEO_STEP_PAD_MS = 160.0  # later denoising steps of video models
IMAGE_STEP_PAD_MS = DEFAULT_PAD_MS
#: perfkit's choice, not sglang's: VRAM peaks get no pad (reproducible to the MiB on one hardware)
VRAM_PAD_MB = 0.0
DEFAULT_IMPROVEMENT_THRESHOLD = 0.2
DEFAULT_STEP_FRACTIONS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
#: sglang's tolerance profiles, from its RTX 5090 baseline file (fixtures/sglang/perf_baselines_5090.json)
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
#: sglang's name for flat tolerances (one set for any profile asked)
FLAT_PROFILE = "legacy/flat"
#: what the oldest flat files' single ``stage`` tolerance stands for
LEGACY_STAGE_KEYS = ("denoise_stage", "non_denoise_stage")
#: sglang 0.5.23: VRAM tolerances a set may leave out, and the value it then uses
VRAM_TOLERANCE_DEFAULTS = {"load_peak_vram": 0.01, "runtime_peak_vram": 0.02}
MS_DECIMALS = 2  # as sglang dumps ms
MB_DECIMALS = 1
S_DECIMALS = 1

#: scalar timing metrics of a case entry -> (tolerance key, pad ms)
SCALAR_TIMING_METRICS: dict[str, tuple[str, float]] = {
    "expected_e2e_ms": ("e2e", DEFAULT_PAD_MS),
    "expected_avg_denoise_ms": ("denoise_agg", DEFAULT_PAD_MS),
    "expected_median_denoise_ms": ("denoise_agg", DEFAULT_PAD_MS),
    "expected_load_ms": ("load", DEFAULT_PAD_MS),
    # perfkit's (not sglang's): launch until the first successful request ended
    "expected_first_result_ms": ("first_result", DEFAULT_PAD_MS),
}
#: memory metrics (MiB) -> (tolerance key, pad MiB)
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
SCALAR_METRICS = {**SCALAR_TIMING_METRICS, **MEMORY_METRICS}
#: skipped for video cases by sglang's check (``_validate_stages``)
PER_FRAME_METRIC = "stages_ms.per_frame_generation"
#: tolerance keys a profile may lack (their metrics are skipped)
OPTIONAL_TOLERANCES = {
    "load",
    "first_result",
    "warmup_peak_vram",
    "load_peak_allocated",
    "runtime_peak_allocated",
}
#: top-level per-case maps some sglang files carry (case id -> MiB)
TOP_LEVEL_CASE_MAPS = ("load_peak_vram_mb", "runtime_peak_vram_mb")
#: perfkit's key in a case entry (sglang skips it): what the engine really ran
ENGINE_KEY = "perfkit_engine"
#: keys of a case entry that ``from_bundle`` derives (replaced on update; others kept)
DERIVED_KEYS = (ENGINE_KEY, "stages_ms", "denoise_step_ms", *SCALAR_METRICS, "estimated_full_test_time_s")


def is_flat(tolerances: Mapping[str, Any]) -> bool:
    """Whether a ``tolerances`` map is one flat set (sglang 0.5.23 ``ToleranceConfig.load_profile``)."""
    return "e2e" in tolerances and not isinstance(tolerances["e2e"], Mapping)


def tolerance_profile(
    tolerances: Mapping[str, Any] | None, profile: str = "pr_test"
) -> tuple[str, dict[str, float]]:
    """``(name, {key: fraction})``: the tolerance set ``profile`` uses, read as sglang reads it
    (docs/sglang.md "Interop facts"); a flat file's one set is :data:`FLAT_PROFILE`. Raises
    KeyError for a profile the file lacks (unlike sglang, no fallback to ``pr_test``)."""
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
    """Why ``v`` is not a finite number in [0, MAX_READING], or None."""
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
    """(tolerance or None, pad, rule description) for a metric path."""
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


#: the largest baseline file read (bytes; sglang's are about 100 KB)
MAX_BASELINE_BYTES = 32 * 2**20


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file (and line/column)."""


def new_baseline(hardware: str | None = None, *, description: str = "") -> dict[str, Any]:
    """An empty baseline document with sglang's default tolerances, threshold and step fractions."""
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
    """None for JSON null ("not measured"), else a finite non-negative number; anything else
    raises :class:`BaselineError` naming ``where``."""
    if v is None and nullable:
        return None
    problem = _number_problem(v)
    if problem:
        raise BaselineError(f"{where}: {short_repr(v)} {problem}")
    return float(v)


def _flatten(entry: Mapping[str, Any], where: str) -> dict[str, float | None]:
    """``group.name`` / scalar key -> metric value of a case entry; raises :class:`BaselineError`."""
    out: dict[str, float | None] = {}
    for k in ("stages_ms", "denoise_step_ms"):
        if k not in entry:
            continue
        m = entry[k]
        if not isinstance(m, Mapping):
            raise BaselineError(f"{where}.{k}: {m!r} is not an object")
        for name, v in m.items():
            out[f"{k}.{name}"] = metric_value(v, f"{where}.{k}.{name}")
    for k in SCALAR_METRICS:
        if k in entry:
            out[k] = metric_value(entry[k], f"{where}.{k}")
    return out


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
        for k in entry:
            if k not in DERIVED_KEYS and (near := did_you_mean(k, DERIVED_KEYS, 0.8)):
                raise bad(f"scenarios.{case}.{k}", f"unknown key{near}")
        if all(entry.get(k, {}) == {} for k in DERIVED_KEYS if k != ENGINE_KEY):  # empty maps hold none
            raise bad(f"scenarios.{case}", f"no metric (keys: {', '.join(map(str, entry)) or 'none'})")
        _flatten(entry, f"{source}: scenarios.{case}")
        if "estimated_full_test_time_s" in entry:
            number(f"scenarios.{case}.estimated_full_test_time_s", entry["estimated_full_test_time_s"])
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
    """A baseline file (sglang ``perf_baselines`` layout) as a plain dict, unknown keys kept.
    Raises FileNotFoundError, or :class:`BaselineError` naming the file (too large, not JSON with
    line and column, the wrong shape with the key path)."""
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
    """Write ``doc`` to ``path`` atomically; returns the path."""
    _validate(doc, "<document to save>")
    p = Path(path)
    atomic_write_text(p, dumps_baseline(doc))
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a fsynced temp file ``os.replace``d), keeping
    its permission bits; on any error the old file is left untouched."""
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

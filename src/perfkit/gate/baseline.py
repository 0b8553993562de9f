"""Baseline JSON in sglang's ``perf_baselines`` layout: load, derive, compare, update.

Layout (sglang diffusion CI, see docs/DESIGN.md "Interop facts"; ``tests/fixtures/perf_baselines_5090.json``
is a real file)::

    {"metadata": {"model", "hardware", "description", "last_updated": "YYYY-MM-DD", ...},
     "tolerances": {"pr_test": {"e2e", "denoise_stage", "non_denoise_stage", "denoise_step",
                                "denoise_agg", "load_peak_vram", "runtime_peak_vram", ["load"]},
                    "long_term": {...}, <any other profile>: {...}},
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

The public API:

- :func:`load_baseline`, :func:`save_baseline`, :func:`dumps_baseline`, :func:`new_baseline`
- :func:`from_bundle`, :func:`baseline_from_bundles`, :func:`set_scenario`
- :func:`compare`, :func:`check_overlap`, :func:`classify_stage`, :func:`bound`
- :func:`improvement_snippets`
- :func:`update_baseline`

The verdict's table and words are elsewhere: :func:`perfkit.checks.overall_status`,
:func:`perfkit.report.notebook.verdict_markdown`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import logging
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from perfkit.bundle import ResultBundle, steady_state
from perfkit.checks import Check
from perfkit.common import jsonsafe
from perfkit.readings.stages import baseline_class as _baseline_class

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Constants. Every number the check uses lives here.
#
# Source: sglang's diffusion perf CI check (multimodal_gen perf baselines validation), as
# paraphrased in docs/DESIGN.md "Interop facts": a metric passes when
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
#: Rounding of values written by :func:`from_bundle` (sglang dumps ms with 2 decimals).
MS_DECIMALS = 2
MB_DECIMALS = 1
S_DECIMALS = 1

#: Scalar timing metrics of a scenario entry -> (tolerance key, pad ms).
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
    "load_peak_vram_mb": ("load_peak_vram", VRAM_PAD_MB),
    "runtime_peak_vram_mb": ("runtime_peak_vram", VRAM_PAD_MB),
    "warmup_peak_vram_mb": ("warmup_peak_vram", VRAM_PAD_MB),
    "load_peak_allocated_mb": ("load_peak_allocated", VRAM_PAD_MB),
    "runtime_peak_allocated_mb": ("runtime_peak_allocated", VRAM_PAD_MB),
}
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
#: Keys of a scenario entry that :func:`from_bundle` derives (replaced on update; others kept).
DERIVED_KEYS = (
    "stages_ms",
    "denoise_step_ms",
    "expected_e2e_ms",
    "expected_avg_denoise_ms",
    "expected_median_denoise_ms",
    "expected_load_ms",
    "expected_first_result_ms",
    *MEMORY_METRICS,
    "estimated_full_test_time_s",
)


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file (and line/column)."""


# ---------------------------------------------------------------------------------------------
# Load / save
# ---------------------------------------------------------------------------------------------


def new_baseline(
    hardware: str | None = None,
    *,
    model: str = "Diffusion Server",
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
    step_fractions: Iterable[float] | None = None,
    threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD,
    description: str = "",
) -> dict[str, Any]:
    """An empty baseline document with sglang's default tolerances (:data:`DEFAULT_TOLERANCES`)."""
    return {
        "metadata": {
            "model": model,
            "hardware": hardware or "unknown",
            "description": description,
            "last_updated": _dt.date.today().isoformat(),
        },
        "tolerances": copy.deepcopy(dict(tolerances or DEFAULT_TOLERANCES)),
        "improvement_reporting": {"threshold": threshold},
        "sampling": {"step_fractions": list(step_fractions or DEFAULT_STEP_FRACTIONS)},
        "scenarios": {},
    }


def _validate(doc: Any, source: str) -> None:
    def bad(where: str, what: str) -> BaselineError:
        return BaselineError(f"{source}: {where}: {what}")

    if not isinstance(doc, dict):
        raise bad("top level", f"is {type(doc).__name__}, expected a JSON object")
    for key in (
        "metadata",
        "tolerances",
        "improvement_reporting",
        "sampling",
        "scenarios",
        *TOP_LEVEL_CASE_MAPS,
    ):
        if key in doc and not isinstance(doc[key], dict):
            raise bad(key, f"is {type(doc[key]).__name__}, expected an object")

    def number(where: str, v: Any, nullable: bool = True) -> None:
        # JSON null is "not measured" (sglang writes it, e.g. stages_ms.per_frame_generation of
        # video cases); anything but a finite, non-negative number is an error, never 0.
        if v is None and nullable:
            return
        problem = _number_problem(v)
        if problem:
            raise bad(where, f"{v!r} {problem}")

    imp = doc.get("improvement_reporting") or {}
    if "threshold" in imp:
        # sglang: faster than expected * (1 - threshold) is an improvement, so a threshold is a
        # fraction in [0, 1]; a string ("0.2"), NaN or -5 would turn every row into "improved"
        number("improvement_reporting.threshold", imp["threshold"], nullable=False)
        if imp["threshold"] > 1:
            raise bad("improvement_reporting.threshold", f"{imp['threshold']!r} is above 1 (a fraction)")
    for prof, tols in (doc.get("tolerances") or {}).items():
        if not isinstance(tols, dict):
            raise bad(f"tolerances.{prof}", "expected an object")
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
        for mkey in ("stages_ms", "denoise_step_ms"):
            if mkey not in entry:
                continue
            m = entry[mkey]
            if not isinstance(m, dict):
                raise bad(f"scenarios.{case}.{mkey}", f"{m!r} is not an object")
            for k, v in m.items():
                number(f"scenarios.{case}.{mkey}.{k}", v)
        for mkey in (*SCALAR_TIMING_METRICS, *MEMORY_METRICS, "estimated_full_test_time_s"):
            if mkey in entry:
                number(f"scenarios.{case}.{mkey}", entry[mkey])
    for key in TOP_LEVEL_CASE_MAPS:
        for case, v in (doc.get(key) or {}).items():
            number(f"{key}.{case}", v)


def loads_baseline(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse baseline JSON text. Raises :class:`BaselineError` naming ``source`` and line/column."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except RecursionError:
        raise BaselineError(f"{source}: nested too deeply to be a baseline file") from None
    _validate(doc, source)
    return doc


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Load a baseline file (sglang ``perf_baselines`` layout) as a plain dict, unknown keys kept.

    Raises:
        FileNotFoundError: when the file does not exist.
        BaselineError: when it is not valid JSON (message: ``<file>: invalid JSON at line L column
            C: ...``) or has the wrong shape (message names the file and the key path).
    """
    p = Path(path)
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
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # some filesystems cannot fsync a directory
        pass


# ---------------------------------------------------------------------------------------------
# Stage classes
# ---------------------------------------------------------------------------------------------

StageClassifier = Callable[[str], str]


def classify_stage(name: str) -> str:
    """Stage class by sglang's rules, through :func:`perfkit.readings.stages.stage_class`.

    Returns ``"decoding"`` for decoding stages (names containing ``Decod``, checked first),
    ``"denoise"`` for denoising stages (``DenoisingStage``, ``LTX2AVDenoisingStage``) and
    refinement stages (``RefinementStage``, ``LTX2RefinementStage``: sglang marks them as
    denoising stages), else ``"non_denoise"`` (``*BeforeDenoisingStage`` and preparation stages
    included).
    """
    return _baseline_class(name)


def _classifier(stage_classes: StageClassifier | Mapping[str, str] | None) -> StageClassifier:
    if stage_classes is None:
        return classify_stage
    if callable(stage_classes):
        return stage_classes
    mapping = dict(stage_classes)
    return lambda name: mapping.get(name) or classify_stage(name)


# ---------------------------------------------------------------------------------------------
# Derive a scenario entry from a bundle
# ---------------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number_problem(v: Any) -> str | None:
    """Why ``v`` is not a metric value (a finite, non-negative JSON number), or None."""
    if not _is_number(v):
        return f"({type(v).__name__}) is not a number"
    if math.isnan(v) or math.isinf(v):
        return "is not a finite number"
    if v < 0:
        return "is negative"
    return None


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _max(values: Iterable[Any]) -> float | None:
    vals = [f for f in (_num(v) for v in values) if f is not None]
    return max(vals) if vals else None


def _measured_requests(bundle: ResultBundle, launch: str | None) -> pd.DataFrame:
    return bundle.measured_requests(launch)


def _keys(df: pd.DataFrame) -> list[tuple[Any, str]]:
    """(launch, request_id) per row; a missing launch (column or value) is None."""
    launches = df["launch"] if "launch" in df else [None] * len(df)
    return [
        (None if la is None or la is pd.NA or (isinstance(la, float) and math.isnan(la)) else la, str(rid))
        for la, rid in zip(launches, df["request_id"])
    ]


def _rows_of(df: pd.DataFrame, keys: set[tuple[Any, str]]) -> pd.DataFrame:
    if df.empty or not keys or "request_id" not in df:
        return df.iloc[0:0]
    return df[[k in keys for k in _keys(df)]]


def step_indices(n_steps: int, step_fractions: Iterable[float]) -> list[int]:
    """Sampled step indices: ``round(fraction * (n_steps - 1))`` (sglang), deduplicated, sorted."""
    if n_steps <= 0:
        return []
    return sorted({int(round(float(f) * (n_steps - 1))) for f in step_fractions})


def from_bundle(
    bundle: ResultBundle,
    case_id: str,
    step_fractions: Iterable[float] | None = None,
    launch: str | None = None,
    stage_classes: StageClassifier | Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Derive one scenario entry (sglang layout) from a bundle's tables.

    Measured requests are ``requests`` rows with ``index != WARMUP_INDEX`` and ``status == "completed"``
    (restricted to ``launch`` when given). Like sglang's baseline dump, each value is the worst
    (largest) over the measured requests:

    - ``stages_ms``: stage -> ms (a stage repeated within a request sums first).
    - ``denoise_step_ms``: ``str(step index)`` -> ms at ``step_fractions`` (default
      :data:`DEFAULT_STEP_FRACTIONS`), index = ``round(fraction * (n - 1))``, from the steps of
      denoise stages (``DenoisingStage`` when present, else any stage classed ``denoise``).
    - ``expected_e2e_ms``: worst ``e2e_ms`` (``client_ms`` when e2e is missing).
    - ``expected_avg_denoise_ms`` / ``expected_median_denoise_ms``: worst per-request mean /
      median denoise step ms (0.0 when there are no steps, as sglang writes for such cases).
    - ``expected_load_ms``: cold start, ``launches.ready_s * 1000`` (worst launch).
    - ``expected_first_result_ms``: time to first result, ``launches.first_result_s * 1000``
      (worst launch; perfkit's key, absent in sglang's files).
    - ``load_peak_vram_mb`` / ``warmup_peak_vram_mb``: ``launches.load_peak_mib`` /
      ``warmup_peak_mib`` (MiB; sglang's ``_mb`` keys are MiB).
    - ``runtime_peak_vram_mb`` / ``runtime_peak_allocated_mb``: max ``requests.peak_reserved_mib``
      / ``peak_allocated_mib`` (MiB).
    - ``estimated_full_test_time_s``: per launch, ready_s plus the span from its first measured
      request start to its last end (sum of e2e when no timestamps), summed over launches.

    Keys whose source columns are missing or empty are left out.

    Raises:
        ValueError: when the bundle has no measured requests (for ``launch``).
    """
    fractions = list(step_fractions if step_fractions is not None else DEFAULT_STEP_FRACTIONS)
    classify = _classifier(stage_classes)
    req = _measured_requests(bundle, launch)
    if req.empty:
        where = f" in launch {launch!r}" if launch is not None else ""
        raise ValueError(
            f"bundle {bundle.path or bundle.scenario}: no completed non-warmup "
            f"requests{where} for case {case_id!r}"
        )
    launch_col = pd.Series([k[0] for k in _keys(req)], index=req.index, dtype=object)
    keys = set(_keys(req))
    entry: dict[str, Any] = {}

    # stages: per request sum by stage name, then the worst request
    stages = _rows_of(bundle.stages, keys)
    stages_ms: dict[str, float] = {}
    if not stages.empty:
        per_req = (
            stages.assign(_launch=stages["launch"] if "launch" in stages else None)
            .groupby(["_launch", "request_id", "stage"], sort=False, dropna=False)["ms"]
            .sum()
        )
        worst = per_req.groupby(level="stage", sort=False).max()
        stages_ms = {str(k): round(float(v), MS_DECIMALS) for k, v in worst.items()}
    entry["stages_ms"] = stages_ms

    # steps
    steps = _rows_of(bundle.steps, keys)
    if not steps.empty and "stage" in steps:
        names = steps["stage"].fillna("").astype(str)
        if (names == "DenoisingStage").any():
            steps = steps[names == "DenoisingStage"]
        elif names.map(lambda s: classify(s) == "denoise").any():
            steps = steps[names.map(lambda s: classify(s) == "denoise")]
    step_ms: dict[int, float] = {}
    avgs: list[float] = []
    medians: list[float] = []
    if not steps.empty:
        sl = steps["launch"] if "launch" in steps else pd.Series(None, index=steps.index)
        for _, grp in steps.assign(_launch=sl).groupby(["_launch", "request_id"], sort=False, dropna=False):
            seq = [float(v) for v in grp.sort_values("step")["ms"]]
            if not seq:
                continue
            avgs.append(statistics.fmean(seq))
            medians.append(statistics.median(seq))
            for i in step_indices(len(seq), fractions):
                step_ms[i] = max(step_ms.get(i, -math.inf), seq[i])
    entry["denoise_step_ms"] = {str(i): round(v, MS_DECIMALS) for i, v in sorted(step_ms.items())}

    e2e = _max(req["e2e_ms"]) if "e2e_ms" in req else None
    if e2e is None and "client_ms" in req:
        e2e = _max(req["client_ms"])
    if e2e is not None:
        entry["expected_e2e_ms"] = round(e2e, MS_DECIMALS)
    entry["expected_avg_denoise_ms"] = round(max(avgs), MS_DECIMALS) if avgs else 0.0
    entry["expected_median_denoise_ms"] = round(max(medians), MS_DECIMALS) if medians else 0.0

    # launches: cold start and load/warmup peaks
    lt = bundle.launches
    used = {k[0] for k in keys}
    if not lt.empty and "launch" in lt:
        lt = lt[lt["launch"].isin(used)] if used != {None} else lt
        if launch is not None:
            lt = lt[lt["launch"] == launch]
    ready = _max(lt["ready_s"]) if "ready_s" in lt else None
    if ready is not None:
        entry["expected_load_ms"] = round(ready * 1000.0, MS_DECIMALS)
    first = _max(lt["first_result_s"]) if "first_result_s" in lt else None
    if first is not None:
        entry["expected_first_result_ms"] = round(first * 1000.0, MS_DECIMALS)
    for col, key in (("load_peak_mib", "load_peak_vram_mb"), ("warmup_peak_mib", "warmup_peak_vram_mb")):
        v = _max(lt[col]) if col in lt else None
        if v is not None:
            entry[key] = round(v, MB_DECIMALS)
    for col, key in (
        ("peak_reserved_mib", "runtime_peak_vram_mb"),
        ("peak_allocated_mib", "runtime_peak_allocated_mb"),
    ):
        v = _max(req[col]) if col in req else None
        if v is not None:
            entry[key] = round(v, MB_DECIMALS)

    # estimated full test time
    total_s = 0.0
    ready_by_launch = {}
    if "ready_s" in lt and "launch" in lt:
        ready_by_launch = {la: _num(r) or 0.0 for la, r in zip(lt["launch"], lt["ready_s"])}
    elif ready is not None:  # launches without labels: count the cold start once
        total_s += ready
    for la, grp in req.assign(_launch=launch_col).groupby("_launch", sort=False, dropna=False):
        span = None
        if "t_start_s" in grp and "t_end_s" in grp:
            t0, t1 = _num(grp["t_start_s"].min()), _num(grp["t_end_s"].max())
            if t0 is not None and t1 is not None:
                span = t1 - t0
        if span is None:
            col = "e2e_ms" if "e2e_ms" in grp else "client_ms" if "client_ms" in grp else None
            span = float(grp[col].fillna(0).sum()) / 1000.0 if col else 0.0
        total_s += span + ready_by_launch.get(la, 0.0)
    entry["estimated_full_test_time_s"] = round(total_s, S_DECIMALS)
    return entry


def set_scenario(doc: dict[str, Any], case_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Put ``entry`` under ``doc["scenarios"][case_id]`` in place and return ``doc``.

    Keys of an existing entry that :func:`from_bundle` does not derive (``notes``, unknown keys)
    are kept; derived keys are replaced. Top-level ``load_peak_vram_mb``/``runtime_peak_vram_mb``
    maps, when the document has them, get this case's values too so they cannot go stale.
    """
    scenarios = doc.setdefault("scenarios", {})
    old = scenarios.get(case_id) or {}
    merged: dict[str, Any] = {}
    for k, v in old.items():  # old key order; stale derived keys dropped
        if k not in DERIVED_KEYS:
            merged[k] = v
        elif k in entry:
            merged[k] = entry[k]
    for k, v in entry.items():
        merged.setdefault(k, v)
    scenarios[case_id] = merged
    for key in TOP_LEVEL_CASE_MAPS:
        if isinstance(doc.get(key), dict) and key in entry:
            doc[key][case_id] = entry[key]
    return doc


def baseline_from_bundles(
    cases: Mapping[str, ResultBundle] | Iterable[tuple[str, ResultBundle]],
    hardware: str | None = None,
    *,
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
    step_fractions: Iterable[float] | None = None,
    launch: str | None = None,
    description: str | None = None,
    model: str = "Diffusion Server",
) -> dict[str, Any]:
    """Build a whole baseline document from bundles.

    Args:
        cases: case id -> bundle (or (case id, bundle) pairs).
        hardware: ``metadata.hardware``.
        tolerances: profiles; default :data:`DEFAULT_TOLERANCES` (sglang's 5090 numbers).
        step_fractions: default :data:`DEFAULT_STEP_FRACTIONS`.
        launch: restrict every case to this launch label.
        description: ``metadata.description``; default names the bundles' git commits.
    """
    items = list(cases.items()) if isinstance(cases, Mapping) else list(cases)
    fractions = list(step_fractions if step_fractions is not None else DEFAULT_STEP_FRACTIONS)
    if description is None:
        commits = sorted({str(b.meta.get("git_commit")) for _, b in items if b.meta.get("git_commit")})
        description = (
            "Reference numbers from perfkit bundles"
            + (f" at git commit {', '.join(commits)}" if commits else "")
            + "."
        )
    doc = new_baseline(
        hardware, model=model, tolerances=tolerances, step_fractions=fractions, description=description
    )
    for case_id, bundle in items:
        set_scenario(doc, case_id, from_bundle(bundle, case_id, fractions, launch=launch))
    return doc


def entry_from_records(
    records: Iterable[Any], step_fractions: Iterable[float] | None = None
) -> dict[str, Any]:
    """One scenario entry (sglang layout) from per-request records
    (:class:`perfkit.readings.records.PerfRecord`, e.g. a performance.log's lines or a perf
    dump's :meth:`~perfkit.readings.perfdump.PerfDump.to_record`), the worst request kept as
    sglang's baseline dump does (``test_server_utils.py``): ``stages_ms``, ``denoise_step_ms``
    at ``step_fractions``, ``expected_e2e_ms`` (``total_duration_ms``),
    ``expected_avg_denoise_ms`` / ``expected_median_denoise_ms`` and, when the records carry a
    ``runtime_peak`` snapshot, ``runtime_peak_vram_mb`` / ``runtime_peak_allocated_mb``.

    A value that no record measured (null everywhere) is written as None, never as 0; a step
    list with a null is left out of the averages (it cannot be averaged honestly). One pass over
    ``records`` keeping only the worst values: a generator over a file of any size takes
    constant memory.

    Raises:
        ValueError: no records.
    """
    fractions = list(step_fractions if step_fractions is not None else DEFAULT_STEP_FRACTIONS)

    def worse(cur: float | None, v: float | None) -> float | None:
        return cur if v is None else (v if cur is None else max(cur, v))

    # one pass, keeping only the worst so far: records may be streamed from a file of any size
    n = 0
    stages: dict[str, float | None] = {}  # first-seen order
    step_ms: dict[int, float | None] = {}
    e2e: float | None = None
    avg: float | None = None
    med: float | None = None
    peaks: dict[str, float | None] = {}
    for r in records:
        n += 1
        for name, ms in r.stage_ms().items():
            stages[name] = worse(stages.get(name), ms)
        seq = list(r.steps)
        for i in step_indices(len(seq), fractions):
            step_ms[i] = worse(step_ms.get(i), seq[i])
        if seq and all(v is not None for v in seq):
            avg = worse(avg, statistics.fmean(seq))
            med = worse(med, statistics.median(seq))
        e2e = worse(e2e, r.total_duration_ms)
        snap = r.memory_snapshots.get("runtime_peak") or {}
        for key, snap_key in (
            ("runtime_peak_vram_mb", "peak_reserved_mb"),
            ("runtime_peak_allocated_mb", "peak_allocated_mb"),
        ):
            v = snap.get(snap_key)
            if v is not None:
                peaks[key] = worse(peaks.get(key), v)
    if not n:
        raise ValueError("no records to derive a baseline entry from")

    def r3(v: float | None) -> float | None:
        return None if v is None else round(v, MS_DECIMALS)

    entry: dict[str, Any] = {"stages_ms": {k: r3(v) for k, v in stages.items()}}
    entry["denoise_step_ms"] = {str(i): r3(v) for i, v in sorted(step_ms.items())}
    entry["expected_e2e_ms"] = r3(e2e)
    entry["expected_avg_denoise_ms"] = r3(avg) if avg is not None else 0.0
    entry["expected_median_denoise_ms"] = r3(med) if med is not None else 0.0
    for key in ("runtime_peak_vram_mb", "runtime_peak_allocated_mb"):
        if key in peaks:
            entry[key] = r3(peaks[key])
    return entry


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------


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
            return (
                (None if t is None else max(t, DECODING_STAGE_MIN_TOL)),
                DECODING_STAGE_PAD_MS,
                f"decoding: max(non_denoise_stage, {DECODING_STAGE_MIN_TOL})",
            )
        return tols.get("non_denoise_stage"), NON_DENOISE_STAGE_PAD_MS, "non_denoise_stage"
    if metric.startswith("denoise_step_ms."):
        if metric.split(".", 1)[1] == "0":
            return STEP0_TOL, STEP0_PAD_MS, "step 0"
        pad = VIDEO_STEP_PAD_MS if video else IMAGE_STEP_PAD_MS
        return tols.get("denoise_step"), pad, "denoise_step"
    if metric in SCALAR_TIMING_METRICS:
        key, pad = SCALAR_TIMING_METRICS[metric]
        return tols.get(key), pad, key
    if metric in MEMORY_METRICS:
        key, pad = MEMORY_METRICS[metric]
        return tols.get(key), pad, key
    return None, DEFAULT_PAD_MS, "unknown"


def _metric_value(v: Any, where: str) -> float | None:
    """A metric as written: None for JSON null ("not measured"), else a finite, non-negative
    number; anything else raises :class:`BaselineError` naming ``where`` (never read as 0)."""
    if v is None:
        return None
    problem = _number_problem(v)
    if problem:
        raise BaselineError(f"{where}: {v!r} {problem}")
    return float(v)


def _flatten(entry: Mapping[str, Any], where: str = "<entry>") -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in ("stages_ms", "denoise_step_ms"):
        m = entry.get(k)
        if m is None:
            continue
        if not isinstance(m, Mapping):
            raise BaselineError(f"{where}.{k}: {m!r} is not an object")
        for name, v in m.items():
            out[f"{k}.{name}"] = _metric_value(v, f"{where}.{k}.{name}")
    for k in (*SCALAR_TIMING_METRICS, *MEMORY_METRICS):
        if k in entry:
            out[k] = _metric_value(entry[k], f"{where}.{k}")
    return out


def _expected_metrics(baseline: Mapping[str, Any], case: str) -> dict[str, float | None] | None:
    entry = (baseline.get("scenarios") or {}).get(case)
    top = {
        k: baseline[k][case]
        for k in TOP_LEVEL_CASE_MAPS
        if isinstance(baseline.get(k), dict) and case in baseline[k]
    }
    if entry is None and not top:
        return None
    flat = _flatten(entry or {}, f"baseline scenarios.{case}")
    for k, v in top.items():
        # a value inside the scenario entry wins
        flat.setdefault(k, _metric_value(v, f"baseline {k}.{case}"))
    return flat


def _snippet(metric: str, value: float) -> dict[str, Any]:
    if "." in metric:
        group, name = metric.split(".", 1)
        return {group: {name: value}}
    return {metric: value}


def compare(
    run: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Any],
    profile: str = "pr_test",
    strict: bool = False,
    *,
    stage_classes: StageClassifier | Mapping[str, str] | None = None,
    video: bool = True,
    threshold: float | None = None,
) -> list[Check]:
    """Check a run against a baseline with sglang's rule.

    A metric passes when ``actual <= max(expected * (1 + tol), expected + pad)`` (see the module
    constants for tolerances/pads and their source). Stage classes come from
    :func:`classify_stage` unless ``stage_classes`` (a callable or a name -> class mapping with
    the default rules as fallback) says otherwise.

    Args:
        run: case id -> scenario entry (the output of :func:`from_bundle`); ms and MiB.
        baseline: a loaded baseline document.
        profile: tolerance profile name (``pr_test``, ``long_term``, ...).
        strict: a case (or metric) with no baseline fails instead of being ``new``.
        video: use the 160 ms pad for denoise steps after step 0 (False: 20 ms, image models).
        threshold: improvement threshold; default the document's
            ``improvement_reporting.threshold`` (0.2).

    Returns:
        Verdict rows: ``fail`` when over the bound or missing from the run (or null in the run);
        ``improved`` (a pass) when faster than ``expected * (1 - threshold)``, with a snippet to
        paste; ``skipped`` when the profile has no tolerance for an optional metric (``load``,
        allocated/warmup peaks), when the baseline value is null ("not measured in the
        baseline"), and for ``stages_ms.per_frame_generation`` of video cases.

    Null values follow sglang's own check (``_validate_stages`` in
    ``multimodal_gen/test/server/test_server_utils.py``): ``per_frame_generation`` is skipped
    for video cases; otherwise it is a stage like the others, the run's average frame time
    (e2e / frames) checked with the non-denoise tolerance. Its baseline dump writes null there
    when no frame time was measured; perfkit reads such a null as "not measured", never as 0.

    Raises:
        KeyError: when ``profile`` is not in the baseline's tolerances.
        BaselineError: a value in ``run`` or ``baseline`` that is not a number or null (the
            message names the case and the key).
    """
    all_tols = baseline.get("tolerances") or {}
    if profile not in all_tols:
        raise KeyError(f"tolerance profile {profile!r} not in baseline (has: {sorted(all_tols)})")
    tols = all_tols[profile]
    threshold_from = "given"
    if threshold is None:
        given = (baseline.get("improvement_reporting") or {}).get("threshold")
        threshold_from = (
            "the baseline's" if given is not None else "sglang's default: the baseline gives none"
        )
        threshold = float(DEFAULT_IMPROVEMENT_THRESHOLD if given is None else given)
    classify = _classifier(stage_classes)
    rows: list[Check] = []
    for case, entry in run.items():
        expected = _expected_metrics(baseline, case)
        actual = _flatten(entry, f"run {case}")
        if expected is None:
            status = "fail" if strict else "new"
            rows.append(
                Check(
                    case,
                    "*",
                    None,
                    None,
                    None,
                    status,
                    "case not in baseline" + (" (strict)" if strict else ""),
                )
            )
            continue
        first = len(rows)
        for metric, exp in expected.items():
            act = actual.get(metric)
            tol, pad, rule = _metric_rule(metric, tols, classify, video)
            if exp is None:
                rows.append(
                    Check(case, metric, None, act, None, "skipped", "not measured in the baseline (null)")
                )
                continue
            if metric == PER_FRAME_METRIC and video:
                rows.append(
                    Check(
                        case,
                        metric,
                        exp,
                        act,
                        None,
                        "skipped",
                        "sglang skips per_frame_generation for video cases",
                    )
                )
                continue
            if tol is None:
                known_optional = rule in OPTIONAL_TOLERANCES
                if not known_optional:
                    log.warning("profile %s has no tolerance for %s (%s)", profile, metric, rule)
                rows.append(
                    Check(
                        case,
                        metric,
                        exp,
                        act,
                        None,
                        "skipped",
                        f"profile {profile!r} has no {rule!r} tolerance",
                    )
                )
                continue
            b = bound(exp, tol, pad)
            if act is None:
                why = "not measured in the run (null)" if metric in actual else "missing from run"
                rows.append(Check(case, metric, exp, None, b, "fail", why))
                continue
            rule_txt = f"{rule}: tol {tol:g}, pad {pad:g}"
            if act > b:
                over = (act / exp - 1.0) * 100 if exp else math.inf
                rows.append(
                    Check(
                        case,
                        metric,
                        exp,
                        act,
                        b,
                        "fail",
                        f"{act:g} > bound {b:g} (+{over:.1f}% vs expected; {rule_txt})",
                    )
                )
            elif exp > 0 and act < exp * (1.0 - threshold):
                snip = _snippet(metric, act)
                rows.append(
                    Check(
                        case,
                        metric,
                        exp,
                        act,
                        b,
                        "improved",
                        f"{(1 - act / exp) * 100:.1f}% faster than expected (improvement threshold "
                        f"{threshold:g}, {threshold_from}); update scenarios.{case} with {json.dumps(snip)}",
                        snip,
                    )
                )
            else:
                rows.append(Check(case, metric, exp, act, b, "pass", rule_txt))
        if not any(r.status in ("pass", "fail", "improved") for r in rows[first:]):
            # no hollow pass: a case present on both sides must compare something
            why = "its baseline entry holds no metric" if not expected else "every metric was skipped"
            rows.append(
                Check(
                    case, "metrics compared", None, 0, None, "fail", f"nothing compared for this case: {why}"
                )
            )
        for metric in actual:
            if metric not in expected and actual[metric] is not None:
                status = "fail" if strict else "new"
                rows.append(
                    Check(
                        case,
                        metric,
                        None,
                        actual[metric],
                        None,
                        status,
                        "metric not in baseline" + (" (strict)" if strict else ""),
                    )
                )
    return rows


def check_overlap(
    run: Mapping[str, Any], baseline: Mapping[str, Any], *, source: str, run_hardware: str | None = None
) -> tuple[list[Check], list[str]]:
    """Whether comparing ``run`` (case id -> entry) with ``baseline`` compares anything.

    Returns ``(rows, warnings)``: a failing row (case ``baseline``, metric ``cases compared``)
    when no case of the run is in the baseline, so that a run on other hardware (a CPU run
    against ``baselines/h200.json``) never reads as a pass; and warnings naming both hardware
    labels when nothing was compared or when the labels differ.
    """
    ref_hw = (baseline.get("metadata") or {}).get("hardware") or "unknown"
    run_hw = run_hardware or "unknown"
    common = [c for c in run if c in (baseline.get("scenarios") or {})]
    hw = f"hardware {ref_hw!r} vs this run's {run_hw!r}"
    if not common:
        what = "no case of this run is in" if run else "this run has no case to compare with"
        reason = f"{what} {source} ({hw}): nothing compared"
        return (
            [Check("baseline", "cases compared", None, 0, None, "fail", reason)],
            [f"{reason}; a baseline only gates runs of its own hardware and cases"],
        )
    if ref_hw != run_hw:
        return [], [
            f"{source} was measured on {ref_hw!r}, this run on {run_hw!r}: absolute "
            f"numbers are only comparable on the same hardware"
        ]
    return [], []


def improvement_snippets(rows: Iterable[Check]) -> dict[str, dict[str, Any]]:
    """Merge the snippets of ``improved`` rows per case: case id -> fragment to paste."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.status != "improved" or not r.snippet:
            continue
        dst = out.setdefault(r.case, {})
        for k, v in r.snippet.items():
            if isinstance(v, dict):
                dst.setdefault(k, {}).update(v)
            else:
                dst[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# Update
# ---------------------------------------------------------------------------------------------


def update_baseline(
    bundle_dir: str | Path,
    baseline_file: str | Path,
    case_id: str,
    *,
    hardware: str | None = None,
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
    launch: str | None = None,
    num_frames: int | None = None,
) -> dict[str, Any]:
    """Write ``case_id``'s entry, derived from the bundle at ``bundle_dir``, into ``baseline_file``.

    The entry holds the steady state the suite's gate writes (:func:`perfkit.gate_run.bundle_cases`):
    every measured request of the selected launch (``launch``; ``num_frames`` picks one request
    shape), the worst kept as sglang does, except an uncovered cold request (its shape differs
    from the startup warmup's, so its recompilation is the investigation's finding, not a number
    to gate on). A bundle of several launches needs ``launch``.

    Raises:
        ValueError: several launches and no ``launch``; an unknown launch; ``hardware`` differs
            from the file's ``metadata.hardware`` (a baseline holds one hardware's numbers).

    The file is replaced atomically (temp file in the same directory, flush + fsync,
    ``os.replace``): an interruption leaves the old file intact. Other cases, tolerances and
    unknown keys are kept. ``metadata.last_updated`` becomes today (YYYY-MM-DD),
    ``metadata.description`` names the bundle's git commit (``meta["git_commit"]``), and
    ``metadata.hardware`` is set when ``hardware`` is given. A missing file is created with
    ``tolerances`` (default :data:`DEFAULT_TOLERANCES`, sglang's values).

    Returns:
        The document written.
    """
    bundle = ResultBundle.load(bundle_dir)
    launches = [str(x) for x in bundle.launches.get("launch", [])] if not bundle.launches.empty else []
    if launch is None and len(launches) > 1:
        raise ValueError(
            f"{bundle_dir} holds {len(launches)} launches ({', '.join(launches)}): name one with --launch"
        )
    if launch is not None and launches and launch not in launches:
        raise ValueError(f"{bundle_dir}: no launch {launch!r} (has {', '.join(launches)})")
    sel = steady_state(bundle, launch=launch, num_frames=num_frames)
    path = Path(baseline_file)
    if path.exists():
        doc = load_baseline(path)
        have = (doc.get("metadata") or {}).get("hardware")
        if hardware is not None and have and have != hardware:
            raise ValueError(
                f"{path} holds numbers for hardware {have!r}, not {hardware!r}: "
                f"write another hardware's numbers to its own baseline file"
            )
    else:
        log.info("creating baseline %s", path)
        doc = new_baseline(hardware, tolerances=tolerances)
    fractions = (doc.get("sampling") or {}).get("step_fractions") or DEFAULT_STEP_FRACTIONS
    entry = from_bundle(sel, case_id, fractions)
    set_scenario(doc, case_id, entry)
    meta = doc.setdefault("metadata", {})
    commit = bundle.meta.get("git_commit") or "unknown"
    meta["description"] = (
        f"Reference numbers for {case_id} from perfkit bundle "
        f"{Path(bundle_dir).name} ({bundle.scenario}) at git commit {commit}."
    )
    meta["last_updated"] = _dt.date.today().isoformat()
    if hardware is not None:
        meta["hardware"] = hardware
    save_baseline(doc, path)
    log.info("baseline %s: case %s updated from %s", path, case_id, bundle_dir)
    return doc

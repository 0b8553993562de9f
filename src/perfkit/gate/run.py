"""The run's gate (:func:`gate`): this run's numbers in sglang's baseline layout against a
baseline, the investigations' checks and what each launch's engine ran; launches nothing. Also
what ``perfkit compare --run`` names, read into baseline cases (:func:`compare_cases`)."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from perfkit.bundle import WARMUP_INDEX, ResultBundle, table_rows
from perfkit.checks import CHECK_COLUMNS, Check, is_reported
from perfkit.common.provenance import repo_root
from perfkit.common.slugs import slug
from perfkit.engine.spec import DEFAULT_WARMUP_FRAMES
from perfkit.gate import baseline as bl
from perfkit.gate.verdicts import read_verdict
from perfkit.investigations import registry
from perfkit.readings import perfdump, records

log = logging.getLogger(__name__)


def case_id(
    engine: Mapping[str, Any],
    request: Mapping[str, Any],
    *,
    warmup_frames: int | None = None,
    num_frames: int | None = None,
    suffix: str = "",
) -> str:
    """Case id saying preset, shape and startup warmup, then ``_2stage``, ``_<N>gpu`` (N > 1) and
    ``suffix``: ``ltx-2b_24f_512x768_30s_w25_2stage_2gpu``."""
    preset = engine.get("preset") or engine.get("kind") or "engine"
    if engine.get("kind") == "sglang":
        preset = Path(str(engine.get("model_path") or "sglang")).name
    nf = num_frames if num_frames is not None else request.get("num_frames")
    w = warmup_frames if warmup_frames is not None else engine.get("warmup_frames", DEFAULT_WARMUP_FRAMES)
    cid = (
        f"{slug(preset)}_{nf}f_{request.get('height')}x{request.get('width')}_"
        f"{request.get('num_inference_steps')}s_w{w}"
    )
    if engine.get("two_stage"):
        cid += "_2stage"
    gpus = engine.get("num_gpus") or 1
    if isinstance(gpus, int) and gpus > 1:
        cid += f"_{gpus}gpu"
    return cid + suffix


def case_namer(engine: Mapping[str, Any], request: Mapping[str, Any]):
    """``case_id`` bound to this run's engine and request."""
    return functools.partial(case_id, engine, request)


def bundle_cases(
    bundles: Mapping[str, ResultBundle], engine: Mapping[str, Any], request: Mapping[str, Any]
) -> dict[str, ResultBundle]:
    """Case id -> (sub-)bundle for this run's baseline.json, from each investigation's ``cases``."""
    namer = case_namer(engine, request)
    cases: dict[str, ResultBundle] = {}
    for s in registry.all_investigations():
        b = bundles.get(s.name)
        if b is not None:
            cases.update(s.cases(b, namer))
    return cases


def investigation_checks(
    investigation: str, results: Mapping[str, Any], invariants: Mapping[str, Any] | None = None
) -> list[Check]:
    """Check rows of one investigation against its invariants (the registry's defaults overlaid
    with ``invariants``, None turning one off). Raises ValueError for an unknown invariant key."""
    inv = registry.merged_invariants(invariants)
    return registry.checks_for({investigation: dict(results)}, inv, only=investigation)


def load_run_bundles(run_dir: str | Path) -> dict[str, ResultBundle]:
    """Investigation -> bundle for each ``run_dir/<investigation>/`` holding one."""
    dirs = {s: Path(run_dir) / s for s in registry.names()}
    return {s: ResultBundle.load(d) for s, d in dirs.items() if (d / "meta.json").exists()}


def investigation_rows(
    run_dir: Path, bundles: Mapping[str, ResultBundle], invariants: Mapping[str, Any] | None
) -> list[Check]:
    """Each investigation's check rows from its verdict.json; one without a readable verdict is
    judged here on its bundle (:func:`investigation_checks`)."""
    rows: list[Check] = []
    for s in registry.names():
        doc = read_verdict(run_dir / s)
        if doc is None or doc.get("status") == "error":
            b = bundles.get(s)
            rows += investigation_checks(s, b.results if b is not None else {}, invariants)
        else:
            rows += [Check(**{c: r.get(c) for c in CHECK_COLUMNS}) for r in doc["rows"]]
    return rows


@dataclass
class GateResult:
    """What the gate found: invariant and baseline rows, the cases, errors and warnings."""

    baseline_doc: dict[str, Any]
    cases: list[str]
    invariant_rows: list[Check]
    baseline_rows: list[Check]
    compared_with: str | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[Check]:
        """Invariant rows, then baseline rows."""
        return [*self.invariant_rows, *self.baseline_rows]


def gate(
    run_dir: str | Path,
    *,
    engine: Mapping[str, Any],
    request: Mapping[str, Any],
    baseline_file: str | Path | None = None,
    profile: str = "pr_test",
    strict: bool = False,
    hardware: str | None = None,
    invariants: Mapping[str, Any] | None = None,
) -> GateResult:
    """The baseline gate: writes ``run_dir/baseline.json`` (this run's cases), compares them with
    ``baseline_file`` when given; rows from the investigations' verdicts and :func:`engine_checks`."""
    run_dir = Path(run_dir)
    bundles = load_run_bundles(run_dir)
    errors = [] if bundles else [f"no bundles under {run_dir}"]
    cases = bundle_cases(bundles, engine, request)
    hw = hardware or bundles_hardware(bundles)
    doc = bl.baseline_from_bundles(cases, hardware=hw)
    bl.save_baseline(doc, run_dir / "baseline.json")
    inv = registry.merged_invariants(invariants)
    inv_rows = investigation_rows(run_dir, bundles, invariants) + engine_checks(bundles, inv)
    base_rows: list[Check] = []
    warnings: list[str] = []
    compared = None
    if baseline_file:
        bpath = resolve_baseline_file(baseline_file)
        if bpath.exists():
            ref = bl.load_baseline(bpath)
            base_rows, warnings = _against(
                doc["scenarios"], baseline_file, ref, hw, profile=profile, strict=strict
            )
            compared = str(bpath)
            for w in warnings:
                log.warning("%s", w)
        else:
            log.warning("baseline file %s does not exist: comparing nothing", baseline_file)
            why = "baseline file not found" + (" (strict)" if strict else "")
            status = "fail" if strict else "skipped"
            base_rows = [Check("baseline", str(baseline_file), None, None, None, status, why)]
    return GateResult(doc, list(cases), inv_rows, base_rows, compared, errors, warnings)


def resolve_baseline_file(file: str | Path) -> Path:
    """A params ``baseline.file``: as given when it exists, else relative to the perfkit checkout."""
    p = Path(file)
    if not p.is_absolute() and not p.exists():
        return repo_root() / p
    return p


def run_hardware(
    run_dir: str | Path,
    baseline: Mapping[str, Any] | None = None,
    bundles: Mapping[str, ResultBundle] | None = None,
) -> str:
    """The hardware label of a finished run: its baseline.json's ``metadata.hardware``, else the
    params' ``baseline.hardware``, else its bundles' (``baseline``, ``bundles``: when already read)."""
    run_dir = Path(run_dir)
    try:
        doc = baseline if baseline is not None else bl.load_baseline(run_dir / "baseline.json")
        hw = (doc.get("metadata") or {}).get("hardware")
        if hw:
            return str(hw)
    except (OSError, bl.BaselineError):
        pass
    try:
        hw = (_run_params(run_dir).get("baseline") or {}).get("hardware")
        if hw:
            return str(hw)
    except (OSError, ValueError, AttributeError):
        pass
    return bundles_hardware(bundles if bundles is not None else load_run_bundles(run_dir))


def _run_params(run_dir: Path) -> dict[str, Any]:
    """A run's params.yaml ({} when absent). Raises ValueError naming the file."""
    p = run_dir / "params.yaml"
    if not p.exists():
        return {}
    try:
        sp = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(sp, dict):
        raise ValueError(f"{p}: top level must be a mapping, got {type(sp).__name__}")
    return sp


def bundles_hardware(bundles: Mapping[str, ResultBundle]) -> str:
    """The bundles' hardware label: a GPU name, else ``cpu xN (host)``, else ``unknown``."""
    metas = [b.meta for b in bundles.values()]
    gpu = next((m["gpu_name"] for m in metas if m.get("gpu_name")), None)
    cpu = next(
        (f"cpu x{m['cpu_count']} ({m.get('host', 'host')})" for m in metas if m.get("cpu_count")), None
    )
    return str(gpu or cpu or "unknown")


def run_cases(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Case id -> case entry of a finished run: its baseline.json's, else its bundles'. Raises
    ValueError naming an unreadable params.yaml."""
    run_dir = Path(run_dir)
    if (run_dir / "baseline.json").exists():
        return dict(bl.load_baseline(run_dir / "baseline.json").get("scenarios") or {})
    sp = _run_params(run_dir)
    cases = bundle_cases(load_run_bundles(run_dir), sp.get("engine") or {}, sp.get("request") or {})
    return {c: bl.from_bundle(b, c) for c, b in cases.items()}


def _text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def engine_checks(bundles: Mapping[str, ResultBundle], invariants: Mapping[str, Any]) -> list[Check]:
    """Check rows (case = investigation) ``compile_active[<launch>]`` and
    ``recompile_limit[<launch>]`` for what each launch really ran (docs/suite.md, "What the gate
    checks"); ``invariants``: the merged invariants."""
    inactive_ok = bool(invariants.get("compile_inactive_ok", False))
    rows: list[Check] = []
    for investigation, b in bundles.items():
        launches = b.table("launches")
        requests = b.table("requests")
        for ln in table_rows(launches):  # missing values as None
            if _text(ln.get("reused_from")):
                continue
            label = _text(ln.get("launch"))
            asked, active = ln.get("compile_requested"), ln.get("compile_active")
            if asked:
                metric = f"compile_active[{label}]"
                if active:
                    rows.append(
                        Check(investigation, metric, 1.0, 1.0, 1.0, "pass", "compile asked and active")
                    )
                elif active is False:
                    why = _text(ln.get("compile_disabled_reason")) or "the engine gave no reason"
                    status = "pass" if inactive_ok else "fail"
                    tail = " (expected: invariants.compile_inactive_ok)" if inactive_ok else ""
                    why = f"compile asked but not active: {why}{tail}"
                    rows.append(Check(investigation, metric, 1.0, 0.0, 1.0, status, why))
            if not active:
                continue
            mine = requests[requests["launch"] == label] if not requests.empty else requests
            flags = list(mine["recompile_limit_hit"])
            hit = mine[[is_reported(f) and bool(f) for f in flags]] if flags else mine.iloc[:0]
            metric = f"recompile_limit[{label}]"
            if hit.empty:
                told = sum(is_reported(f) for f in flags)
                if not told:  # the engine reports no flag (sglang): not measured, never a pass
                    why = "not measured: the engine reported no recompile-limit flag for any request"
                    rows.append(Check(investigation, metric, 0.0, None, 0.0, "skipped", why))
                    continue
                unknown = len(flags) - told
                why = "no request hit the recompile limit" + (
                    f" ({unknown} of {len(flags)} requests did not report it)" if unknown else ""
                )
                rows.append(Check(investigation, metric, 0.0, 0.0, 0.0, "pass", why))
                continue
            first = table_rows(hit.iloc[:1])[0]
            idx, frames = first.get("index"), first.get("effective_num_frames")
            frames = first.get("num_frames") if frames is None else frames
            who = "the startup warmup" if idx == WARMUP_INDEX else f"request {idx}"
            who += f" ({frames} frames)" if _text(frames) else ""
            stage = _text(first.get("recompile_limit_stage")) or "a stage not reported"
            reasons = [r for r in _text(first.get("recompile_reasons")).split("; ") if r]
            limit = ln.get("recompile_limit")
            lim = f" (limit {int(limit)})" if _text(limit) else ""
            why = (
                f"{who} hit torch.compile's recompile limit{lim} in {stage}; "
                f"later calls ran eagerly. torch: {'; '.join(reasons) or 'no reason logged'}"
                + (f" ({len(hit)} requests hit it)" if len(hit) > 1 else "")
            )
            rows.append(Check(investigation, metric, 0.0, float(len(hit)), 0.0, "fail", why))
    return rows


def _bundle_cases(b: ResultBundle, case: str | None) -> dict[str, dict[str, Any]]:
    """A bundle's cases as its run's baseline.json names them; ``case`` picks or names one."""
    p = b.meta.get("params") or {}
    if not isinstance(p.get("spec"), dict) or not isinstance(p.get("request"), dict):
        cid = case or b.investigation
        return {cid: bl.from_bundle(b, cid)}
    cases = bundle_cases({b.investigation: b}, p["spec"], p["request"])
    if case is not None:
        if case not in cases and len(cases) != 1:
            raise ValueError(f"{b.path}: no case {case!r}; its cases: {', '.join(cases)}")
        cases = {case: cases[case] if case in cases else next(iter(cases.values()))}
    return {c: bl.from_bundle(sub, c) for c, sub in cases.items()}


def compare_cases(run: Path, case: str | None) -> tuple[dict[str, dict[str, Any]], str | None]:
    """(case id -> case entry, hardware label or None) of a run or bundle directory, a
    performance.log or an sglang perf dump; ``case`` picks a bundle's case or names a file's (default
    its stem); {}: nothing measured. Raises OSError (missing) or ValueError (unreadable)."""
    if run.is_dir():
        if (run / "meta.json").exists():
            b = ResultBundle.load(run)
            return _bundle_cases(b, case), b.meta.get("gpu_name")
        cases = run_cases(run)
        if cases or not (run / "performance.log").exists():
            return cases, run_hardware(run)
        run = run / "performance.log"
    if not run.exists():
        raise FileNotFoundError(f"{run}: no such file or directory")
    cid = case or run.stem
    with open(run, "rb") as fh:
        head = fh.read(perfdump.MAX_DUMP_BYTES + 1)
    try:
        doc = json.loads(head) if len(head) <= perfdump.MAX_DUMP_BYTES else None
    except (ValueError, RecursionError):
        doc = None
    if perfdump.is_perf_dump(doc):
        return {cid: bl.entry_from_records([perfdump.read_perf_dump(run)])}, None
    del head
    recs = (
        r
        for r in records.iter_perf_log(run, strict=True, keep_raw=False, partial_last=False)
        if isinstance(r, records.PerfRecord) and not r.is_warmup
    )
    try:
        return {cid: bl.entry_from_records(recs)}, None
    except ValueError as exc:
        if isinstance(exc, records.RecordError):
            raise
        return {}, None  # no measured record


def compare_run(
    run: str | Path, baseline: str | Path, case: str | None, profile: str, strict: bool
) -> tuple[list[Check], list[str]]:
    """(check rows, warnings) of what ``run`` names (:func:`compare_cases`) against the file
    ``baseline``. Raises OSError (a file missing) or ValueError naming the file (unreadable, a
    profile it lacks, nothing measured)."""
    ref = bl.load_baseline(baseline)
    cases, hardware = compare_cases(Path(run), case)
    if not cases:
        raise ValueError(f"no cases in {run} (no baseline.json, bundles nor records)")
    return _against(cases, baseline, ref, hardware, profile=profile, strict=strict)


def _against(
    cases: Mapping, baseline: Any, ref: dict, hw: str | None, **how: Any
) -> tuple[list[Check], list[str]]:
    """(overlap rows then :func:`~perfkit.gate.baseline.compare`'s, warnings) of ``cases`` against ``ref``."""
    try:
        rows = bl.compare(cases, ref, **how)
    except KeyError as exc:  # the profile is not in the file's tolerances: name the file
        raise bl.BaselineError(f"{baseline}: tolerances: {exc.args[0]}") from None
    except bl.BaselineError as exc:
        raise bl.BaselineError(f"{baseline}: {exc}") from None
    overlap, warnings = bl.check_overlap(cases, ref, source=str(baseline), run_hardware=hw)
    return [*overlap, *rows], warnings

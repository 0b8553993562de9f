"""What ``perfkit compare --run`` names, read into baseline cases: the input kind is told here.

A perfkit run directory, a bundle directory (``meta.json``), a performance.log (sglang's
per-request JSON lines) or a perf dump JSON (sglang's ``--perf-dump-path``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfkit.bundle import ResultBundle
from perfkit.checks import Check
from perfkit.gate import baseline as bl
from perfkit.gate.run import bundle_cases, run_cases, run_hardware
from perfkit.readings import perfdump, records


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _bundle_cases(b: ResultBundle, case: str | None) -> dict[str, dict[str, Any]]:
    """A bundle's cases named as its run's baseline.json names them (the engine and request it
    recorded, :func:`perfkit.gate.run.bundle_cases`); ``case`` picks one, or names the only one.
    A bundle without its params: one case named ``case`` or its investigation."""
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
    """Case id -> case entry for what ``run`` names, and its hardware label (None: unknown).

    ``case`` names the case of a bundle (default: its cases as its run's baseline.json names
    them), a performance.log or a perf dump (default the file's stem). An empty mapping: nothing measured.

    Raises:
        OSError: ``run`` missing or unreadable.
        ValueError: unreadable input (RecordError, BaselineError name file and key).
    """
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
    if len(head) <= perfdump.MAX_DUMP_BYTES and perfdump.is_perf_dump(_json_or_none(head)):
        return {cid: bl.entry_from_records([perfdump.read_perf_dump(run).to_record()])}, None
    del head
    # a performance.log: streamed, one record at a time (raw fields dropped), strict UTF-8
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
    run: str | Path,
    baseline: str | Path,
    case: str | None = None,
    profile: str = "pr_test",
    strict: bool = False,
) -> tuple[list[Check], list[str]]:
    """What ``run`` names (:func:`compare_cases`) against the baseline file ``baseline``:
    (check rows, the overlap's first, :func:`perfkit.gate.baseline.check_overlap`'s warnings).

    Raises:
        OSError: a file missing or unreadable.
        ValueError: an unreadable input or baseline, a profile the baseline lacks, nothing
            measured in ``run`` (each message names the file).
    """
    ref = bl.load_baseline(baseline)
    cases, hardware = compare_cases(Path(run), case)
    if not cases:
        raise ValueError(f"no cases in {run} (no baseline.json, bundles nor records)")
    try:
        rows = bl.compare(cases, ref, profile=profile, strict=strict)
    except KeyError as exc:  # the profile is not in the file's tolerances: name the file
        raise bl.BaselineError(f"{baseline}: tolerances: {exc.args[0]}") from None
    except bl.BaselineError as exc:
        raise bl.BaselineError(f"{baseline}: {exc}") from None
    overlap, warnings = bl.check_overlap(cases, ref, source=str(baseline), run_hardware=hardware)
    return [*overlap, *rows], warnings

"""Measure without notebooks: run the enabled investigations of a params file into bundles.

For hosts that have only the library (a GPU box without the Jupyter stack)::

    python -m perfkit.measure --params params/h200.yaml --out DIR [--only cold_warm,warmup_shapes]

writes ``DIR/<scenario>/`` bundles (meta.json, parquet tables, records, logs) and
``DIR/measure.json`` (what ran, wall times, errors). The notebooks and the report then render
anywhere from those bundles (``perfkit suite --params ... --bundles DIR``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfkit.caps import MemoryCaps
from perfkit.client import VideoRequestSpec
from perfkit.engine import EngineSpec
from perfkit.params import SuiteParams, load_params
from perfkit.scenarios import cold_vs_warm, memory_budget, warmup_shapes

log = logging.getLogger("perfkit.measure")


def _caps(c) -> MemoryCaps | None:
    if c is None:
        return None
    d = c.model_dump() if hasattr(c, "model_dump") else dict(c)
    return MemoryCaps(device_gib=d.get("device_gib"), host_gib=d.get("host_gib"), label=d.get("label"))


def measure(params: SuiteParams, out: str | Path, only: list[str] | None = None, work_dir: str | Path | None = None,
            overhead_pairs: int = 0, two_stage_shapes: bool = False) -> dict[str, Any]:
    """Run the enabled investigations and save each bundle under ``out/<scenario>``.

    Args:
        params: validated suite parameters.
        out: bundle destination (kept small: no compile caches).
        only: restrict to these scenarios.
        work_dir: launch directories with logs and compile caches (default: a temp dir).
        overhead_pairs: measure the instrumentation cost in the cold_warm session.
        two_stage_shapes: also run warmup_shapes with the two-stage pipeline
            (bundle ``warmup_shapes_two_stage``).

    Returns:
        a summary ``{scenario: {"bundle": path, "wall_s": s, "error": str | None}}`` (also
        written to ``out/measure.json``). Scenario errors are logged and recorded, not raised.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="perfkit-measure-"))
    spec = EngineSpec.from_dict(dict(params.engine))
    req = VideoRequestSpec.from_dict(params.request.model_dump(exclude_none=True))
    jobs: list[tuple[str, Any]] = []
    if params.cold_warm.enabled:
        cw = params.cold_warm
        jobs.append(("cold_warm", lambda: cold_vs_warm(spec, req, repeats=cw.repeats, caps=_caps(cw.caps),
                                                       run_dir=work / "cold_warm", thresholds=cw.thresholds,
                                                       overhead_pairs=overhead_pairs)))
    if params.warmup_shapes.enabled:
        ws = params.warmup_shapes
        jobs.append(("warmup_shapes", lambda: warmup_shapes(spec, ws.warmup_frames, ws.request_frames, ws.repeats,
                                                            request=req, run_dir=work / "warmup_shapes")))
        if two_stage_shapes:
            two = dataclasses.replace(spec, two_stage=True)
            jobs.append(("warmup_shapes_two_stage",
                         lambda: warmup_shapes(two, ws.warmup_frames, ws.request_frames, ws.repeats, request=req,
                                               run_dir=work / "warmup_shapes_two_stage")))
    if params.memory_budget.enabled:
        mb = params.memory_budget
        jobs.append(("memory_budget", lambda: memory_budget(
            spec, [_caps(c) for c in mb.caps], request=req, repeats=mb.repeats, run_dir=work / "memory_budget",
            min_budget=mb.min_budget.model_dump() if mb.min_budget else None)))
    summary: dict[str, Any] = {}
    for name, job in jobs:
        if only and name not in only and name.split("_two_stage")[0] not in only:
            continue
        t0 = time.time()
        log.info("measuring %s", name)
        try:
            bundle = job()
            path = bundle.save(out / name)
            summary[name] = {"bundle": str(path), "wall_s": round(time.time() - t0, 1), "error": None}
        except Exception as exc:  # noqa: BLE001 - one failed investigation must not lose the others
            log.exception("%s failed", name)
            summary[name] = {"bundle": None, "wall_s": round(time.time() - t0, 1), "error": f"{type(exc).__name__}: {exc}"}
        (out / "measure.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfkit.measure", description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated scenarios")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--overhead-pairs", type=int, default=0)
    ap.add_argument("--two-stage-shapes", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        params = load_params(a.params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = measure(params, a.out, only=a.only.split(",") if a.only else None, work_dir=a.work_dir,
                      overhead_pairs=a.overhead_pairs, two_stage_shapes=a.two_stage_shapes)
    print(json.dumps(summary, indent=2))
    return 2 if any(v["error"] for v in summary.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

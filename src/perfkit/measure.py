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

from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.params import SuiteParams, load_params
from perfkit.scenarios import registry
from perfkit.scenarios.overhead import NAME as OVERHEAD
from perfkit.scenarios.registry import RunContext
from perfkit.scenarios.warmup_shapes import NAME as WARMUP_SHAPES

log = logging.getLogger("perfkit.measure")


def measure(
    params: SuiteParams,
    out: str | Path,
    only: list[str] | None = None,
    work_dir: str | Path | None = None,
    overhead_pairs: int = 0,
    two_stage_shapes: bool = False,
) -> dict[str, Any]:
    """Run the enabled investigations and save each bundle under ``out/<scenario>``.

    Args:
        params: validated suite parameters.
        out: bundle destination (kept small: no compile caches).
        only: restrict to these scenarios.
        work_dir: launch directories with logs and compile caches (default: a temp dir).
        overhead_pairs: > 0 enables the instrumentation-overhead scenario with this many pairs.
        two_stage_shapes: also run the warmup-shapes scenario with the two-stage pipeline
            (bundle ``<name>_two_stage``).

    Returns:
        a summary ``{scenario: {"bundle": path, "wall_s": s, "error": str | None}}`` (also
        written to ``out/measure.json``). Scenario errors are logged and recorded, not raised;
        a scenario whose bundle holds no usable measurement counts as an error.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="perfkit-measure-"))
    spec = EngineSpec.from_dict(dict(params.engine))
    req = VideoRequestSpec.from_dict(params.request.model_dump(exclude_none=True))
    jobs: list[tuple[str, Any, Any, Any]] = []
    for s in registry.all_scenarios():
        sec = params.section(s.name)
        if s.name == OVERHEAD and overhead_pairs > 0:
            sec = sec.model_copy(update={"enabled": True, "pairs": overhead_pairs})
        if not sec.enabled or (only and s.name not in only):
            continue
        jobs.append((s.name, s, sec, spec))
        if two_stage_shapes and s.name == WARMUP_SHAPES:
            jobs.append((f"{s.name}_two_stage", s, sec, dataclasses.replace(spec, two_stage=True)))
    summary: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    for name, s, sec, eng in jobs:
        t0 = time.time()
        log.info("measuring %s", name)
        try:
            ctx = RunContext(engine=eng, request=req, work_dir=work / name, shared=dict(shared))
            bundle = s.run(ctx, sec)
            path = bundle.save(out / name)
            shared.setdefault(s.name, bundle)
            s.check_bundle(bundle)
            summary[name] = {"bundle": str(path), "wall_s": round(time.time() - t0, 1), "error": None}
        except Exception as exc:  # noqa: BLE001 - one failed investigation must not lose the others
            log.exception("%s failed", name)
            summary[name] = {
                "bundle": None,
                "wall_s": round(time.time() - t0, 1),
                "error": f"{type(exc).__name__}: {exc}",
            }
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
    summary = measure(
        params,
        a.out,
        only=a.only.split(",") if a.only else None,
        work_dir=a.work_dir,
        overhead_pairs=a.overhead_pairs,
        two_stage_shapes=a.two_stage_shapes,
    )
    print(json.dumps(summary, indent=2))
    if not summary:
        print("error: nothing was measured (every investigation disabled or not selected)", file=sys.stderr)
        return 2
    return 2 if any(v["error"] for v in summary.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

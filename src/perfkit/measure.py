"""``python -m perfkit.measure``: a params file's investigations into bundles without notebooks,
for GPU hosts without the Jupyter stack (render elsewhere with ``perfkit suite --replay DIR``).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import click

from perfkit.common import jsonsafe
from perfkit.common.exitcodes import run_click
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.handle import EngineStartError
from perfkit.engine.owner import Watch, become_subreaper, describe
from perfkit.investigations import registry
from perfkit.investigations.registry import RunContext
from perfkit.measuring.progress import RunBars, planned_requests
from perfkit.params import SuiteParams, load_params, not_a_file
from perfkit.readings.sampler import pss_enabled

log = logging.getLogger("perfkit.measure")


def measure(
    params: SuiteParams,
    out: str | Path,
    only: list[str] | None = None,
    work_dir: str | Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the enabled investigations (of ``only``) into ``out/<investigation>``; ``options``: the
    measure options by Python name. Returns (and writes to ``out/measure.json``) ``{name: {bundle,
    wall_s, error}}``, a failure recorded there; ParamsError: ``only`` names a disabled one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="perfkit-measure-"))
    spec = params.engine_spec()
    req = VideoRequestSpec.from_dict(params.request.model_dump(exclude_none=True))
    jobs: list[tuple[str, Any, Any, Any]] = []
    for s in registry.all_investigations():
        if only and s.name not in only:
            continue
        mine: list[tuple[str, Any, Any]] = [("", params.section(s.name), spec)]
        for o in s.measure_options:
            if (options or {}).get(o.dest):
                mine = o.jobs(options[o.dest], mine[0][1], spec)
        jobs += [(s.name + suffix, s, sec, eng) for suffix, sec, eng in mine if sec.enabled]
    params.refuse_disabled([n for n in only or () if not any(j[1].name == n for j in jobs)])
    summary: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    plans = {name: s.plan(sec) for name, s, sec, _ in jobs}
    bars = RunBars(sys.stderr, *planned_requests(plans.values()))
    try:
        for name, s, sec, eng in jobs:
            t0 = time.time()
            log.info("measuring %s", name)
            watch = Watch.start()
            try:
                ctx = RunContext(engine=eng, request=req, work_dir=work / name, shared=dict(shared))
                with bars.listen(name, sum(plans[name])):
                    bundle = s.run(ctx, sec)
                path = bundle.save(out / name)
                shared.setdefault(s.name, bundle)
                s.check_bundle(bundle)
                summary[name] = {"bundle": str(path), "wall_s": round(time.time() - t0, 1), "error": None}
            except Exception as exc:  # noqa: BLE001 - one failed investigation must not lose the others
                known = isinstance(exc, (registry.InvestigationError, EngineStartError))
                (log.error if known else log.exception)("%s failed: %s", name, exc)
                error = f"{type(exc).__name__}: {exc}"
                summary[name] = {"bundle": None, "wall_s": round(time.time() - t0, 1), "error": error}
            finally:
                left = watch.reap(grace_s=eng.stop_grace_s)
            if left:
                summary[name]["error"] = "; ".join(x for x in (summary[name]["error"], describe(left)) if x)
            (out / "measure.json").write_text(jsonsafe.dumps(summary, indent=2))
    finally:
        bars.close()
    return summary


def investigations(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--only`` values (repeated, comma lists) -> names; click.BadParameter naming an unknown one."""
    names = tuple(n.strip() for v in values for n in v.split(",") if n.strip())
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise click.BadParameter(
            f"unknown investigation {', '.join(map(repr, unknown))}; known: {', '.join(registry.names())}"
        )
    return names


def _investigation_options(f: Any) -> Any:
    for _, o in reversed(registry.measure_options()):
        kind = {"is_flag": True} if o.is_flag else {"type": click.IntRange(min=o.minimum), "default": 0}
        f = click.option(o.flag, o.dest, help=o.help, show_default=not o.is_flag, **kind)(f)
    return f


@click.command(
    "measure",
    help="Run the enabled investigations of a params file into bundles, without notebooks "
    "(GPU hosts without the Jupyter stack).",
    epilog="Example: python -m perfkit.measure --params params/h200.yaml --out bundles/ "
    f"--only {','.join(registry.names()[:2])}. Exit codes: 0 every investigation measured, "
    "2 an error (bad params, nothing selected, an investigation without a usable measurement).",
)
@click.option(
    "--params",
    "params_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="params YAML (see params/)",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="bundle destination: OUT/<investigation>/ and OUT/measure.json",
)
@click.option(
    "--only",
    multiple=True,
    callback=lambda ctx, param, value: investigations(value),
    help=f"measure only this investigation (repeatable, or a comma list); one of {', '.join(registry.names())}",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="override one params key (value read as YAML; validated like the file); repeatable",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="launch directories with logs and compile caches (default: a temp dir)",
)
@_investigation_options
def measure_command(
    params_file: str,
    out: str,
    only: tuple[str, ...],
    sets: tuple[str, ...],
    work_dir: str | None,
    **options: Any,
) -> None:
    """The ``measure`` command (also ``perfkit measure``); exits with the code."""
    become_subreaper()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not Path(params_file).is_file():
        click.echo(f"error: params file {not_a_file(params_file)}: {params_file}", err=True)
        sys.exit(2)
    try:
        params = load_params(params_file, sets)
        pss_enabled()  # a bad PERFKIT_SAMPLER_PSS is refused before any launch
        summary = measure(params, out, only=list(only) or None, work_dir=work_dir, options=options)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(summary, indent=2))
    if not summary:
        click.echo("error: nothing was measured (every investigation disabled or not selected)", err=True)
        sys.exit(2)
    sys.exit(2 if any(v["error"] for v in summary.values()) else 0)


def main(argv: list[str] | None = None) -> int:
    """``python -m perfkit.measure``; returns the exit code."""
    return run_click(
        measure_command,
        list(sys.argv[1:] if argv is None else argv),
        "python -m perfkit.measure",
        process=argv is None,
    )


if __name__ == "__main__":
    raise SystemExit(main())

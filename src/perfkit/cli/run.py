"""``perfkit run``: one notebook with papermill (a thin wrapper over :func:`perfkit.lab.run_notebook`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from perfkit.cli._common import EXIT_CODES, done, fail, file_option
from perfkit.common.exitcodes import EXIT_ERROR


@click.command(
    "run",
    epilog="Example: perfkit run notebooks/NOTEBOOK.ipynb -p repeats=3 -p run_dir=outputs/try. " + EXIT_CODES,
)
@click.argument("notebook")
@click.option(
    "-p",
    "p",
    multiple=True,
    metavar="KEY=VALUE",
    help="a notebook parameter (value read as YAML; validated before the kernel starts); repeatable",
)
@file_option("--params", kind="params file", help="take the notebook's parameters from a params YAML first")
@click.option("--out", default=None, help="executed notebook path (default RUN_DIR/notebooks/NAME)")
@click.option("--timeout", type=float, default=None, help="per-cell timeout (s)")
def run_command(
    notebook: str, p: tuple[str, ...], params: str | None, out: str | None, timeout: float | None
) -> None:
    """Run one notebook with papermill (its parameters validated by the same models as a params file)."""
    from perfkit.gate.verdicts import exit_code, verdict_line
    from perfkit.lab import RunInputError, run_notebook

    try:
        run = run_notebook(notebook, params, p, out, timeout)
    except RunInputError as exc:
        done(fail(str(exc)))
    r, v, nb = run.result, run.verdict, Path(notebook)
    print(f"{nb.name}: gate {run.word} in {r.wall_s:.1f} s -> {run.out}")
    if v is not None:
        print(f"  {verdict_line(nb.stem, v)}")
    if r.error:
        print(f"  {r.error}", file=sys.stderr)
        done(EXIT_ERROR)
    done(exit_code(run.word, v))

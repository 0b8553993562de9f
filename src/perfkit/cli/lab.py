"""``perfkit lab``: JupyterLab on a run's executed notebooks, or on notebooks bound to bundles."""

from __future__ import annotations

import sys
from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, done, fail
from perfkit.common.exitcodes import EXIT_OK
from perfkit.measure import investigations


@click.command(
    "lab",
    epilog="Examples: perfkit lab outputs/ci-cpu/latest; perfkit lab --replay examples/h200/bundles. "
    + EXIT_CODES,
)
@click.argument("run", required=False)
@click.option(
    "--replay",
    default=None,
    metavar="DIR",
    help="fresh copies of the investigation notebooks bound to the bundles in DIR (launches nothing)",
)
@click.option(
    "--dir", "dir", help="the lab directory (default outputs/lab/<time>); must be outside the tracked tree"
)
@click.option(
    "--only",
    multiple=True,
    callback=lambda ctx, param, value: investigations(value),
    help="with --replay: only this investigation (repeatable)",
)
@click.option("--no-execute", is_flag=True, help="with --replay: copy and bind the notebooks, run none")
@click.option("--no-browser", is_flag=True, help="start JupyterLab without opening a browser")
@click.option("--no-launch", is_flag=True, help="prepare the notebooks and print the JupyterLab command only")
def lab_command(**kw: Any) -> None:
    """Open JupyterLab on a run's executed notebooks, or on notebooks bound to recorded bundles,
    outside the tracked tree (the tracked notebooks/ are never opened or saved)."""
    from perfkit.lab import LabError, launch, prepare_replay, prepare_run, replay_names
    from perfkit.lab import lab_command as jupyter_command

    run, replay, lab_dir, only, no_execute = (kw[k] for k in ("run", "replay", "dir", "only", "no_execute"))
    if bool(run) == bool(replay):
        done(fail("give a run directory or --replay DIR (one of them)", prefix="perfkit lab"))
    try:
        if replay:
            names = replay_names(replay, only or None)  # checked before anything is said or written
            if not no_execute:
                print(f"perfkit lab: executing {', '.join(names)} on {replay} …", file=sys.stderr)
            lab = prepare_replay(replay, lab_dir, only=only or None, execute=not no_execute)
        else:
            lab = prepare_run(run, lab_dir)
        for nb in lab.notebooks:
            ran = f"executed in {lab.executed[nb.stem]:.1f} s" if nb.stem in lab.executed else "as saved"
            err = f" (raised {lab.errors[nb.stem]})" if nb.stem in lab.errors else ""
            print(f"  {nb.name:22s} {ran}{err}")
        print(f"perfkit lab: {len(lab.notebooks)} notebooks in {lab.dir}")
        if kw["no_launch"]:
            print("  open them with: " + " ".join(jupyter_command(lab, not kw["no_browser"])))
            done(EXIT_OK)
        done(launch(lab, not kw["no_browser"]))
    except LabError as exc:
        done(fail(str(exc), prefix="perfkit lab"))

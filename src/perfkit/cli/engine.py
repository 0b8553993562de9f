"""``perfkit engine serve``: the reference engine (``python -m perfkit.refengine``), exec'd."""

from __future__ import annotations

import os
import sys

import click


@click.group("engine")
def engine_group() -> None:
    """Engines."""


@engine_group.command(
    "serve",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    epilog="Every argument goes to the reference engine (python -m perfkit.refengine); "
    "`perfkit engine serve --help` prints the engine's own options.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def engine_serve_command(args: tuple[str, ...]) -> None:
    """Run the reference engine (sglang serve's flags: --model-path, --port, --num-gpus, ...)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "perfkit.refengine", *args])

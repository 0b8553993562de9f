"""The ``perfkit`` command (click): one module per command or group, named in :data:`COMMANDS`;
exit codes: :mod:`perfkit.common.exitcodes`. Adding a command: docs/DESIGN.md, "Adding a command"."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from perfkit.cli._common import EXIT_CODES
from perfkit.common import MissingExtra, require_extra
from perfkit.common.exitcodes import EXIT_ERROR, run_click

#: each command's module and attribute, imported when the command runs or ``--help`` lists it
COMMANDS = {
    "suite": "perfkit.cli.suite:suite_command",
    "merge": "perfkit.cli.merge:merge_command",
    "run": "perfkit.cli.run:run_command",
    "lab": "perfkit.cli.lab:lab_command",
    "report": "perfkit.cli.report:report_command",
    "figures": "perfkit.cli.figures:figures_command",
    "compare": "perfkit.cli.compare:compare_command",
    "baseline": "perfkit.cli.baseline:baseline_group",
    "wheelhouse": "perfkit.cli.wheelhouse:wheelhouse_group",
    "engine": "perfkit.cli.engine:engine_group",
    "ab": "perfkit.cli.ab:ab_command",
    "bisect": "perfkit.cli.bisect:bisect_command",
    "history": "perfkit.cli.history:history_group",
    "measure": "perfkit.measure:measure_command",
}
#: the optional stack a command needs whole, checked before it runs (not for ``--help``)
COMMAND_EXTRAS = {"history": "history"}


class LazyGroup(click.Group):
    """A click group whose commands are imported by name from :data:`COMMANDS` when first used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[Any, ...]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if name in COMMAND_EXTRAS and not set(rest) & set(ctx.help_option_names):
            try:
                require_extra(COMMAND_EXTRAS[name], f"perfkit {name}")
            except MissingExtra as exc:
                click.echo(f"perfkit: {exc}", err=True)
                ctx.exit(EXIT_ERROR)
        return name, cmd, rest


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Examples:\n\n"
    "\b\n"
    "  perfkit suite --params params/ci-cpu.yaml\n"
    "  perfkit suite --params params/h200.yaml --replay examples/h200/bundles\n"
    "  perfkit compare --run outputs/ci-cpu/latest --baseline baselines/h200.json\n"
    "  perfkit run notebooks/NOTEBOOK.ipynb -p repeats=3\n\n" + EXIT_CODES,
)
@click.option("-v", "--verbose", count=True, help="more logging (-vv: debug)")
def cli(verbose: int) -> None:
    """perfkit: performance investigations of diffusion video serving engines."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (SIGINT, SIGTERM, a missing optional stack: 2)."""
    # jsonschema imports rfc3987_syntax only for "iri" formats nbformat never uses: 0.8 s of CPU
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    try:
        return run_click(cli, list(sys.argv[1:] if argv is None else argv), "perfkit", process=argv is None)
    except MissingExtra as exc:
        print(f"perfkit: {exc}", file=sys.stderr)
        return EXIT_ERROR

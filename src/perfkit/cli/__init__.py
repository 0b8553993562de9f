"""The perfkit command: run, gate and report diffusion video serving investigations.

One command line (click) for every task; ``perfkit COMMAND --help`` describes each option.
Exit codes, one rule for every command: 0 pass, 1 a regression or a failed check, 2 an error or
misuse (bad input, a missing file, nothing comparable, a run that never started).

One module per command (or command group), each a thin wrapper over one library call; a new
command goes in ``perfkit/cli/<command>.py`` and is added to the group here.
"""

from __future__ import annotations

import logging
import sys

import click

from perfkit.cli._common import EXIT_CODES
from perfkit.cli.ab import ab_command
from perfkit.cli.baseline import baseline_group
from perfkit.cli.bisect import bisect_command
from perfkit.cli.compare import compare_command
from perfkit.cli.engine import engine_group
from perfkit.cli.figures import figures_command
from perfkit.cli.history import history_group
from perfkit.cli.lab import lab_command
from perfkit.cli.merge import merge_command
from perfkit.cli.report import report_command
from perfkit.cli.run import run_command
from perfkit.cli.suite import suite_command
from perfkit.cli.wheelhouse import wheelhouse_group
from perfkit.gate.verdicts import EXIT_ERROR, EXIT_OK
from perfkit.measure import measure_command

__all__ = ["EXIT_CODES", "cli", "main"]


@click.group(
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


for _command in (
    suite_command, merge_command, run_command, lab_command, report_command, figures_command,
    compare_command, baseline_group, wheelhouse_group, engine_group, ab_command, bisect_command,
    history_group, measure_command,
):  # fmt: skip
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (also for ``perfkit`` itself)."""
    try:
        cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="perfkit", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    return EXIT_OK

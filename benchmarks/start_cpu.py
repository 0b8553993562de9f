"""CPU a notebook kernel's import cells and a `perfkit` command spend before doing anything.

Every `perfkit suite` runs each investigation notebook in a fresh ipykernel, and the tests start
~150 of them plus many `perfkit ...` subprocesses, so import time is paid hundreds of times a
`make test` (issue 32's 15-minute budget). This prints, for each case, the user+sys CPU of a fresh
interpreter (best of --repeats) and, for the notebook cells, the `-X importtime` total and the
heavy libraries they import (none of matplotlib, httpx, jinja2, scipy is needed before a figure
is drawn, a request sent, HTML rendered or a test run):

- `notebook imports`: the import lines of the investigation notebooks' first cells
  (notebooks/make_notebooks.py's SETUP and the bind cell);
- `perfkit --help`, `perfkit merge --help`, `perfkit suite --help`, `perfkit compare --help`,
  `perfkit ab --help`: a command's start (the group imports a command's module when it runs).

    PYTHONPATH=src python benchmarks/start_cpu.py [--repeats 5]

Measured on the 2-core dev machine (shared, so ±20 %), bytecode cached, best of 5, before ->
after the import deferrals: notebook imports 1.20 -> 0.71 s CPU (importtime 805 -> 495 ms);
`perfkit merge --help` 0.79 -> 0.07 s, `compare --help` 0.74 -> 0.05 s, `ab --help` 0.75 ->
0.05 s; `perfkit --help` and `suite --help` ~0.8-1.0 s both (they import the investigations' registry).
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys

NOTEBOOK_IMPORTS = """\
from perfkit.nbparams import bind
import pandas as pd
from perfkit.bundle import table_rows
from perfkit.checks import check_table
from perfkit.gate import run as gate_run
from perfkit.gate import verdicts
from perfkit.gate.verdicts import finish
from perfkit.readings.stages import REFINEMENT, stage_class
from perfkit.report import plots, reading, show, summary_frame, tables
from perfkit.report.tables import check_frame, replay_markdown, show_table
from perfkit.investigations.registry import load_or_run
"""
HEAVY = ("matplotlib", "httpx", "jinja2", "scipy", "torch", "papermill")
COMMANDS = [[], ["merge"], ["suite"], ["compare"], ["ab"]]


def cpu_s(argv: list[str]) -> float:
    """User+sys CPU seconds of one run of ``argv`` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def importtime_ms(code: str) -> float:
    """The ``-X importtime`` total of ``code``: the cumulative times of the top-level imports, ms."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    ).stderr
    rows = re.findall(r"import time:\s+\d+ \|\s+(\d+) \| (\S)", err)
    return sum(int(cum) for cum, _ in rows) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs a case; the best is printed")
    args = ap.parse_args()

    def best(argv: list[str]) -> float:
        return min(cpu_s(argv) for _ in range(args.repeats))

    py = [sys.executable, "-c"]
    cpu_s([*py, NOTEBOOK_IMPORTS])  # warm the bytecode caches once
    heavy = subprocess.run(
        [*py, NOTEBOOK_IMPORTS + f"import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    tt = min(importtime_ms(NOTEBOOK_IMPORTS) for _ in range(min(3, args.repeats)))
    print(
        f"notebook imports        {best([*py, NOTEBOOK_IMPORTS]):5.2f} s CPU   importtime {tt:6.0f} ms   heavy: {heavy}"
    )
    for cmd in COMMANDS:
        argv = [sys.executable, "-m", "perfkit.cli", *cmd, "--help"]
        print(f"perfkit {' '.join([*cmd, '--help']):16s} {best(argv):5.2f} s CPU")


if __name__ == "__main__":
    main()

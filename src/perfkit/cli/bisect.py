"""``perfkit bisect``: the first bad engine commit, an A/B against the good one at each probe."""

from __future__ import annotations

from typing import Any

import click

from perfkit.cli.ab import probe_options, probe_run


@click.command(
    "bisect",
    epilog="Exit codes: 0 the first bad commit found; 1 not reproduced (the bad commit is no regression"
    " against the good one); 2 bad input, or the search could not decide (the range left and the"
    " probes that failed or stayed undecided are named).",
)
@click.option("--good", required=True, help="a commit without the regression")
@click.option("--bad", required=True, help="a later commit with it")
@click.option("--metric", default="DenoisingStage", show_default=True, help="the A/B metric that decides")
@probe_options
def bisect_command(**kw: Any) -> None:
    """The first bad commit between --good and --bad: an A/B against --good at each probe."""
    from perfkit.bisect.search import run_bisect

    probe_run("bisect", run_bisect, kw, kw["repo"], kw["good"], kw["bad"])

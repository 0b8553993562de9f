"""``perfkit merge``: join ``perfkit suite --partition`` shards into one run (replay, gate, report)."""

from __future__ import annotations

from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, done, fail, file_option, print_result


@click.command("merge", epilog=EXIT_CODES + " A missing shard or a failed unit is an error (2).")
@click.argument("dirs", nargs=-1, required=True)
@click.option("--out", required=True, help="the merged run directory")
@file_option(
    "--params", kind="params file", help="params YAML the shards must have run (default: the shards' own)"
)
@click.option("--notebooks", default=None, hidden=True, help="another notebooks folder (tests)")
@click.option("--force", is_flag=True, help="--out may hold an earlier run: its outputs are removed first")
@click.option(
    "--allow-mixed-commits",
    is_flag=True,
    help="merge shards measured at different commits (each unit's commit is shown); otherwise an error (2)",
)
@click.option("--no-screenshot", is_flag=True, help="skip the report screenshot")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar")
def merge_command(**kw: Any) -> None:
    """Join the outputs of perfkit suite --partition shards into one run: notebooks (replay),
    gate, report."""
    from perfkit.engine.owner import become_subreaper

    become_subreaper()  # orphans below come back here
    from perfkit.params import ParamsError
    from perfkit.suite import merge_runs
    from perfkit.suite.execute import SuiteError

    try:
        res = merge_runs(
            kw["dirs"], kw["out"], params_path=kw["params"], notebooks=kw["notebooks"],
            screenshot=not kw["no_screenshot"], progress=not kw["quiet"], force=kw["force"],
            allow_mixed_commits=kw["allow_mixed_commits"],
        )  # fmt: skip
    except (ParamsError, SuiteError, FileNotFoundError) as exc:
        done(fail(str(exc)))
    done(print_result(res, "perfkit merge"))

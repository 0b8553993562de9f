"""``perfkit figures``: regenerate the figure blocks of Markdown files from their bundles."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK


@click.command("figures")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--root",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="directory the blocks' src= paths are relative to (default: the perfkit checkout)",
)
@click.option("--check", is_flag=True, help="change nothing; exit 1 when a block differs from its bundles")
def figures_command(files: tuple[str, ...], root: str | None, check: bool) -> None:
    """Regenerate the '<!-- perfkit:figures src=DIR kind=KIND -->' blocks of Markdown FILES
    from the bundles under DIR (figures in docs come from the data).

    \b
    KIND: key-numbers, full (a bundle's key numbers / all its figures),
    compare (vs=DIR2: two bundles side by side), ab-power (a recorded A/B power
    pool; attributes threshold=0.01 confidence=0.95), overhead-pooled
    (src=DIR1,DIR2,...: the overhead scenario's ABBA pairs of several launches).

    Exit codes: 0 up to date (or rewritten), 1 --check found a stale block, 2 a bad block or a
    src without results."""
    from perfkit.common.provenance import repo_root
    from perfkit.report.figures import FiguresError, update_file

    base = Path(root) if root else repo_root()
    stale = []
    try:  # every file is rendered before any is written: one bad block leaves all files as they were
        stale = [f for f in files if update_file(f, base, check=True)]
        if not check:
            for f in stale:
                update_file(f, base)
    except (FiguresError, OSError, ValueError) as exc:
        click.echo(f"perfkit figures: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    for f in files:
        if f in stale:
            click.echo(f"{f}: {'stale (differs from its bundles)' if check else 'regenerated'}")
        else:
            click.echo(f"{f}: up to date")
    sys.exit(1 if check and stale else EXIT_OK)

"""``perfkit history add|import|check|changes|confirm|site``: performance history across commits
(:mod:`perfkit.history.check`, :func:`perfkit.bisect.search.run_confirm`, the history site)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from perfkit.cli._common import COMMIT_URL, EXIT_CODES, STORE, done, fail, ranged
from perfkit.cli.ab import probe_options, probe_run


@click.group(
    "history",
    epilog="Examples:\n\n\b\n"
    "  perfkit history import tests/fixtures/sglang-nightly --hardware H100\n"
    "  perfkit history add outputs/ci-cpu/latest\n"
    "  perfkit history check outputs/ci-cpu/latest --out outputs/history-check\n"
    "  perfkit history changes --case qwen_image_2512_t2i_1024 --json\n"
    "  perfkit history site outputs/history-site\n"
    "  perfkit history confirm tiny-cpu/DenoisingStage_ms 1 --repo ../engine --spec spec.yaml\n\n"
    + EXIT_CODES,
)
def history_group() -> None:
    """Performance history across commits: a store, change points, a gate, an offline site."""


def _history_call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run a history library call; bad input exits 2 with one line naming file and key."""
    from perfkit.history.store import HistoryError

    try:
        return fn(*args, **kw)
    except (HistoryError, OSError) as exc:
        done(fail(str(exc), prefix="perfkit history"))


def _added(res: Any) -> None:
    click.echo(f"{len(res.added)} run(s) added, {len(res.skipped)} already stored")


@history_group.command("add", epilog=EXIT_CODES)
@click.argument("runs", nargs=-1, required=True)
@STORE
@click.option("--commit", default=None, help="commit measured (default: the bundles' git_commit)")
@click.option("--hardware", default=None, help="hardware label (default: what the run says)")
def history_add(runs: tuple[str, ...], store: str, commit: str | None, hardware: str | None) -> None:
    """Store perfkit RUNS: suite or merged runs (baseline.json), A/B outputs (each side), bundles."""
    from perfkit.history.check import add

    _added(_history_call(add, store, runs, commit=commit, hardware=hardware))


@history_group.command(
    "import",
    epilog=EXIT_CODES
    + " Examples: perfkit history import tests/fixtures/sglang-nightly --hardware H100; perfkit history "
    "import ../sglang --baselines python/sglang/multimodal_gen/test/server/perf_baselines/h100.json.",
)
@click.argument("path")
@STORE
@click.option("--hardware", help="hardware of these runs (required for nightly files: they do not say)")
@click.option(
    "--baselines",
    "baselines",
    default=None,
    help="PATH is a git repository: import every committed version of this perf_baselines file in it",
)
def history_import(path: str, store: str, hardware: str | None, baselines: str | None) -> None:
    """Store sglang's nightly comparison files (a directory, a file or a ci-data-diffusion
    checkout), or with --baselines a perf_baselines file's versions across git history (a
    version that cannot be read is skipped with a note naming its commit)."""
    from perfkit.history.check import import_baselines, import_nightly

    if baselines:
        res, skipped = _history_call(import_baselines, store, path, baselines, hardware=hardware)
        for note in skipped:
            fail(note, prefix="perfkit history")
        n = len(res.added) + len(res.skipped)
        click.echo(f"{n} version(s) imported, {len(skipped)} skipped")
        _added(res)
        return
    if not hardware:
        msg = "nightly comparison files do not name their hardware; give --hardware"
        done(fail(msg, prefix="perfkit history import"))
    _added(_history_call(import_nightly, store, path, hardware=hardware))


@history_group.command(
    "check",
    epilog="Exit codes: 0 no regression step, 1 a regression step, 2 bad input or nothing compared.",
)
@click.argument("run")
@STORE
@click.option(
    "--out",
    "out",
    default=None,
    help="directory for summary.md (default: RUN/history/, for a file outputs/history-check/<name>/)",
)
@click.option("--hardware", default=None, help="hardware label (needed for a nightly comparison file)")
@click.option("--commit", default=None, help="commit measured (default: the bundles' git_commit)")
@COMMIT_URL
@ranged(
    "--confirm",
    click.IntRange(1, 5),
    2,
    "runs in a row above the level that make a regression (the first only warns; 1: alarm at once)",
)
@ranged("--min-step", click.FloatRange(0, 1), 0.05, "smallest step judged (fraction)")
@click.option("-q", "--quiet", is_flag=True, help="do not print summary.md")
def history_check(
    run: str, store: str, out: str | None, quiet: bool, confirm: int, min_step: float, **kw: Any
) -> None:
    """Is RUN (a perfkit run or a nightly comparison file) a new step against its series?"""
    from perfkit.history import changepoints as cp
    from perfkit.history.check import check

    kw["settings"] = cp.Settings(confirm_runs=confirm, min_step=min_step)
    res, summary = _history_call(check, store, run, out or None, **kw)  # hardware, commit, commit_url
    if not quiet:
        click.echo(summary.read_text())
    click.echo(f"summary: {summary}")
    done(res.exit_code)


@history_group.command("changes", epilog="Exit codes: 0 listed, 2 bad input or no series stored.")
@STORE
@click.option("--hardware", default=None, help="only this hardware's series")
@click.option("--case", default=None, help="only this case's series")
@click.option("--json", "as_json", is_flag=True, help="print JSON (steps, events) instead of the tables")
def history_changes(store: str, hardware: str | None, case: str | None, as_json: bool) -> None:
    """List every change point (commit range, levels, change with its 95 % interval) and event."""
    import json

    from perfkit.history.check import changes_table, store_changes

    data = _history_call(store_changes, store, hardware=hardware, case=case)
    click.echo(json.dumps(data, indent=1) if as_json else changes_table(data))


@history_group.command(
    "confirm",
    epilog="Exit codes: 0 confirmed; 1 not reproduced or undecided; 2 bad input or an error (a build, a launch).",
)
@click.argument("series")
@click.argument("change")
@STORE
@click.option("--hardware", default=None, help="the series' hardware (when stored for several)")
@click.option(
    "--metric", help="the A/B metric (default: the series', e.g. DenoisingStage_ms -> DenoisingStage)"
)
@probe_options
def history_confirm(series: str, change: str, **kw: Any) -> None:
    """A/B the commits on either side of step CHANGE (its number, or a commit) of SERIES (CASE/METRIC)."""
    from perfkit.bisect.search import run_confirm

    more = {"metric": kw["metric"], "hardware": kw["hardware"]}
    probe_run("confirm", run_confirm, kw, kw["store"], series, change, kw["repo"], **more)


@history_group.command("site", epilog=EXIT_CODES)
@click.argument("out")
@STORE
@COMMIT_URL
def history_site(out: str, store: str, commit_url: str | None) -> None:
    """Write the offline history site to OUT/ (index.html, one page per hardware)."""
    from perfkit.report.history_site import write_site

    pages = _history_call(write_site, store, out, commit_url=commit_url)
    click.echo(f"{len(pages)} page(s): {Path(out) / 'index.html'}")

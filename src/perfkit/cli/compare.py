"""``perfkit compare``: a run against a baseline file (sglang's rule), or two sglang perf dumps."""

from __future__ import annotations

import sys
from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, done, fail, file_option
from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION


def _compare_dumps(before: str, after: str) -> int:
    from perfkit.readings import perfdump

    try:
        b, a = perfdump.read_perf_dump(before), perfdump.read_perf_dump(after)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    c = perfdump.compare_dumps(b, a)
    print(perfdump.dump_comparison_markdown(c))
    if c.verdict == "error":
        return fail(
            f"nothing comparable between {before} and {after} (no E2E and no stage measured on both sides)"
        )
    for r in c.regressions:
        print(f"regression: {r.name} {r.before:.2f} ms -> {r.after:.2f} ms", file=sys.stderr)
    print(f"compare: {c.verdict.upper()}")
    return EXIT_REGRESSION if c.verdict == "fail" else EXIT_OK


def _compare(run: str, baseline: str, case: str | None, profile: str, strict: bool) -> int:
    from perfkit.checks import check_table, overall_status
    from perfkit.gate.run import compare_run
    from perfkit.gate.verdicts import nothing_compared
    from perfkit.report.tables import markdown_table

    try:
        rows, warnings = compare_run(run, baseline, case, profile, strict)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    df = check_table(rows)
    none = nothing_compared(df)
    for w in warnings:
        fail(f"{'error' if none else 'warning'}: {w}")
    shown = df.astype(object).where(df.notna(), "–")  # not measured: "–", never 0
    print(markdown_table(shown, checks=True) + "\n")
    status = overall_status(df)
    if none or status == "skipped":
        print(f"compare: ERROR: nothing compared (no case of {run} is in {baseline})")
        return EXIT_ERROR
    compared = any(r.status in ("pass", "fail", "improved") and r.metric != "metrics compared" for r in rows)
    if not compared and any(r.reason.endswith("every metric was skipped") for r in rows):
        print(f"compare: ERROR: nothing compared (every metric of {baseline} for {run} is null or skipped)")
        return EXIT_ERROR
    print(f"compare: {status.upper()}")
    return EXIT_REGRESSION if status == "fail" else EXIT_OK


@click.command(
    "compare",
    epilog="Examples: perfkit compare --run outputs/RUN --baseline baselines/h200.json; "
    "perfkit compare --before before.json --after after.json. "
    + EXIT_CODES
    + " Nothing in common with the baseline is an error (2).",
)
@click.option(
    "--run", help="a run directory, a bundle directory, a performance.log or an sglang perf dump JSON"
)
@file_option("--baseline", kind="baseline file", help="baseline JSON (sglang perf_baselines layout)")
@click.option(
    "--case",
    default=None,
    help="case id for a bundle, performance.log or perf dump (default: the bundle's "
    "investigation / the file's stem)",
)
@click.option("--profile", default="pr_test", show_default=True, help="tolerance profile of the baseline")
@click.option("--strict", is_flag=True, help="a case missing from the baseline fails instead of being 'new'")
@file_option(
    "--before", kind="perf dump", help="sglang perf dump JSON (--perf-dump-path) of the reference build"
)
@file_option("--after", kind="perf dump", help="sglang perf dump JSON of the changed build")
def compare_command(**kw: Any) -> None:
    """Compare a run with a baseline file (sglang's rule), or two sglang perf dumps."""
    run, baseline, before, after = kw["run"], kw["baseline"], kw["before"], kw["after"]
    if before or after:
        if not (before and after) or run or baseline:
            done(fail("compare takes --before A.json --after B.json, or --run and --baseline"))
        done(_compare_dumps(before, after))
    if not (run and baseline):
        done(fail("compare needs --run and --baseline (or --before and --after)"))
    done(_compare(run, baseline, kw["case"], kw["profile"], kw["strict"]))

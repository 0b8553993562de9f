"""``perfkit report``: re-render a run directory's report.html and summary.md."""

from __future__ import annotations

from pathlib import Path

import click

from perfkit.cli._common import EXIT_CODES, done, fail
from perfkit.common.exitcodes import EXIT_OK


@click.command("report", epilog=EXIT_CODES)
@click.argument("run")
@click.option("--out", default=None, help="HTML path (default RUN/report.html)")
@click.option("--screenshot", is_flag=True, help="also save RUN/report.png (needs chromium)")
def report_command(run: str, out: str | None, screenshot: bool) -> None:
    """Re-render report.html and summary.md of a run directory."""
    from perfkit import report
    from perfkit.gate.verdicts import notebooks as notebook_names

    d = Path(run)
    if not d.is_dir():
        done(fail(f"{d} is not a run directory"))
    if not (d / "run.json").exists() and not any((d / n / "verdict.json").exists() for n in notebook_names()):
        done(fail(f"{d} is not a run directory (no run.json and no verdict.json)"))
    try:
        report.write_summary(d)
        html = report.render_report(d, out)
    except (OSError, ValueError) as exc:
        done(fail(str(exc)))
    print(f"report: {html}")
    if screenshot:
        try:
            print(f"screenshot: {report.screenshot(html, d / 'report.png')}")
        except Exception as exc:  # noqa: BLE001
            fail(f"no screenshot: {exc}")
    done(EXIT_OK)

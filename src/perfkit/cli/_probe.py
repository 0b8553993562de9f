"""The options and the run ``perfkit bisect`` and ``perfkit history confirm`` share (A/B probes
of engine commits, :func:`perfkit.bisect.api.make_setup`)."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from perfkit.cli._common import done
from perfkit.common.exitcodes import EXIT_ERROR


def probe_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``perfkit bisect`` and ``perfkit history confirm`` share (perfkit.bisect.api.make_setup)."""
    opts = [
        click.option(
            "--repo", default=".", show_default=True, help="the engine's git repository (never checked out)"
        ),
        click.option(
            "--spec",
            required=True,
            metavar="FILE",
            help="engine spec YAML or params file; {checkout} = the probe",
        ),
        click.option(
            "--python-path",
            default=None,
            metavar="DIR",
            help="Python overlay: checkout/DIR first on PYTHONPATH",
        ),
        click.option("--build", default=None, metavar="CMD", help="shell command run in each checkout first"),
        click.option(
            "--build-timeout",
            type=click.FloatRange(min=1),
            default=3600,
            show_default=True,
            help="seconds a --build may run; longer is that probe's error",
        ),  # fmt: skip
        click.option(
            "-n",
            "--launches",
            type=click.IntRange(2, 100),
            default=2,
            show_default=True,
            help="launches a side a probe before the A/B's first look (as perfkit ab -n)",
        ),
        click.option(
            "--max-launches",
            type=click.IntRange(2, 100),
            default=6,
            show_default=True,
            help="launches a side a probe at most; still inconclusive: the probe is undecided (skipped)",
        ),
        click.option(
            "-m",
            "--warm",
            type=click.IntRange(1, 1000),
            default=3,
            show_default=True,
            help="warm requests a launch",
        ),
        click.option(
            "--threshold", default="5%", show_default=True, help="a regression is an interval above it"
        ),
        click.option("--out", default=None, help="output directory (default outputs/<command>/<timestamp>)"),
        click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def probe_run(kind: str, fn: Callable[..., Any], kw: dict[str, Any], *args: Any, **more: Any) -> None:
    """Build the probe setup from ``kw``, run ``fn(*args, setup, out, **more)``, print, exit."""
    from perfkit.ab.options import AbInputError, parse_fraction, parse_gate_metrics
    from perfkit.bisect.api import make_setup, out_dir
    from perfkit.bisect.checkout import BisectError
    from perfkit.history.store import HistoryError

    try:
        metric = (parse_gate_metrics(kw["metric"], "--metric") or [None])[0] if kw.get("metric") else None
        threshold = parse_fraction(kw["threshold"], "--threshold")
    except AbInputError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    try:
        setup = make_setup(
            kw["spec"], metric=metric, python_path=kw["python_path"], build=kw["build"],
            min_launches=kw["launches"], max_launches=kw["max_launches"],
            threshold=threshold, warm=kw["warm"], build_timeout_s=kw["build_timeout"],
        )  # fmt: skip
        from perfkit.engine.owner import become_subreaper

        become_subreaper()  # orphans below come back here
        if "metric" in more:  # confirm: the series' own metric unless --metric
            more["metric"] = metric
        code, summary = fn(*args, setup, out_dir(kw["out"], kind), **more)
    except (BisectError, HistoryError) as exc:
        command = "history confirm" if kind == "confirm" else kind  # its outputs: outputs/confirm/
        click.echo(f"perfkit {command}: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    if not kw["quiet"]:
        click.echo(summary.read_text())
    click.echo(f"summary: {summary}")
    done(code)

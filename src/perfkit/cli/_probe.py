"""The options and the run ``perfkit bisect`` and ``perfkit history confirm`` share (A/B probes
of engine commits, :func:`perfkit.bisect.bisect_command.make_setup`); the A/B's decision options are
``perfkit ab``'s own (:func:`perfkit.cli._ab_options.decision_options`)."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from perfkit.cli._ab_options import apply_options, decision_options, read_decision
from perfkit.cli._common import done
from perfkit.common.exitcodes import EXIT_ERROR

_PROBE_OPTIONS = [
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
]


def probe_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``perfkit bisect`` and ``perfkit history confirm`` share (perfkit.bisect.bisect_command.make_setup):
    the probe's build, then ``perfkit ab``'s decision options (a probe: 2 to 6 launches a side, 3 warm
    requests; still inconclusive at the maximum, the probe is undecided and skipped)."""
    more = [
        click.option("--out", default=None, help="output directory (default outputs/<command>/<timestamp>)"),
        click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
    ]
    return apply_options(f, _PROBE_OPTIONS + decision_options(2, 6, 3, replay=False) + more)


def probe_run(kind: str, fn: Callable[..., Any], kw: dict[str, Any], *args: Any, **more: Any) -> None:
    """Build the probe setup from ``kw``, run ``fn(*args, setup, out, **more)``, print, exit."""
    from perfkit.ab.ab_command import AbInputError, parse_gate_metrics
    from perfkit.bisect.bisect_command import make_setup, out_dir
    from perfkit.bisect.checkout import BisectError
    from perfkit.history.store import HistoryError
    from perfkit.stats import DEFAULT_THRESHOLD

    try:
        metric = (parse_gate_metrics(kw["metric"], "--metric") or [None])[0] if kw.get("metric") else None
        design, threshold, thresholds = read_decision(kw)
    except AbInputError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    try:
        setup = make_setup(
            kw["spec"], metric=metric, python_path=kw["python_path"], build=kw["build"], design=design,
            threshold=threshold or DEFAULT_THRESHOLD, thresholds=thresholds, warm=kw["warm"],
            build_timeout_s=kw["build_timeout"],
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

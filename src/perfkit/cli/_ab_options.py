"""The options of ``perfkit ab`` and their help; its decision options (:func:`decision_options`)
are shared with ``perfkit bisect`` and ``perfkit history confirm`` (:func:`probe_options`,
:func:`probe_run`), whose probes are A/Bs of engine commits."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from perfkit.cli._common import done
from perfkit.common.exitcodes import EXIT_ERROR


def decision_options(launches: int, max_launches: int, warm: int, replay: bool) -> list[Any]:
    """How an A/B runs and decides: ``--paired``, ``-n``, ``--max-launches``, ``--slow-spells``,
    ``--spending``, ``-m``, ``--threshold``, ``--threshold-from``, ``--confidence``. The defaults
    (launches a side, warm requests) are the command's; ``replay``: unset ones are a replay's
    recorded values (click default None, read by :func:`read_decision`)."""
    rec = ", a replay: as recorded" if replay else ""
    return [
        click.option(
            "--paired",
            is_flag=True,
            default=None,
            help="run each A launch beside a B launch, their requests in turn, and decide on the pairs (paired"
            " t): for a host whose speed drifts between launches, such as a shared CPU runner (slow spells are"
            f" then kept{rec})",
        ),
        click.option(
            "-n",
            "--launches",
            type=click.IntRange(2, 100),
            default=None if replay else launches,
            help=f"launches a side before the first look (interleaved A B B A ...; default {launches}{rec})",
        ),
        click.option(
            "--max-launches",
            type=click.IntRange(2, 100),
            default=None if replay else max_launches,
            help="launches run a side at most (slow-spell replacements count); until then pairs are added"
            f" until every gated metric is decided (default {max_launches}{rec})",
        ),
        click.option(
            "--slow-spells",
            type=click.Choice(["replace", "keep"]),
            default=None,
            help="a launch whose median ran in a host slow spell: left out and replaced by another launch of its"
            " side (replace, default unless --paired; it counts against --max-launches) or kept",
        ),
        click.option(
            "--spending",
            type=click.Choice(["pocock", "obrien-fleming"]),
            default=None,
            help="alpha spending over the looks (default pocock: decides early; obrien-fleming: keeps most for"
            " the last look)",
        ),
        click.option(
            "-m",
            "--warm",
            type=click.IntRange(1, 1000),
            default=warm,
            show_default=True,
            help="warm requests a launch, after the cold request",
        ),
        click.option(
            "--threshold",
            default=None,
            help="decision threshold, a fraction or a percent (default 5%: a regression is an interval above"
            f" +5%{rec})",
        ),
        click.option(
            "--threshold-from",
            default=None,
            metavar="RUN",
            help="per-metric thresholds from a recorded A/A run directory (its ab.json): each metric's A/A"
            " interval",
        ),
        click.option(
            "--confidence",
            default=None,
            help="two-sided confidence over all looks and gated metrics (default 0.95; each look's intervals are"
            " wider: alpha spending, split over the gated metrics)",
        ),
    ]


def read_decision(kw: dict[str, Any], bundles: Any = None) -> tuple[Any, float | None, dict[str, float]]:
    """The decision options in ``kw`` -> (the sequential design, ``--threshold`` or None when not
    given, ``--threshold-from``'s per-metric thresholds or {}); ``bundles``: a replay's, whose
    recorded design fills what is not given. Raises
    :class:`perfkit.ab.ab_command.AbInputError` naming the option."""
    from perfkit.ab import ab_command
    from perfkit.ab.decide import thresholds_from_run

    threshold = ab_command.parse_fraction(kw["threshold"], "--threshold")
    confidence = ab_command.parse_fraction(kw["confidence"], "--confidence")
    thresholds: dict[str, float] = {}
    if kw["threshold_from"]:
        try:
            thresholds = thresholds_from_run(kw["threshold_from"])
        except (FileNotFoundError, ValueError) as exc:
            raise ab_command.AbInputError(str(exc), "--threshold-from") from None
    design = ab_command.design_for(
        kw["launches"], kw["max_launches"], confidence, kw["spending"], kw["slow_spells"], bundles,
        paired=kw["paired"],
    )  # fmt: skip
    return design, threshold, thresholds


_SIDES = [
    click.option("--a", "a", default=None, metavar="FILE", help="side A: an engine spec YAML or params file"),
    click.option("--b", "b", default=None, metavar="FILE", help="side B: as --a (A again: A/A)"),
]
_AB_ONLY = [
    click.option(
        "--undecided",
        type=click.Choice(["fail", "pass"]),
        default="fail",
        show_default=True,
        help="a gated metric still inconclusive at --max-launches: exit 1 (fail) or exit 0 (pass, said in"
        " the summary)",
    ),
    click.option(
        "--out",
        default=None,
        help="run directory (default outputs/ab/<timestamp>); holds a/, b/, ab.json, summary.md, report.html",
    ),
    click.option(
        "--gate-metrics",
        default=None,
        multiple=True,
        metavar="M1,M2",
        help="metrics whose regression sets the exit code (e.g. DenoisingStage,warm_e2e; names are"
        " case-sensitive, stages are the engine's); the rest are decided and shown, not gated (default:"
        " every metric gates; a replay: as recorded)",
    ),
    click.option(
        "--replay",
        nargs=2,
        default=None,
        metavar="DIR_A DIR_B",
        help="re-decide from two recorded side bundles: launches nothing",
    ),
    click.option(
        "--num-frames",
        type=click.IntRange(1),
        default=None,
        help="request frames (default: the params file's, else the engine's)",
    ),
    click.option("--height", type=click.IntRange(1), default=None, help="request height (px)"),
    click.option("--width", type=click.IntRange(1), default=None, help="request width (px)"),
    click.option("--steps", type=click.IntRange(1), default=None, help="request denoising steps"),
    click.option(
        "--share-compile-cache",
        is_flag=True,
        help="launches share compile caches (default: fresh ones each launch)",
    ),
    click.option(
        "--profile",
        is_flag=True,
        help="after the measured launches, an extra launch a side profiles a cold and a warm request"
        " (sglang's profile fields); the report diffs A's and B's ops (not part of any metric)",
    ),
    click.option(
        "--profile-steps",
        type=int,
        default=5,
        show_default=True,
        help="with --profile: denoising steps recorded after one warm-up step (sglang's"
        " num_profiled_timesteps; -1 all)",
    ),
    click.option(
        "--profile-warm",
        type=click.IntRange(1, 9),
        default=3,
        show_default=True,
        help="with --profile: warm requests profiled a side (the diff takes each op's median over them)",
    ),
    click.option(
        "--profile-all-stages",
        is_flag=True,
        help="with --profile: every stage (sglang's profile_all_stages)",
    ),
    click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
]


def apply_options(f: Callable[..., Any], opts: list[Any]) -> Callable[..., Any]:
    """Apply click options ``opts`` to ``f``, in --help order."""
    for o in reversed(opts):
        f = o(f)
    return f


def ab_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Apply every ``perfkit ab`` option to the command function ``f``."""
    return apply_options(f, _SIDES + decision_options(3, 10, 5, replay=True) + _AB_ONLY)


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
    """The options ``perfkit bisect`` and ``perfkit history confirm`` share (perfkit.bisect.probe.ProbeSetup):
    the probe's build, then ``perfkit ab``'s decision options (a probe: 2 to 6 launches a side, 3 warm
    requests; still inconclusive at the maximum, the probe is undecided and skipped)."""
    more = [
        click.option("--out", default=None, help="output directory (default outputs/<command>/<timestamp>)"),
        click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
    ]
    return apply_options(f, _PROBE_OPTIONS + decision_options(2, 6, 3, replay=False) + more)


def probe_run(kind: str, fn: Callable[..., Any], kw: dict[str, Any], *args: Any, **more: Any) -> None:
    """Build the probe setup from ``kw``, run ``fn(*args, setup, out, **more)``, print, exit."""
    from pathlib import Path

    from perfkit.ab.ab_command import AbInputError, parse_gate_metrics
    from perfkit.bisect.search import BisectError, ProbeSetup, out_dir
    from perfkit.history.store import HistoryError
    from perfkit.stats import DEFAULT_THRESHOLD

    try:
        metric = (parse_gate_metrics(kw["metric"], "--metric") or [None])[0] if kw.get("metric") else None
        design, threshold, thresholds = read_decision(kw)
    except AbInputError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    try:
        setup = ProbeSetup(
            Path(kw["spec"]), metric or "DenoisingStage", kw["python_path"], kw["build"], design,
            threshold or DEFAULT_THRESHOLD, kw["warm"], kw["build_timeout"], thresholds,
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

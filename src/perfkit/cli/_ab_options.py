"""The options of ``perfkit ab`` and their help: the command module stays a thin wrapper. The
decision options (:func:`decision_options`) are shared with ``perfkit bisect`` and ``perfkit
history confirm``, whose probes are A/Bs."""

from __future__ import annotations

from typing import Any, Callable

import click


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

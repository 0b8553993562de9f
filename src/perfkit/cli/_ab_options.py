"""The options of ``perfkit ab`` and their help: the command module stays a thin wrapper."""

from __future__ import annotations

from typing import Any, Callable

import click

_OPTIONS = [
    click.option("--a", "a", default=None, metavar="FILE", help="side A: an engine spec YAML or params file"),
    click.option("--b", "b", default=None, metavar="FILE", help="side B: as --a (A again: A/A)"),
    click.option(
        "--paired",
        is_flag=True,
        default=None,
        help="run each A launch beside a B launch, their requests in turn, and decide on the pairs (paired t):"
        " for a host whose speed drifts between launches (slow spells are then kept; a replay: as recorded)",
    ),
    click.option(
        "-n",
        "--launches",
        type=click.IntRange(2, 100),
        default=None,
        help="launches a side before the first look (interleaved A B B A ...; default 3, a replay: as recorded)",
    ),
    click.option(
        "--max-launches",
        type=click.IntRange(2, 100),
        default=None,
        help="launches run a side at most (slow-spell replacements count); until then pairs are added"
        " until every gated metric is decided (default 10; a replay: as recorded)",
    ),
    click.option(
        "--undecided",
        type=click.Choice(["fail", "pass"]),
        default="fail",
        show_default=True,
        help="a gated metric still inconclusive at --max-launches: exit 1 (fail) or exit 0 (pass, said in"
        " the summary)",
    ),
    click.option(
        "--slow-spells",
        type=click.Choice(["replace", "keep"]),
        default=None,
        help="a launch whose median ran in a host slow spell: left out and replaced by another launch of its"
        " side (replace, default; it counts against --max-launches) or kept",
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
        default=5,
        show_default=True,
        help="warm requests a launch, after the cold request",
    ),
    click.option(
        "--out",
        default=None,
        help="run directory (default outputs/ab/<timestamp>); holds a/, b/, ab.json, summary.md, report.html",
    ),
    click.option(
        "--threshold",
        default=None,
        help="decision threshold, a fraction or a percent (default 5%: a regression is an interval above +5%)",
    ),
    click.option(
        "--threshold-from",
        default=None,
        metavar="RUN",
        help="per-metric thresholds from a recorded A/A run directory (its ab.json): each metric's A/A interval",
    ),
    click.option(
        "--confidence",
        default=None,
        help="two-sided confidence over all looks and gated metrics (default 0.95; each look's intervals are"
        " wider: alpha spending, split over the gated metrics)",
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


def ab_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Apply every ``perfkit ab`` option to the command function ``f``."""
    for o in reversed(_OPTIONS):
        f = o(f)
    return f

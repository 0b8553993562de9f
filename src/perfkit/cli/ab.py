"""``perfkit ab``: A/B two engines (or replay two recorded sides) over :mod:`perfkit.ab.ab_command`;
its decision options are shared with ``perfkit bisect`` and ``perfkit history confirm``
(:func:`probe_options`, :func:`probe_run`)."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from perfkit.cli._common import choice, done, ranged
from perfkit.common.exitcodes import EXIT_ERROR


def decision_options(launches: int, max_launches: int, warm: int, replay: bool) -> list[Any]:
    """The options of how an A/B runs and decides, with the command's defaults; ``replay``: unset
    ones default to None (a replay's recorded values)."""
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
        choice(
            "--slow-spells",
            ["replace", "keep"],
            "a launch whose median ran in a host slow spell: left out and replaced by another launch of its"
            " side (replace, default unless --paired; it counts against --max-launches) or kept",
        ),
        choice(
            "--spending",
            ["pocock", "obrien-fleming"],
            "alpha spending over the looks (default pocock: decides early; obrien-fleming: keeps most for"
            " the last look)",
        ),
        ranged("-m --warm", click.IntRange(1, 1000), warm, "warm requests a launch, after the cold request"),
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
    """The decision options in ``kw`` -> (design, ``--threshold`` or None, ``--threshold-from``'s
    thresholds or {}); ``bundles``: a replay's. Raises AbInputError naming the option."""
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
    choice(
        "--undecided",
        ["fail", "pass"],
        "a gated metric still inconclusive at --max-launches: exit 1 (fail) or exit 0 (pass, said in"
        " the summary)",
        default="fail",
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
    ranged(
        "--profile-steps",
        int,
        5,
        "with --profile: denoising steps recorded after one warm-up step (sglang's"
        " num_profiled_timesteps; -1 all)",
    ),
    ranged(
        "--profile-warm",
        click.IntRange(1, 9),
        3,
        "with --profile: warm requests profiled a side (the diff takes each op's median over them)",
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
    return functools.reduce(lambda g, o: o(g), reversed(opts), f)


def ab_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Apply every ``perfkit ab`` option to the command function ``f``."""
    return apply_options(f, _SIDES + decision_options(3, 10, 5, replay=True) + _AB_ONLY)


_PROBE_OPTIONS = [
    ranged("--repo", None, ".", "the engine's git repository (never checked out)"),
    click.option(
        "--spec",
        required=True,
        metavar="FILE",
        help="engine spec YAML or params file; {checkout} = the probe",
    ),
    click.option("--python-path", metavar="DIR", help="Python overlay: checkout/DIR first on PYTHONPATH"),
    click.option("--build", default=None, metavar="CMD", help="shell command run in each checkout first"),
    ranged(
        "--build-timeout",
        click.FloatRange(min=1),
        3600,
        "seconds a --build may run; longer is that probe's error",
    ),
]


def probe_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``perfkit bisect`` and ``perfkit history confirm`` share: the probe's build,
    then the decision options (2 to 6 launches a side, 3 warm requests)."""
    more = [
        click.option("--out", default=None, help="output directory (default outputs/<command>/<timestamp>)"),
        click.option("-q", "--quiet", is_flag=True, help="do not print summary.md"),
    ]
    return apply_options(f, _PROBE_OPTIONS + decision_options(2, 6, 3, replay=False) + more)


def probe_run(kind: str, fn: Callable[..., Any], kw: dict[str, Any], *args: Any, **more: Any) -> None:
    """Build the probe setup from ``kw``, run ``fn(*args, setup, out, **more)``, print, exit."""
    from pathlib import Path

    from perfkit.ab.ab_command import AbInputError, out_dir, parse_gate_metrics
    from perfkit.bisect.search import BisectError, ProbeSetup
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
        code, summary = fn(*args, setup, out_dir(kw["out"], kind=kind), **more)
    except (AbInputError, BisectError, HistoryError) as exc:
        command = "history confirm" if kind == "confirm" else kind  # its outputs: outputs/confirm/
        where = f"{exc.option} " if isinstance(exc, AbInputError) else ""
        click.echo(f"perfkit {command}: error: {where}{exc}", err=True)
        sys.exit(EXIT_ERROR)
    if not kw["quiet"]:
        click.echo(summary.read_text())
    click.echo(f"summary: {summary}")
    done(code)


EPILOG = (
    "Examples:\n\n\b\n"
    "  perfkit ab --a a.yaml --b b.yaml -n 4 -m 5 --out outputs/ab/pr123\n"
    "  perfkit ab --a a.yaml --b a.yaml --out outputs/ab/aa     # A/A: the noise floor\n"
    "  perfkit ab --a a.yaml --b b.yaml --threshold-from outputs/ab/aa\n"
    "  perfkit ab --replay outputs/ab/pr123/a outputs/ab/pr123/b\n"
    "  perfkit ab --a a.yaml --b b.yaml -n 3 --max-launches 10 -m 5 --threshold 1% "
    "--gate-metrics DenoisingStage,warm_e2e\n\n"
    "It launches -n a side, then adds interleaved pairs until every gated metric is decided "
    "(alpha spending keeps the false-alarm rate over the looks) or --max-launches.\n\n"
    "Exit codes: 0 every gated metric decided, none regressed; 1 a gated metric regressed, or "
    "is still undecided at --max-launches (unless --undecided pass); every metric gates unless "
    "--gate-metrics names some; 2 an error or misuse (bad input, a failed launch, no gated metric "
    "measured on both sides)."
)


def side(path: str, option: str) -> tuple[Any, dict[str, Any] | None]:
    """``--a``/``--b`` -> (EngineSpec, request dict or None); click.BadParameter naming option and file."""
    from perfkit.params import ParamsError, load_side

    try:
        return load_side(path)
    except ParamsError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _run_or_replay(kw: dict[str, Any]) -> int:
    from perfkit.ab import ab_command
    from perfkit.report.ab import error_reasons, write_ab_outputs

    gate = ab_command.parse_gate_metrics(kw["gate_metrics"])
    if kw["replay"]:
        if kw["a"] or kw["b"]:
            raise click.UsageError("give either --replay DIR_A DIR_B or --a/--b, not both")
        (a, b), out, live = kw["replay"], ab_command.out_dir(kw["out"], "-replay"), {}
    else:
        if not (kw["a"] and kw["b"]):
            raise click.UsageError("give --a and --b (engine spec or params files), or --replay DIR_A DIR_B")
        (spec_a, req_a), (spec_b, req_b) = side(kw["a"], "--a"), side(kw["b"], "--b")
        for spec, opt in ((spec_a, "--a"), (spec_b, "--b")):
            try:
                spec.check()  # a missing model or sglang: exit 2 before any launch
            except FileNotFoundError as exc:
                raise click.BadParameter(f"{kw[opt[2:]]}: {exc}", param_hint=opt) from None
        shape = {k: kw[k] for k in ("num_frames", "height", "width")} | {"num_inference_steps": kw["steps"]}
        if kw["share_compile_cache"]:
            spec_a, spec_b = (s.replace(share_compile_cache=True) for s in (spec_a, spec_b))
        a, b, out = (spec_a, req_a), (spec_b, req_b), ab_command.out_dir(kw["out"])
        pkeys = ("profile_steps", "profile_all_stages", "profile_warm")
        profile = ab_command.profile_params(*(kw[k] for k in pkeys)) if kw["profile"] else None
        live = {"shape": shape, "warm": kw["warm"], "profile": profile}
        from perfkit.engine.owner import become_subreaper

        become_subreaper()  # orphans below come back here
    decision = functools.partial(read_decision, kw)
    live |= {"replay": kw["replay"], "threshold_from": kw["threshold_from"]}
    res = ab_command.run_or_replay(a, b, out, decision, gate, kw["undecided"], **live)
    paths = write_ab_outputs(res, out)
    summary = paths["summary"].read_text()
    if not kw["quiet"]:
        print(summary)
        print(f"report: {paths['report']}")
    if res.exit_code == 2:  # say why on stderr too, -q or not
        why = error_reasons(res)
        print(f"perfkit ab: error: {'; '.join(why) or 'see ' + str(paths['summary'])}", file=sys.stderr)
    if res.undecided:  # the launches it would need, on stderr too, -q or not
        print(f"perfkit ab: {ab_command.undecided_message(res)}", file=sys.stderr)
    return res.exit_code


@click.command("ab", epilog=EPILOG)
@ab_options
def ab_command(**kw: Any) -> None:
    """A/B two engines: interleaved launches, per-metric ratios B/A with intervals, a verdict."""
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("profile_steps", "profile_warm", "profile_all_stages")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    ]
    if given and not kw["profile"]:  # they mean nothing without it: never silently ignored
        raise click.UsageError(f"{', '.join(given)} only with --profile (nothing is profiled without it)")
    from perfkit.ab.ab_command import AbInputError  # here: `perfkit ab --help` starts without the A/B stack

    try:
        code = _run_or_replay(kw)
    except AbInputError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    done(code)

"""``perfkit ab``: A/B two engines (or replay two recorded sides), a thin wrapper over
:mod:`perfkit.ab.ab_command` (read the options; run or replay, decide)."""

from __future__ import annotations

import sys
from typing import Any

import click

from perfkit.cli._ab_options import ab_options, read_decision
from perfkit.cli._common import done

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
    """``--a``/``--b`` -> (EngineSpec, request dict or None) (:func:`perfkit.params.load_side`);
    raises click.BadParameter naming the option and the file."""
    from perfkit.params import ParamsError, load_side

    try:
        return load_side(path)
    except ParamsError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _run_or_replay(kw: dict[str, Any]) -> int:
    from perfkit import stats
    from perfkit.ab import ab_command
    from perfkit.report.ab import write_ab_outputs

    gate = ab_command.parse_gate_metrics(kw["gate_metrics"])
    if kw["replay"]:
        if kw["a"] or kw["b"]:
            raise click.UsageError("give either --replay DIR_A DIR_B or --a/--b, not both")
        bundles = ab_command.load_replay(*kw["replay"])
        out = ab_command.out_dir(kw["out"], "-replay")
        design, threshold, thresholds = read_decision(kw, bundles)
        # decide as the run did (its gated metrics: the alpha is split over them)
        rec_gate, rec_threshold, rec_thresholds = ab_command.recorded_decision(bundles)
        gate = rec_gate if gate is None else gate
        threshold = threshold or rec_threshold or stats.DEFAULT_THRESHOLD
        if not kw["threshold_from"] and kw["threshold"] is None:
            thresholds = rec_thresholds
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
        req = ab_command.request_for(req_a, req_b, shape)
        if kw["share_compile_cache"]:
            spec_a, spec_b = (s.replace(share_compile_cache=True) for s in (spec_a, spec_b))
        design, threshold, thresholds = read_decision(kw)
        threshold = threshold or stats.DEFAULT_THRESHOLD
        out = ab_command.out_dir(kw["out"])
        pkeys = ("profile_steps", "profile_all_stages", "profile_warm")
        profile = ab_command.profile_params(*(kw[k] for k in pkeys)) if kw["profile"] else None
        from perfkit.ab.driver import AbPlan
        from perfkit.ab.sequential import run_sequential
        from perfkit.engine.client import VideoRequestSpec
        from perfkit.engine.owner import become_subreaper

        become_subreaper()  # orphans below come back here
        request = VideoRequestSpec.from_dict(req)
        plan = AbPlan(spec_a, spec_b, request, kw["warm"], profile=profile)
        bundles = run_sequential(plan, design, out, threshold, thresholds, gate)
    res = ab_command.decide(
        bundles, design, threshold, thresholds, gate, kw["undecided"],
        kept=None if kw["replay"] else out, threshold_from=kw["threshold_from"],
    )  # fmt: skip
    paths = write_ab_outputs(res, out)
    if not kw["quiet"]:
        print(paths["summary"].read_text())
        print(f"report: {paths['report']}")
    if res.exit_code == 2:  # say why on stderr too, -q or not
        why = ab_command.error_reasons(paths["summary"].read_text())
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

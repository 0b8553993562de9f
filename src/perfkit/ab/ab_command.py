"""Run or replay an A/B and decide it: what ``perfkit ab`` does, apart from reading its options
(:mod:`perfkit.ab.options`) and writing the outputs (:func:`perfkit.report.ab.write_ab_outputs`).

Errors are :class:`perfkit.ab.options.AbInputError`, naming the option they came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfkit.ab.decide import incomparable, needed_text
from perfkit.ab.driver import AbPlan
from perfkit.ab.options import AbInputError, parse_gate_metrics
from perfkit.ab.procedure import Design
from perfkit.ab.sequential import decide_sequential, run_sequential
from perfkit.bundle import ResultBundle
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec


def load_replay(dir_a: str, dir_b: str) -> dict[str, ResultBundle]:
    """The two recorded side bundles of a replay, ``{"A": ..., "B": ...}``. Raises
    :class:`AbInputError` (``--replay``): one directory given twice, an unreadable bundle, or two
    recordings that cannot be one A/B (another investigation, GPU or request shape:
    :func:`perfkit.ab.decide.incomparable`)."""
    if str(dir_b).startswith("-"):  # click gave --replay the next option as its second directory
        raise AbInputError(
            f"takes two directories, DIR_A DIR_B; got {dir_a} and the option {dir_b}", "--replay"
        )
    if Path(dir_a).resolve() == Path(dir_b).resolve():
        raise AbInputError(
            f"{dir_a} is given as both A and B: an A/B compares two recordings (for an A/A, "
            "record the same spec twice)",
            "--replay",
        )
    bundles = {}
    for side, d in zip("AB", (dir_a, dir_b)):
        try:
            bundles[side] = ResultBundle.load(d)
        except (FileNotFoundError, ValueError) as exc:
            raise AbInputError(str(exc), "--replay") from None
    differ = incomparable(bundles["A"], bundles["B"])
    if differ:
        raise AbInputError(
            f"{dir_a} and {dir_b} cannot be one A/B, they differ in "
            + "; ".join(differ)
            + " (the engines may differ; what they measured, its shape and the GPU may not)",
            "--replay",
        )
    return bundles


def recorded_gate_metrics(bundles: dict[str, ResultBundle]) -> list[str] | None:
    """The gated metrics a replay recorded (side A's meta ``ab.sequential.gate_metrics``); None: all."""
    recorded = ((bundles["A"].meta.get("ab") or {}).get("sequential") or {}).get("gate_metrics")
    return parse_gate_metrics([",".join(map(str, recorded))]) if recorded else None


def recorded_thresholds(bundles: dict[str, ResultBundle]) -> tuple[float | None, dict[str, float]]:
    """The threshold and per-metric thresholds a run recorded (side A's meta
    ``ab.sequential``); (None, {}) for recordings made before they were kept."""
    seq = (bundles["A"].meta.get("ab") or {}).get("sequential") or {}
    return seq.get("threshold"), {str(k): float(v) for k, v in (seq.get("thresholds") or {}).items()}


def profile_params(steps: int, all_stages: bool, warm: int) -> Any:
    """``--profile``'s settings as :class:`perfkit.measuring.profiled.ProfileParams`.
    Raises :class:`AbInputError` (``--profile-steps``) with the model's messages."""
    from pydantic import ValidationError

    from perfkit.measuring.profiled import ProfileParams

    try:
        return ProfileParams(steps=steps, all_stages=all_stages, warm=warm)
    except ValidationError as exc:  # its messages, without pydantic's prefix
        msg = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise AbInputError(msg, "--profile-steps") from None


def launch(
    specs: tuple[EngineSpec, EngineSpec],
    request: dict[str, Any],
    design: Design,
    warm: int,
    out: Path,
    threshold: float,
    thresholds: dict[str, float],
    gate: list[str] | None,
    profile: Any = None,
) -> dict[str, ResultBundle]:
    """Launch both sides, interleaved, until every gated metric is decided or the design's
    ``max_launches`` (:func:`perfkit.ab.sequential.run_sequential`); the side bundles
    ``{"A": ..., "B": ...}`` are written under ``out`` (``a/``, ``b/``)."""
    plan = AbPlan(*specs, VideoRequestSpec.from_dict(request), design.min_launches, warm, profile=profile)
    return run_sequential(plan, design, out, threshold, thresholds, gate)


def decide(
    bundles: dict[str, ResultBundle],
    design: Design,
    threshold: float,
    thresholds: dict[str, float],
    gate: list[str] | None,
    undecided: str,
    kept: Path | None = None,
    threshold_from: str | None = None,
) -> Any:
    """The A/B result (:func:`perfkit.ab.sequential.decide_sequential`), its meta saying whether
    it was a replay (``kept`` None) and where its thresholds came from. Raises
    :class:`AbInputError` (``--gate-metrics``) when a gated metric cannot be decided; for a run,
    the message names the ``--replay`` that re-decides the launches kept in ``kept``."""
    try:
        res = decide_sequential(
            bundles["A"], bundles["B"], design, threshold, thresholds, gate=gate, undecided=undecided
        )
    except ValueError as exc:
        why = "" if kept is None else f" (the launches are kept: --replay {kept / 'a'} {kept / 'b'})"
        raise AbInputError(f"{exc}{why}", "--gate-metrics") from None
    res.meta["replay"] = kept is None
    if threshold_from:
        res.meta["thresholds_from"] = str(threshold_from)
    return res


def undecided_message(res: Any) -> str:
    """One line: the metrics still inconclusive, and the launches a side that would decide each."""
    word = "undecided" if res.exit_code else "undecided, passed by --undecided pass"
    text = f"{word}: still inconclusive, with the launches a side that would decide it: "
    return " ".join((text + needed_text(res, res.undecided)).splitlines())  # one line, whatever the names


def error_reasons(summary: str) -> list[str]:
    """Why an A/B is an error (exit 2): the summary.md lines saying so, without their bullet, as
    plain text for a terminal (summary.md's escapes and ``<code>`` undone)."""
    import html
    import re

    lines = [x[2:] for x in summary.splitlines() if x.startswith(("- nothing", "- launch failed"))]
    return [html.unescape(re.sub(r"</?code>", "", x)).replace("\\[", "[").replace("\\]", "]") for x in lines]

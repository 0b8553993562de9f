"""``perfkit ab`` apart from writing its outputs: read its options into an A/B, run or replay it,
decide it. Every error is an :class:`AbInputError` naming the option it came from."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable, Iterable

from perfkit import stats
from perfkit.ab import sequential as sq
from perfkit.ab.decide import METRIC_UNITS, incomparable, needed_text
from perfkit.ab.sequential import decide_sequential
from perfkit.bundle import ResultBundle
from perfkit.common.outdirs import given_out_problem, stamped_dir
from perfkit.readings.stages import KNOWN_STAGES


class AbInputError(ValueError):
    """Bad A/B input; ``option`` names the command-line option (e.g. ``--threshold``)."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


def parse_fraction(text: str | None, option: str) -> float | None:
    """``5%`` or ``0.05`` -> 0.05 (None: not given). Raises :class:`AbInputError` outside (0, 1)."""
    if text is None:
        return None
    t = str(text).strip()
    try:
        v = float(t.rstrip("%")) / (100.0 if t.endswith("%") else 1.0)
    except ValueError:
        raise AbInputError(
            f"expected a fraction like 0.05 or a percent like 5%, got {text!r}", option
        ) from None
    if not 0.0 < v < 1.0:
        raise AbInputError(f"must be between 0 and 1 (0 % and 100 %), got {text!r}", option)
    return v


def parse_gate_metrics(texts: str | Iterable[str] | None, option: str = "--gate-metrics") -> list[str] | None:
    """``--gate-metrics``: comma-separated A/B metrics or ``…Stage`` names; None: all. Raises
    :class:`AbInputError`: empty, or a name that is neither."""
    if not texts:
        return None
    texts = [texts] if isinstance(texts, str) else list(texts)
    names = list(dict.fromkeys(x.strip() for t in texts for x in str(t).split(",") if x.strip()))
    if not names:
        raise AbInputError("no metric named", option)
    known = [*METRIC_UNITS, *KNOWN_STAGES]
    for x in names:
        if x not in METRIC_UNITS and not x.endswith("Stage"):
            near = [k for k in known if k.lower() == x.lower()] or difflib.get_close_matches(
                x, known, n=1, cutoff=0.6
            )
            raise AbInputError(
                f"unknown metric {x!r}"
                + (f" (did you mean {near[0]}? names are case-sensitive)" if near else "")
                + f"; metrics: {', '.join(METRIC_UNITS)} or a stage such as DenoisingStage",
                option,
            )
    return names


def design_for(
    launches: int | None,
    max_launches: int | None,
    confidence: float | None,
    spending: str | None,
    slow_rule: str | None,
    bundles: dict[str, ResultBundle] | None = None,
    paired: bool | None = None,
) -> sq.Design:
    """The sequential design from the options, a replay's unset ones from the recording (else one
    look at its launches a side). Raises :class:`AbInputError`: out of range; ``--paired`` with
    ``--slow-spells replace``."""
    rec: dict[str, Any] = {}
    if bundles is not None:
        rec = recorded_design(bundles)
        if not rec:
            per = min(len(bundles["A"].launches), len(bundles["B"].launches))
            rec = {"min_launches": max(2, min(sq.DEFAULT_MIN_LAUNCHES, per)), "max_launches": max(2, per)}
    lo = launches or rec.get("min_launches") or sq.DEFAULT_MIN_LAUNCHES
    hi = max_launches or rec.get("max_launches") or max(sq.DEFAULT_MAX_LAUNCHES, lo)
    pair = bool(rec.get("paired", False)) if paired is None else bool(paired)
    if pair and slow_rule == "replace":
        raise AbInputError(
            "a paired A/B keeps every launch (a pair shares its host state; replacing one side's "
            "launch would break the pair): leave --slow-spells out or pass keep",
            "--paired",
        )
    try:
        return sq.Design(
            min_launches=int(lo),
            max_launches=int(hi),
            confidence=confidence or float(rec.get("confidence") or stats.DEFAULT_CONFIDENCE),
            spending=spending or rec.get("spending") or "pocock",
            slow_rule=slow_rule or ("keep" if pair else rec.get("slow_rule") or "replace"),
            paired=pair,
        )
    except ValueError as exc:
        raise AbInputError(str(exc), "-n/--launches, --max-launches") from None


def out_dir(given: str | None, suffix: str = "", kind: str = "ab") -> Path:
    """``given`` (not a file or a non-empty directory), else a new ``outputs/<kind>/<timestamp><suffix>``.
    Raises :class:`AbInputError` (``--out``)."""
    if given:
        problem = given_out_problem(given)
        if problem:
            raise AbInputError(f"{Path(given)} {problem}", "--out")
        return Path(given)
    return stamped_dir(Path("outputs") / kind, suffix)


def request_for(
    req_a: dict[str, Any] | None, req_b: dict[str, Any] | None, overrides: dict[str, int | None]
) -> dict[str, Any]:
    """The params files' request shape (they must agree) with ``overrides`` (None: not given).
    Raises :class:`AbInputError` (``--a/--b``) on two shapes."""
    if req_a is not None and req_b is not None and req_a != req_b:
        raise AbInputError(
            f"the params files ask for different requests ({req_a} vs {req_b}): an A/B compares one shape",
            "--a/--b",
        )
    return {**(req_a or req_b or {}), **{k: v for k, v in overrides.items() if v is not None}}


def load_replay(dir_a: str, dir_b: str) -> dict[str, ResultBundle]:
    """``{"A": bundle, "B": bundle}`` of a replay. Raises :class:`AbInputError` (``--replay``): one
    directory twice, an unreadable bundle, or recordings that cannot be one A/B."""
    if str(dir_b).startswith("-"):  # click took the next option as the second directory
        raise AbInputError(
            f"takes two directories, DIR_A DIR_B; got {dir_a} and the option {dir_b}", "--replay"
        )
    if Path(dir_a).resolve() == Path(dir_b).resolve():
        raise AbInputError(
            f"{dir_a} is given as both A and B: an A/B compares two recordings (for an A/A, "
            "record the same spec twice)",
            "--replay",
        )
    try:
        bundles = {side: ResultBundle.load(d) for side, d in zip("AB", (dir_a, dir_b))}
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


def recorded_design(bundles: dict[str, ResultBundle]) -> dict[str, Any]:
    """Side A's meta ``ab.sequential``; {}: nothing."""
    return dict((bundles["A"].meta.get("ab") or {}).get("sequential") or {})


def recorded_decision(
    bundles: dict[str, ResultBundle],
) -> tuple[list[str] | None, float | None, dict[str, float]]:
    """The gated metrics (None: all), threshold and per-metric thresholds a run recorded."""
    seq = recorded_design(bundles)
    gate = parse_gate_metrics([",".join(map(str, seq["gate_metrics"]))]) if seq.get("gate_metrics") else None
    return gate, seq.get("threshold"), {str(k): float(v) for k, v in (seq.get("thresholds") or {}).items()}


def profile_params(steps: int, all_stages: bool, warm: int) -> Any:
    """``--profile``'s settings. Raises :class:`AbInputError` (``--profile-steps``)."""
    from pydantic import ValidationError

    from perfkit.measuring.profiled import ProfileParams

    try:
        return ProfileParams(steps=steps, all_stages=all_stages, warm=warm)
    except ValidationError as exc:
        msg = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise AbInputError(msg, "--profile-steps") from None


def run_or_replay(
    a: Any, b: Any, out: Path | None, decision: Callable, gate: Any, undecided: str, **live: Any
) -> Any:
    """Run (``a``, ``b``: (EngineSpec, request or None)) or replay (``live["replay"]``: ``a``, ``b``
    side directories) an A/B and decide it; ``decision(bundles or None)`` -> (design, threshold,
    thresholds), a replay's unset ones as recorded. ``live``: ``warm``, ``shape``, ``profile``,
    ``threshold_from``. Raises :class:`AbInputError`, (``--gate-metrics``) naming the ``--replay``."""
    if live.get("replay"):
        bundles = load_replay(str(a), str(b))
        design, threshold, thresholds = decision(bundles)
        # as the run did: the alpha is split over its gated metrics
        rec_gate, rec_threshold, rec_thresholds = recorded_decision(bundles)
        gate = rec_gate if gate is None else gate
        if not live.get("threshold_from") and threshold is None:
            thresholds = rec_thresholds
        rule = sq.Gate(gate, threshold or rec_threshold or stats.DEFAULT_THRESHOLD, thresholds)
    else:
        from perfkit.engine.client import VideoRequestSpec

        request = VideoRequestSpec.from_dict(request_for(a[1], b[1], live.get("shape", {})))
        design, threshold, thresholds = decision(None)
        rule = sq.Gate(gate, threshold or stats.DEFAULT_THRESHOLD, thresholds)
        bundles = sq.run_sequential(
            {"A": a[0], "B": b[0]}, request, live["warm"], design, out, rule, live.get("profile")
        )
    try:
        res = decide_sequential(bundles["A"], bundles["B"], design, rule, undecided)
    except ValueError as exc:
        why = "" if live.get("replay") else f" (the launches are kept: --replay {out / 'a'} {out / 'b'})"
        raise AbInputError(f"{exc}{why}", "--gate-metrics") from None
    res.meta["replay"] = bool(live.get("replay"))
    if live.get("threshold_from"):
        res.meta["thresholds_from"] = str(live["threshold_from"])
    return res


def undecided_message(res: Any) -> str:
    """One line: the metrics still inconclusive and the launches a side that would decide each."""
    word = "undecided" if res.exit_code else "undecided, passed by --undecided pass"
    text = f"{word}: still inconclusive, with the launches a side that would decide it: "
    return " ".join((text + needed_text(res, res.undecided)).splitlines())  # one line, whatever the names

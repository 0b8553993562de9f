"""``perfkit bisect`` (:func:`run_bisect`) and ``perfkit history confirm`` (:func:`run_confirm`);
docs/history.md ("Search", "Confirm"). Their outputs: :mod:`perfkit.report.history_site`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfkit.bisect.probe import (
    BisectError,
    Commit,
    Probe,
    ProbeSetup,
    check_repo,
    commit_info,
    commit_range,
    compare,
    prepare,
    worktree,
)
from perfkit.common.exitcodes import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION
from perfkit.common.jsonsafe import finite
from perfkit.gate.baseline.files import atomic_write_text
from perfkit.history.check import find_step
from perfkit.history.store import CONFIRM_COLUMNS, add_confirmation
from perfkit.report.history_site import write_bisect_outputs

log = logging.getLogger(__name__)

RESULT_FILE = "bisect.json"
CONFIRM_FILE = "confirm.json"
CONFIRM_EXIT_CODES = {"confirmed": 0, "not reproduced": 1, "undecided": 1, "error": 2}


@dataclass
class BisectResult:
    """What the search found: ``outcome`` ``found`` (exit 0), ``not reproduced`` (1), ``not
    decided`` or ``error`` (2); the first bad commit is one of positions lo+1..hi."""

    outcome: str
    exit_code: int
    good: Commit
    bad: Commit
    commits: list[Commit]
    probes: list[Probe] = field(default_factory=list)
    found: Commit | None = None
    lo: int = 0
    hi: int = 0
    message: str = ""
    setup: dict[str, Any] = field(default_factory=dict)
    repo: str = ""
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``launches`` and each commit's ``short`` included)."""
        return _result_dict(
            self.probes,
            kind="bisect",
            outcome=self.outcome,
            exit_code=self.exit_code,
            message=self.message,
            repo=self.repo,
            good=self.good.to_dict(),
            bad=self.bad.to_dict(),
            commits=[x.to_dict() for x in self.commits],
            found=self.found and self.found.to_dict(),
            range={"lo": self.lo, "hi": self.hi},
            setup=self.setup,
            wall_s=round(self.wall_s, 1),
        )


def _result_dict(probes: list[Probe], **keys: Any) -> dict[str, Any]:
    launches = sum(sum(p.launches.values()) for p in probes)
    return finite(
        keys | {"launches": launches, "probes": [asdict(p) | {"commit": p.commit.to_dict()} for p in probes]}
    )


def next_position(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untried position in (lo, hi) nearest the middle (ties: the lower), or None."""
    cands = [i for i in range(lo + 1, hi) if i not in skipped]
    if not cands:
        return None
    mid = (lo + hi) / 2
    return min(cands, key=lambda i: (abs(i - mid), i))


def _probe(repo: Path, commit: Commit, position: int, ref: Any, setup: ProbeSetup, d: Path) -> Probe:
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with worktree(repo, commit.sha) as checkout:
        try:
            p = compare(ref, prepare(checkout, setup, d), setup, d, commit, position)
        except BisectError as exc:
            p = Probe(commit, position, "error", error=str(exc), out=str(d))
    p.wall_s = round(time.time() - t0, 1)
    return p


def bisect(repo: str | Path, good: str, bad: str, setup: ProbeSetup, out: str | Path) -> BisectResult:
    """The first commit after ``good`` up to ``bad`` whose ``setup.metric`` regressed against
    ``good`` (``out/bisect.json``, probes under ``out/probes/``). Raises BisectError for bad input;
    a good commit that cannot be built is the ``error`` outcome."""
    t0 = time.time()
    repo, out = Path(repo).resolve(), Path(out)
    good_c, commits = commit_range(repo, good, bad)
    setup.require_varies()
    n = len(commits)
    res = BisectResult(
        "not decided", EXIT_ERROR, good_c, commits[-1], commits, hi=n, repo=str(repo), setup=setup.to_dict()
    )
    out.mkdir(parents=True, exist_ok=True)
    with worktree(repo, good_c.sha) as good_dir:
        try:
            ref = prepare(good_dir, setup, out / "good")
        except BisectError as exc:
            res.outcome, res.exit_code = "error", EXIT_ERROR
            res.message = f"the good commit {good_c.short} ({good_c.subject}): {exc}; nothing to compare with"
            res.wall_s = time.time() - t0
            _save(res.to_dict(), out)
            return res
        lo, hi, skipped, bad_known = 0, n, set(), False
        while True:
            pos = next_position(lo, hi, skipped)
            if pos is None and not bad_known and hi == n and n not in skipped:
                pos = n  # every probe so far was good: is the bad commit bad at all?
            if pos is None:
                break
            c = commits[pos - 1]
            p = _probe(repo, c, pos, ref, setup, out / "probes" / f"{pos:03d}-{c.short}")
            res.probes.append(p)
            _save(res.to_dict(), out)
            if p.verdict == "bad":
                hi, bad_known = pos, True
            elif p.verdict == "good":
                lo = pos
                if pos == n:
                    break
            else:
                skipped.add(pos)
    res.lo, res.hi = lo, hi
    res.wall_s = time.time() - t0
    _conclude(res, bad_known)
    _save(res.to_dict(), out)
    return res


def _conclude(res: BisectResult, bad_known: bool) -> None:
    n, lo, hi = len(res.commits), res.lo, res.hi
    undecided = [p for p in res.probes if p.verdict in ("undecided", "error")]

    def why() -> str:
        return "; ".join(
            f"{p.commit.short} ({p.commit.subject}): " + (p.error or f"undecided ({p.reason})")
            for p in undecided
        )

    if lo == n:
        res.outcome, res.exit_code = "not reproduced", EXIT_REGRESSION
        res.message = (
            f"not reproduced: the bad commit {res.bad.short} is not a regression of {res.setup.get('metric')} "
            f"against the good commit {res.good.short}"
        )
    elif bad_known and hi - lo == 1:
        res.found = res.commits[hi - 1]
        res.outcome, res.exit_code = "found", EXIT_OK
        res.message = f"first bad commit: {res.found.short} {res.found.subject} ({res.found.author_date})"
    else:
        first = res.commits[lo].short
        last = res.commits[hi - 1].short
        res.outcome, res.exit_code = "not decided", EXIT_ERROR
        if not bad_known:
            res.message = f"could not decide whether the bad commit {res.bad.short} regressed: {why()}"
        else:
            res.message = (
                f"could not decide: the first bad commit is one of positions {lo + 1}..{hi} "
                f"({first} .. {last}, {hi - lo} commits); not decided: {why()}"
            )


def _save(res: dict[str, Any], out: Path, name: str = RESULT_FILE) -> None:
    atomic_write_text(out / name, json.dumps(res, indent=1, default=str))


def ab_metric(store_metric: str) -> str:
    """The A/B metric of a store metric (``<Stage>_ms`` -> ``<Stage>``); BisectError when it has
    none."""
    fixed = {
        "e2e_ms": "warm_e2e",
        "first_result_ms": "first_result",
        "avg_denoise_step_ms": "denoising_step",
        "median_denoise_step_ms": "denoising_step",
    }
    if store_metric in fixed:
        return fixed[store_metric]
    if store_metric.endswith("Stage_ms"):
        return store_metric[: -len("_ms")]
    raise BisectError(
        f"the series' metric {store_metric!r} has no A/B counterpart: give --metric (e.g. DenoisingStage)"
    )


def run_bisect(repo: str | Path, good: str, bad: str, setup: ProbeSetup, out: Path) -> tuple[int, Path]:
    """``perfkit bisect``: (exit code, summary.md path). Raises BisectError for bad input."""
    res = bisect(repo, good, bad, setup, out)
    paths = write_bisect_outputs(res.to_dict(), out)
    return res.exit_code, paths["summary"]


def run_confirm(
    store: str | Path,
    series: str,
    change: str,
    repo: str | Path,
    setup: ProbeSetup,
    out: str | Path,
    *,
    metric: str | None = None,
    hardware: str | None = None,
) -> tuple[int, Path]:
    """``perfkit history confirm``: A/B the commits either side of step ``change`` of ``series``
    on ``metric`` (default :func:`ab_metric` of the series'), store the outcome; (exit code,
    summary.md path). Raises HistoryError (no such step), BisectError (a commit not in ``repo``,
    a bad spec, the commit before not built)."""
    t0 = time.time()
    out = Path(out)
    analysis, step = find_step(store, series, change, hardware=hardware)
    setup = replace(setup, metric=metric or ab_metric(analysis.metric))
    repo = Path(repo).resolve()
    check_repo(repo)
    setup.require_varies()
    commits = []
    for p in (step.before, step.after):
        try:
            commits.append(commit_info(repo, p.commit))
        except BisectError:
            raise BisectError(
                f"{repo}: the step's commit {p.commit!r} (run {p.run_id}) is not in this repository"
            ) from None
    before, after = commits
    out.mkdir(parents=True, exist_ok=True)
    with worktree(repo, before.sha) as bdir:
        try:
            ref = prepare(bdir, setup, out / "before")
        except BisectError as exc:
            raise BisectError(
                f"the commit before the step {before.short} ({before.subject}): {exc}"
            ) from None
        probe = _probe(repo, after, 1, ref, setup, out / "probe")
    probe.wall_s = round(time.time() - t0, 1)
    if probe.verdict in ("error", "undecided"):
        outcome = probe.verdict
    else:
        outcome = "confirmed" if probe.decision == step.kind else "not reproduced"
    what = f"{analysis.case_id} {analysis.metric} {step.change_pct:+.1f} % ({step.kind}) between {before.short} and {after.short}"
    iv = "" if probe.low is None else f" [{(probe.low - 1) * 100:+.1f} %, {(probe.high - 1) * 100:+.1f} %]"
    ab = f"the A/B says {probe.decision or 'nothing'} on {setup.metric}" + (
        f" ({(probe.ratio - 1) * 100:+.1f} %{iv})" if probe.ratio is not None else ""
    )
    tail = {"undecided": f"{ab}: {probe.reason}", "error": f"{probe.error}"}.get(outcome, ab)
    message = f"{outcome}: {what}; {tail}"
    a = analysis
    row = (
        a.hardware, a.case_id, a.metric, step.before.commit, step.after.commit, step.kind, step.ratio,
        outcome, setup.metric, probe.decision or "", probe.ratio, probe.low, probe.high, probe.launches,
        probe.error or probe.reason, str(out), datetime.now(timezone.utc),
    )  # fmt: skip
    stored = add_confirmation(store, **dict(zip(CONFIRM_COLUMNS, row)))
    keys = ("kind", "ratio", "low", "high", "mean_before", "mean_after", "n_before", "n_after")
    step_d = {k: getattr(step, k) for k in keys}
    step_d |= {"before_run": step.before.run_id, "after_run": step.after.run_id}
    res = _result_dict(
        [probe],
        kind="confirm",
        outcome=outcome,
        exit_code=CONFIRM_EXIT_CODES[outcome],
        message=message,
        repo=str(repo),
        series={"hardware": a.hardware, "case_id": a.case_id, "metric": a.metric},
        step=step_d,
        good=before.to_dict(),
        bad=after.to_dict(),
        setup=setup.to_dict(),
        stored=str(stored),
    )
    _save(res, out, CONFIRM_FILE)
    return res["exit_code"], write_bisect_outputs(res, out)["summary"]

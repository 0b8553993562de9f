"""``perfkit bisect``: the first bad commit between a good and a bad one (first-parent positions
1..n), a sequential A/B at each probe; undecided or failed probes skipped, never guessed. Ends
found (exit 0), not reproduced (1), not decided (2): docs/history.md ("Search").
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.bisect.checkout import BisectError, Commit, commit_range, worktree
from perfkit.bisect.probe import Probe, ProbeSetup, compare, prepare
from perfkit.common.jsonsafe import finite

log = logging.getLogger(__name__)

EXIT_FOUND = 0
EXIT_NOT_REPRODUCED = 1
EXIT_ERROR = 2

#: the result file under the output directory
RESULT_FILE = "bisect.json"


@dataclass
class BisectResult:
    """What the search found.

    Attributes:
        outcome: ``found``, ``not reproduced``, ``not decided`` or ``error``.
        exit_code: 0 found, 1 not reproduced, 2 not decided or an error.
        good: the good commit; bad: the bad commit; commits: the range (positions 1..n).
        probes: in the order they ran.
        found: the first bad commit (outcome ``found``), else None.
        lo, hi: the range left: the first bad commit is one of positions lo+1..hi.
        message: the outcome in one sentence.
        setup: how probes were built and compared (:meth:`ProbeSetup.to_dict`).
        repo: the repository; wall_s: the whole search (s).
    """

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

    @property
    def launches(self) -> int:
        """Launches run over every probe, both sides."""
        return sum(sum(p.launches.values()) for p in self.probes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``launches`` and each commit's ``short`` included)."""

        def c(x: Commit | None) -> dict[str, Any] | None:
            return None if x is None else x.to_dict()

        return finite(
            {
                "kind": "bisect",
                "outcome": self.outcome,
                "exit_code": self.exit_code,
                "message": self.message,
                "repo": self.repo,
                "good": c(self.good),
                "bad": c(self.bad),
                "commits": [c(x) for x in self.commits],
                "found": c(self.found),
                "range": {"lo": self.lo, "hi": self.hi},
                "launches": self.launches,
                "probes": [{**p.to_dict(), "commit": c(p.commit)} for p in self.probes],
                "setup": self.setup,
                "wall_s": round(self.wall_s, 1),
            }
        )


def next_position(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untried position in (lo, hi) nearest the middle (ties: the lower), or None."""
    cands = [i for i in range(lo + 1, hi) if i not in skipped]
    if not cands:
        return None
    mid = (lo + hi) / 2
    return min(cands, key=lambda i: (abs(i - mid), i))


def _probe(
    repo: Path, commit: Commit, position: int, ref: Any, setup: ProbeSetup, out: Path, tmp: Path | None
) -> Probe:
    """Check out, build and A/B one commit; a build or spec error is the probe's error."""
    d = out / "probes" / f"{position:03d}-{commit.short}"
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with worktree(repo, commit.sha, tmp) as checkout:
        try:
            spec = prepare(checkout, setup, d)
        except BisectError as exc:
            return Probe(
                commit, position, "error", error=str(exc), out=str(d), wall_s=round(time.time() - t0, 1)
            )
        p = compare(ref, spec, setup, d, commit, position)
    p.wall_s = round(time.time() - t0, 1)
    return p


def bisect(
    repo: str | Path,
    good: str,
    bad: str,
    setup: ProbeSetup,
    out: str | Path,
    *,
    tmp: str | Path | None = None,
) -> BisectResult:
    """Find the first commit after ``good`` up to ``bad`` whose ``setup.metric`` regressed
    against ``good``, writing ``out/bisect.json`` and each probe's A/B under
    ``out/probes/<position>-<commit>/`` (worktrees under ``tmp`` when given).

    Raises:
        BisectError: bad input (a repository, a commit, the spec). A good commit that cannot be
            built is the result's ``error`` outcome (exit 2; nothing to compare with), so the
            report is still written.
    """
    t0 = time.time()
    repo, out = Path(repo).resolve(), Path(out)
    good_c, commits = commit_range(repo, good, bad)
    setup.require_varies()
    n = len(commits)
    res = BisectResult(
        "not decided", EXIT_ERROR, good_c, commits[-1], commits, hi=n, repo=str(repo), setup=setup.to_dict()
    )
    out.mkdir(parents=True, exist_ok=True)
    with worktree(repo, good_c.sha, tmp) as good_dir:
        try:
            ref = prepare(good_dir, setup, out / "good")
        except BisectError as exc:
            res.outcome, res.exit_code = "error", EXIT_ERROR
            res.message = f"the good commit {good_c.short} ({good_c.subject}): {exc}; nothing to compare with"
            res.wall_s = time.time() - t0
            _save(res, out)
            return res
        lo, hi, skipped, bad_known = 0, n, set(), False
        while True:
            pos = next_position(lo, hi, skipped)
            if pos is None and not bad_known and hi == n and n not in skipped:
                pos = n  # every probe so far was good: is the bad commit bad at all?
            if pos is None:
                break
            p = _probe(repo, commits[pos - 1], pos, ref, setup, out, Path(tmp) if tmp else None)
            res.probes.append(p)
            _save(res, out)
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
    _save(res, out)
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
        res.outcome, res.exit_code = "not reproduced", EXIT_NOT_REPRODUCED
        res.message = (
            f"not reproduced: the bad commit {res.bad.short} is not a regression of {res.setup.get('metric')} "
            f"against the good commit {res.good.short}"
        )
    elif bad_known and hi - lo == 1:
        res.found = res.commits[hi - 1]
        res.outcome, res.exit_code = "found", EXIT_FOUND
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


def _save(res: BisectResult, out: Path) -> Path:
    p = out / RESULT_FILE
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res.to_dict(), indent=1, default=str), encoding="utf-8")
    tmp.replace(p)
    return p

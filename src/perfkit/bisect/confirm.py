"""``perfkit history confirm SERIES CHANGE``: an A/B between the commits on either side of a
history change point (before = A, after = B) on the series' metric; outcome confirmed (exit 0),
not reproduced or undecided (1), error (2), stored next to the step. See docs/history.md ("Confirm").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfkit.bisect.checkout import BisectError, Commit, check_repo, commit_info, resolve, worktree
from perfkit.bisect.probe import Probe, ProbeSetup, compare, prepare
from perfkit.common.jsonsafe import finite
from perfkit.history.changepoints import Step
from perfkit.history.confirmations import Confirmation, add_confirmation, find_step

#: outcome -> exit code
EXIT_CODES = {"confirmed": 0, "not reproduced": 1, "undecided": 1, "error": 2}
RESULT_FILE = "confirm.json"


def ab_metric(store_metric: str) -> str:
    """The A/B metric of a store metric: ``<Stage>_ms`` -> ``<Stage>`` (e.g. DenoisingStage),
    ``e2e_ms`` -> ``warm_e2e``, ``first_result_ms`` -> ``first_result``, ``avg_denoise_step_ms``
    and ``median_denoise_step_ms`` -> ``denoising_step``.

    Raises:
        BisectError: a metric with no A/B counterpart (``--metric`` is then needed).
    """
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


@dataclass
class ConfirmResult:
    """A confirmation: the series, its step, the A/B (one :class:`Probe`), the outcome."""

    hardware: str
    case_id: str
    metric: str
    step: Step
    before: Commit
    after: Commit
    probe: Probe
    outcome: str
    message: str
    setup: dict[str, Any]
    stored: str = ""
    repo: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (shaped like ``bisect.json``: one probe)."""

        s = self.step
        keys = ("kind", "ratio", "low", "high", "mean_before", "mean_after", "n_before", "n_after")
        step = {k: getattr(s, k) for k in keys} | {"before_run": s.before.run_id, "after_run": s.after.run_id}
        return finite(
            {
                "kind": "confirm",
                "outcome": self.outcome,
                "exit_code": self.exit_code,
                "message": self.message,
                "repo": self.repo,
                "series": {"hardware": self.hardware, "case_id": self.case_id, "metric": self.metric},
                "step": step,
                "good": self.before.to_dict(),
                "bad": self.after.to_dict(),
                "launches": sum(self.probe.launches.values()),
                "probes": [{**self.probe.to_dict(), "commit": self.probe.commit.to_dict()}],
                "setup": self.setup,
                "stored": self.stored,
            }
        )


def _outcome(step: Step, probe: Probe) -> str:
    if probe.verdict in ("error", "undecided"):
        return probe.verdict
    return "confirmed" if probe.decision == step.kind else "not reproduced"


def confirm(
    store: str | Path,
    series: str,
    change: str,
    repo: str | Path,
    setup: ProbeSetup,
    out: str | Path,
    *,
    hardware: str | None = None,
    metric: str | None = None,
    tmp: str | Path | None = None,
) -> ConfirmResult:
    """A/B the commits either side of step ``change`` of ``series`` on ``metric`` (else
    :func:`ab_metric` of the series'; ``setup.metric`` is not read), store the outcome and
    write ``out/confirm.json`` and the probe's A/B under ``out/probe/``.

    Raises:
        HistoryError: no such series or step.
        BisectError: a commit of the step is not in ``repo``, the spec is bad, or the commit
            before could not be built (nothing to compare with).
    """
    t0 = time.time()
    out = Path(out)
    analysis, step = find_step(store, series, change, hardware=hardware)
    setup = replace(setup, metric=metric or ab_metric(analysis.metric))
    repo = Path(repo).resolve()
    check_repo(repo)
    setup.require_varies()
    shas = []
    for p in (step.before, step.after):
        try:
            shas.append(resolve(repo, p.commit))
        except BisectError:
            raise BisectError(
                f"{repo}: the step's commit {p.commit!r} (run {p.run_id}) is not in this repository"
            ) from None
    before, after = (commit_info(repo, s) for s in shas)
    out.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tmp) if tmp else None
    with worktree(repo, before.sha, tmpdir) as bdir, worktree(repo, after.sha, tmpdir) as adir:
        try:
            ref = prepare(bdir, setup, out / "before")
        except BisectError as exc:
            raise BisectError(
                f"the commit before the step {before.short} ({before.subject}): {exc}"
            ) from None
        try:
            spec = prepare(adir, setup, out / "probe")
        except BisectError as exc:
            probe = Probe(after, 1, "error", error=str(exc), out=str(out / "probe"))
        else:
            probe = compare(ref, spec, setup, out / "probe", after, 1)
    probe.wall_s = round(time.time() - t0, 1)
    outcome = _outcome(step, probe)
    what = f"{analysis.case_id} {analysis.metric} {step.change_pct:+.1f} % ({step.kind}) between {before.short} and {after.short}"
    iv = "" if probe.low is None else f" [{(probe.low - 1) * 100:+.1f} %, {(probe.high - 1) * 100:+.1f} %]"
    ab = f"the A/B says {probe.decision or 'nothing'} on {setup.metric}" + (
        f" ({(probe.ratio - 1) * 100:+.1f} %{iv})" if probe.ratio is not None else ""
    )
    tail = {"undecided": f"{ab}: {probe.reason}", "error": f"{probe.error}"}.get(outcome, ab)
    message = f"{outcome}: {what}; {tail}"
    a = analysis
    res = ConfirmResult(
        a.hardware, a.case_id, a.metric, step, before, after, probe, outcome, message, setup.to_dict(),
        repo=str(repo),
    )  # fmt: skip
    c = Confirmation(
        a.hardware, a.case_id, a.metric, step.before.commit, step.after.commit, step.kind, step.ratio,
        outcome, setup.metric, probe.decision or "", probe.ratio, probe.low, probe.high, probe.launches,
        probe.error or probe.reason, str(out), datetime.now(timezone.utc),
    )  # fmt: skip
    res.stored = str(add_confirmation(store, c))
    (out / RESULT_FILE).write_text(json.dumps(res.to_dict(), indent=1, default=str), encoding="utf-8")
    return res

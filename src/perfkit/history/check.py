"""``perfkit history check RUN``: is this run's value a new step against its series?

Not a fixed percentage: each value is judged against the current level of its own series
(hardware × case × metric) in the store, i.e. the runs since the series' last change point
(:mod:`perfkit.history.changepoints`), outliers and gaps left out. The run is a new step when
its value lies outside the level's prediction interval on log values,
``mean ± t(1 − max_pvalue/2, n − 1) · sd · √(1 + 1/n)`` (the interval a next run of that level
falls in with probability 1 − max_pvalue), and differs from the level's mean by more than
``min_magnitude`` (the same two settings the change point search uses). One run cannot tell a
step from a single-run outlier: the gate flags it, and the history sorts it out once later
runs are in.

Exit codes (the one rule, :mod:`perfkit.gate.verdicts`): 0 no regression step, 1 a regression
step, 2 bad input or nothing compared (no series with enough runs, every value a gap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from perfkit.common.numfmt import number_text
from perfkit.gate.verdicts import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION
from perfkit.history import changepoints as cp
from perfkit.history.store import HistoryRun


@dataclass
class CheckRow:
    """One value of the checked run against its series.

    ``status``: ``regression`` / ``improvement`` (a new step), ``ok`` (inside the level),
    ``not measured`` (the run's value is a gap), ``not compared`` (too few runs at the
    series' current level). ``before`` is the series' last run before this one (the commit
    range of a new step is ``before.commit`` .. ``commit``).
    """

    hardware: str
    case_id: str
    metric: str
    unit: str
    value: float | None
    status: str
    reason: str
    commit: str
    level: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    before: cp.Point | None = None

    @property
    def change_pct(self) -> float | None:
        if self.value is None or not self.level:
            return None
        return (self.value / self.level - 1) * 100


@dataclass
class CheckResult:
    rows: list[CheckRow]

    @property
    def compared(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status in ("ok", "regression", "improvement")]

    @property
    def exit_code(self) -> int:
        if not self.compared:
            return EXIT_ERROR
        return EXIT_REGRESSION if any(r.status == "regression" for r in self.rows) else EXIT_OK


def judge(
    history: Sequence[cp.Point], value: float, *, metric: str, settings: cp.Settings = cp.Settings()
) -> tuple[str, str, float | None, float | None, float | None, int]:
    """Judge one value against the current level of ``history`` (points in time order).

    Returns:
        ``(status, reason, level mean, low, high, n)``: status as in :class:`CheckRow` (never
        ``not measured``), the level's mean and prediction interval in the value's unit, and
        how many runs the level has.
    """
    a = cp.analyse(history, metric=metric, settings=settings)
    seg = np.array(a.segment_values(), dtype=float)
    if seg.size < settings.min_segment:
        return (
            "not compared",
            f"{seg.size} run(s) at the series' current level (needs {settings.min_segment})",
            None,
            None,
            None,
            int(seg.size),
        )
    y = np.log(seg)
    m, sd, n = float(y.mean()), float(y.std(ddof=1)), int(y.size)
    half = float(sps.t.ppf(1 - settings.max_pvalue / 2, n - 1)) * sd * math.sqrt(1 + 1 / n)
    half = max(half, math.log1p(settings.min_magnitude))
    level, low, high = math.exp(m), math.exp(m - half), math.exp(m + half)
    lv = math.log(value)
    if low <= value <= high:
        return "ok", f"inside the level's interval ({n} runs)", level, low, high, n
    up = lv > m
    status = "regression" if up == cp.higher_is_worse(metric) else "improvement"
    return status, f"a new step: outside the level's interval ({n} runs)", level, low, high, n


def check_runs(
    frame: pd.DataFrame, runs: Sequence[HistoryRun], settings: cp.Settings = cp.Settings()
) -> CheckResult:
    """Check every value of ``runs`` against the series in ``frame`` (a store frame,
    :func:`perfkit.history.store.read_store`), using only the runs before each checked run
    (the run itself, if stored, is left out)."""
    rows: list[CheckRow] = []
    groups = dict(tuple(frame.groupby(["hardware", "case_id", "metric"]))) if not frame.empty else {}
    for run in runs:
        key = run.key
        t = (
            pd.Timestamp(run.time).tz_convert("UTC")
            if pd.Timestamp(run.time).tzinfo
            else pd.Timestamp(run.time, tz="UTC")
        )
        for v in run.values:
            base = dict(
                hardware=run.hardware, case_id=v.case_id, metric=v.metric, unit=v.unit, commit=run.commit
            )
            if v.value is None or not math.isfinite(v.value) or v.value <= 0:
                rows.append(CheckRow(**base, value=None, status="not measured", reason=v.error or "no value"))
                continue
            g = groups.get((run.hardware, v.case_id, v.metric))
            pts: list[cp.Point] = []
            if g is not None:
                g = g[(g["run_key"] != key) & (g["time"] < t)].sort_values(["time", "run_key"])
                pts = [
                    cp.Point(
                        r.run_key,
                        r.run_id,
                        r.commit,
                        r.time.to_pydatetime(),
                        None if pd.isna(r.value) else float(r.value),
                        None if pd.isna(r.error) else str(r.error),
                    )
                    for r in g.itertuples(index=False)
                ]
            status, reason, level, low, high, n = judge(pts, v.value, metric=v.metric, settings=settings)
            before = next((p for p in reversed(pts) if p.value is not None), None)
            rows.append(
                CheckRow(
                    **base,
                    value=v.value,
                    status=status,
                    reason=reason,
                    level=level,
                    low=low,
                    high=high,
                    n=n,
                    before=before,
                )
            )
    return CheckResult(rows)


def _n(x: float | None) -> str:
    return "–" if x is None else number_text(x)


def summary_markdown(result: CheckResult, commit_url: str | None = None) -> str:
    """summary.md of a history check: the verdict, every new step (series, step, commit range)
    and a table of every value checked."""

    def link(c: str) -> str:
        return f"[`{c[:10]}`]({commit_url.format(commit=c)})" if commit_url else f"`{c[:10]}`"

    code = result.exit_code
    verdict = {
        EXIT_OK: "PASS",
        EXIT_REGRESSION: "FAIL: regression step",
        EXIT_ERROR: "ERROR: nothing compared",
    }[code]
    out = [f"# History check: {verdict}", ""]
    counts = pd.Series([r.status for r in result.rows]).value_counts().to_dict() if result.rows else {}
    out.append(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no value checked")
    out.append("")
    steps = [r for r in result.rows if r.status in ("regression", "improvement")]
    if steps:
        out += ["## New steps", ""]
        for r in steps:
            rng = f"{link(r.before.commit)} .. {link(r.commit)}" if r.before else link(r.commit)
            out.append(
                f"- **{r.status}** {r.hardware} / `{r.case_id}` {r.metric}: {_n(r.level)} → {_n(r.value)} {r.unit} "
                f"({r.change_pct:+.1f} %; level interval {_n(r.low)}–{_n(r.high)}, {r.n} runs), commit range {rng}"
            )
        out.append("")
    out += [
        "## Values",
        "",
        "| hardware | case | metric | value | level | interval | change | status | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result.rows:
        ch = "–" if r.change_pct is None else f"{r.change_pct:+.1f} %"
        iv = "–" if r.low is None else f"{_n(r.low)}–{_n(r.high)}"
        out.append(
            f"| {r.hardware} | `{r.case_id}` | {r.metric} | {_n(r.value)} {r.unit} | {_n(r.level)} | {iv} | {ch} "
            f"| {r.status} | {r.reason.replace('|', '/')} |"
        )
    return "\n".join(out) + "\n"


def write_summary(result: CheckResult, out_dir: str | Path, commit_url: str | None = None) -> Path:
    """Write ``out_dir/summary.md`` (created) and return its path."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "summary.md"
    p.write_text(summary_markdown(result, commit_url))
    return p

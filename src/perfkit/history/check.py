"""``perfkit history check RUN`` (is each value a new step against its series' level?), the
history's tables and the other ``perfkit history`` commands as functions. The rule and exit
codes: docs/history.md ("Gate")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from perfkit.common import SUMMARY_LIMIT
from perfkit.common.numfmt import number_text
from perfkit.common.slugs import md_text
from perfkit.gate.verdicts import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION
from perfkit.history import changepoints as cp
from perfkit.history.runs import read_baseline_history, read_nightly, read_run
from perfkit.history.store import AddResult, HistoryError, HistoryRun, add_runs, read_store, runs_frame, utc


@dataclass
class Judgement:
    """One value against its series' current level: ``status`` (``regression``, ``improvement``,
    ``ok``, ``not measured``, ``not compared``, ``not gated``, ``unconfirmed``; docs/history.md,
    "Gate"); ``level``, ``low``, ``high`` of the nearest mode (the value's unit); ``since`` its start."""

    status: str
    reason: str
    level: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    since: cp.Point | None = None


@dataclass(kw_only=True)
class CheckRow(Judgement):
    """One value of the checked run; a new step's commit range is ``before.commit`` .. ``commit``."""

    hardware: str
    case_id: str
    metric: str
    unit: str
    value: float | None
    commit: str
    before: cp.Point | None = None

    @property
    def change_pct(self) -> float | None:
        """The value's change from the level in percent (None: no value or no level)."""
        if self.value is None or not self.level:
            return None
        return (self.value / self.level - 1) * 100


@dataclass
class CheckResult:
    """The rows of a history check."""

    rows: list[CheckRow]

    @property
    def exit_code(self) -> int:
        """EXIT_REGRESSION on a regression, EXIT_ERROR when no row could be judged, else EXIT_OK."""
        if not any(r.status in ("ok", "regression", "improvement", "unconfirmed") for r in self.rows):
            return EXIT_ERROR
        return EXIT_REGRESSION if any(r.status == "regression" for r in self.rows) else EXIT_OK


def judge(
    history: Sequence[cp.Point], value: float, *, metric: str, settings: cp.Settings = cp.Settings()
) -> Judgement:
    """Judge one value (> 0) against the current level of ``history`` (docs/history.md, "Gate")."""
    a = cp.analyse(history, metric=metric, settings=settings)
    seg = a.segment_values()
    lv = cp.level_model(seg, settings)
    if lv is None:
        why = f"{len(seg)} run(s) at the series' current level (needs {settings.min_segment})"
        return Judgement("not compared", why, n=len(seg))
    near = min(lv.modes, key=lambda m: abs(math.log(value / m.mean)))
    since = a.steps[-1].after if a.steps else None
    out = dict(level=near.mean, low=near.low, high=near.high, n=lv.n, since=since)
    two = len(lv.modes) == 2
    where = f" ({lv.text()})" if two else ""
    if lv.step > settings.max_step:
        step = f"the smallest step it could see is +{lv.step * 100:.0f} %"
        return Judgement("not gated", f"noise {lv.noise * 100:.1f} % over {lv.n} runs: {step}{where}", **out)
    if any(m.low <= value <= m.high for m in lv.modes) or (
        two and lv.modes[0].high < value < lv.modes[1].low
    ):
        return Judgement("ok", f"inside the level's interval ({lv.n} runs){where}", **out)
    status = "regression" if (value > near.mean) == cp.higher_is_worse(metric) else "improvement"
    if status == "regression" and not _confirmed(history, metric, settings):
        why = f"outside the level's interval ({lv.n} runs){where}; a regression once {settings.confirm_runs} runs in a row are"
        return Judgement("unconfirmed", why, **out)
    return Judgement(status, f"a new step: outside the level's interval ({lv.n} runs){where}", **out)


def _confirmed(history: Sequence[cp.Point], metric: str, settings: cp.Settings) -> bool:
    """Whether the ``confirm_runs`` − 1 measured runs before were each a regression."""
    need = settings.confirm_runs - 1
    prev = [i for i, p in enumerate(history) if p.value is not None][-need:] if need > 0 else []
    one = replace(settings, confirm_runs=1)
    return len(prev) == need and all(
        judge(history[:i], float(history[i].value), metric=metric, settings=one).status == "regression"
        for i in prev
    )


def check_runs(
    frame: pd.DataFrame, runs: Sequence[HistoryRun], settings: cp.Settings = cp.Settings()
) -> CheckResult:
    """Check every value of ``runs`` against the runs before it in ``frame`` (a store frame)."""
    rows: list[CheckRow] = []
    groups = dict(tuple(frame.groupby(["hardware", "case_id", "metric"]))) if not frame.empty else {}
    for run in runs:
        key = run.key
        t = pd.Timestamp(utc(run.time))
        for v in run.values:
            base = dict(
                hardware=run.hardware, case_id=v.case_id, metric=v.metric, unit=v.unit, commit=run.commit
            )
            if v.value is None or not math.isfinite(v.value) or v.value <= 0:
                rows.append(CheckRow(**base, value=None, status="not measured", reason=v.error or "no value"))
                continue
            g = groups.get((run.hardware, v.case_id, v.metric))
            pts = [] if g is None else cp.frame_points(g[(g["run_key"] != key) & (g["time"] < t)])
            j = judge(pts, v.value, metric=v.metric, settings=settings)
            # a confirmed step began at the first of its confirm_runs runs
            k = settings.confirm_runs if j.status == "regression" else 1
            measured = [p for p in pts if p.value is not None]
            before = measured[-k] if len(measured) >= k else None
            rows.append(CheckRow(**vars(j), **base, value=v.value, before=before))
    return CheckResult(rows)


def _n(x: float | None) -> str:
    return "–" if x is None else number_text(x)


def summary_markdown(result: CheckResult, commit_url: str | None = None, limit: int = SUMMARY_LIMIT) -> str:
    """summary.md of a history check: the verdict, every new step and a table of every value
    checked, at most ``limit`` characters (rows past it left out and counted)."""
    from urllib.parse import quote

    def link(c: str) -> str:
        label = md_text(c[:10], code=True)
        return f"[{label}]({commit_url.format(commit=quote(c[:64], safe=''))})" if commit_url else label

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
                f"- **{r.status}** {md_text(r.hardware, limit=100)} / {md_text(r.case_id, code=True, limit=200)} "
                f"{md_text(r.metric, limit=100)}: "
                f"{_n(r.level)} → {_n(r.value)} {md_text(r.unit, limit=20)} "
                f"({r.change_pct:+.1f} %; level interval {_n(r.low)}–{_n(r.high)}, {r.n} runs), commit range {rng}"
            )
        out.append("")
    out += [
        "## Values",
        "",
        "| hardware | case | metric | value | level | interval | change | status | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    size = sum(len(x) + 1 for x in out)
    for i, r in enumerate(result.rows):
        ch = "–" if r.change_pct is None else f"{r.change_pct:+.1f} %"
        iv = "–" if r.low is None else f"{_n(r.low)}–{_n(r.high)}"
        row = (
            f"| {md_text(r.hardware, cell=True, limit=100)} | {md_text(r.case_id, cell=True, code=True, limit=200)} "
            f"| {md_text(r.metric, cell=True, limit=100)} | {_n(r.value)} {md_text(r.unit, cell=True, limit=20)} "
            f"| {_n(r.level)} | {iv} | {ch} | {md_text(r.status, cell=True)} | {md_text(r.reason, cell=True, limit=400)} |"
        )
        if size + len(row) + 200 > limit:
            out += [
                "",
                f"{len(result.rows) - i} more values left out (summary.md stays under {limit:,} characters)",
            ]
            break
        out.append(row)
        size += len(row) + 1
    return "\n".join(out) + "\n"


def changes_markdown(analyses: Sequence[cp.Analysis], settings: cp.Settings = cp.Settings()) -> str:
    """Per case: runs, gaps, outliers, steps and its current level as the gate sees it; then
    :func:`changes_table`."""
    out = [
        "| case | runs | gaps | outliers | steps | current level (the gate's model) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for a in analyses:
        lv = a.level(settings)
        now = (
            "fewer than 3 runs"
            if lv is None
            else f"not gated: noise {lv.noise * 100:.1f} %, smallest step seen +{lv.step * 100:.0f} %"
            if lv.step > settings.max_step
            else f"{lv.text(a.unit)}, smallest step seen +{lv.step * 100:.1f} %"
        )
        out.append(
            f"| {md_text(a.case_id, cell=True, code=True)} | {len(a.points)} | {len(a.gaps)} | {len(a.outliers)} | {len(a.steps)} | {now} |"
        )
    s = settings
    why = f"A level needs at least {s.min_segment} runs, a step p < {s.max_pvalue} and a size > {s.min_magnitude:.0%}."
    return "\n".join(out) + f"\n\n{why.replace('%', ' %')}\n\n" + changes_table(changes(analyses))


def _replay_series(a: cp.Analysis, settings: cp.Settings) -> dict[str, Any]:
    verdicts = {
        p.run_key: judge(a.points[:i], p.value, metric=a.metric, settings=settings)
        for i, p in enumerate(a.points)
        if p.value is not None
    }
    after = [s.after.time for s in a.steps[1:]]
    outliers = {p.run_key for p, _ in a.outliers}

    def at_step(p: cp.Point) -> int | None:
        """The regression step whose onset ``p`` is (docs/history.md, "Replay")."""
        for n, s in enumerate(a.steps):
            end = after[n] if n < len(after) else None
            since = verdicts[p.run_key].since
            if (
                s.kind == "regression"
                and p.run_key not in outliers
                and s.after.time <= p.time
                and (end is None or p.time < end)
                and (since is None or since.time < s.after.time)
                and abs(math.log(p.value / s.mean_after)) < abs(math.log(p.value / s.mean_before))
            ):
                return n
        return None

    measured = [p for p in a.points if p.value is not None]
    st = [verdicts[p.run_key].status for p in measured]  # unconfirmed: --confirm 1's regression
    alarms = {
        "rule": [p for p, _ in cp.last3_alarms(a.points)],
        "perfkit": [p for p, s in zip(measured, st) if s == "regression"],
        "confirm1": [p for p, s in zip(measured, st) if s in ("regression", "unconfirmed")],
    }
    row: dict[str, Any] = {"case": a.case_id, "runs": len(verdicts)}
    row["steps"] = sum(s.kind == "regression" for s in a.steps)
    caught = {}
    for who, ps in alarms.items():
        hits = [at_step(p) for p in ps]
        caught[who] = {n for n in hits if n is not None}
        row[f"{who}_alarms"], row[f"{who}_false"] = len(ps), hits.count(None)
        row[f"{who}_caught"] = len(caught[who])
        row[f"{who}_missed"] = len(caught["rule"] - caught[who])
    for st in ("not gated", "not compared"):
        row[st.replace(" ", "_")] = sum(v.status == st for v in verdicts.values())
    return row


def replay(runs: Sequence[HistoryRun], settings: cp.Settings = cp.Settings()) -> pd.DataFrame:
    """Replay ``runs`` day by day, each value judged against the runs before it, beside sglang's
    5 % rule (docs/history.md, "Replay"). One row per case: ``case``, ``runs``, ``steps``, for
    ``rule``, ``perfkit``, ``confirm1`` each ``<who>_alarms``, ``_false``, ``_caught``,
    ``_missed``; ``not_gated``, ``not_compared``."""
    frame = runs_frame(runs)
    return pd.DataFrame([_replay_series(a, settings) for a in cp.analyse_frame(frame, settings)])


def _run(p: cp.Point) -> dict[str, Any]:
    return {"commit": p.commit, "run_id": p.run_id, "time": p.time.isoformat()}


def changes(analyses: Sequence[cp.Analysis]) -> dict[str, list[dict[str, Any]]]:
    """``perfkit history changes`` as data: ``steps`` (each with its ``number`` in the series) and
    ``events``."""
    steps = []
    for a in analyses:
        for n, s in enumerate(a.steps, 1):
            pct = [None if x is None else (x - 1) * 100 for x in (s.low, s.high)]
            row = {"hardware": a.hardware, "case": a.case_id, "metric": a.metric, "unit": a.unit, "number": n}
            row |= {"before": _run(s.before), "after": _run(s.after), "change_pct": s.change_pct}
            row |= {k: getattr(s, k) for k in ("mean_before", "mean_after", "kind", "n_before", "n_after")}
            steps.append(row | {"low_pct": pct[0], "high_pct": pct[1]})
    events = []
    for e in cp.events(analyses):
        moved = [
            {"case": a.case_id, "metric": a.metric, "change_pct": s.change_pct, "kind": s.kind}
            for a, s in e.members
        ]
        events.append(
            {"hardware": e.hardware, "before": _run(e.before), "after": _run(e.after), "series": moved}
        )
    return {"steps": steps, "events": events}


def changes_table(data: dict[str, list[dict[str, Any]]]) -> str:
    """:func:`changes` as two Markdown tables (commits 8 characters, times to the minute)."""

    def rng(x: dict[str, Any]) -> str:
        b, f = x["before"], x["after"]
        return (
            f"{md_text(b['commit'][:8], code=True)} ({md_text(b['time'][:16])}) .. "
            f"{md_text(f['commit'][:8], code=True)} ({md_text(f['time'][:16])})"
        )

    out = [
        f"{len(data['steps'])} change point(s):",
        "",
        "| hardware | case | metric | # | last run before .. first run after | level before → after | change "
        "| 95 % interval | kind | runs before, after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in data["steps"]:
        iv = "–" if x["low_pct"] is None else f"{x['low_pct']:+.1f} % to {x['high_pct']:+.1f} %"
        out.append(
            f"| {md_text(x['hardware'], cell=True)} | {md_text(x['case'], cell=True, code=True)} "
            f"| {md_text(x['metric'], cell=True)} | {x['number']} | {rng(x)} "
            f"| {number_text(x['mean_before'])} → {number_text(x['mean_after'])} {md_text(x['unit'], cell=True)} "
            f"| {x['change_pct']:+.1f} % | {iv} | {x['kind']} | {x['n_before']}, {x['n_after']} |"
        )
    out += ["", f"{len(data['events'])} event(s) (steps whose commit ranges share a time):", ""]
    out += ["| hardware | commit range | series moved |", "| --- | --- | --- |"]
    for e in data["events"]:
        moved = "; ".join(
            f"{md_text(m['case'], code=True)} {md_text(m['metric'])} {m['change_pct']:+.1f} %"
            for m in e["series"]
        )
        out.append(f"| {md_text(e['hardware'], cell=True)} | {rng(e)} | {moved} |")
    return "\n".join(out) + "\n"


def replay_markdown(df: pd.DataFrame) -> str:
    """:func:`replay`'s frame as a Markdown table and a count of false alarms and steps missed."""
    out = [
        "| case | runs | regression steps | 5 % rule: alarms, false, steps caught | perfkit (default, "
        f"{cp.Settings().confirm_runs} runs in a row): alarms, false, steps caught | perfkit `--confirm 1` "
        "| not gated | not compared |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    t = df.sum(numeric_only=True)
    for r in [*df.to_dict("records"), {**t.to_dict(), "case": None}]:  # the cases, then all
        cells = []
        for w in ("rule", "perfkit", "confirm1"):
            missed = r["case"] is not None and w != "rule" and r[w + "_missed"]
            cells.append(
                f"{r[w + '_alarms']}, {r[w + '_false']}, {r[w + '_caught']}"
                + (f" (missed {r[w + '_missed']})" if missed else "")
            )
        case = "all" if r["case"] is None else md_text(r["case"], cell=True, code=True)
        out.append(
            f"| {case} | {r['runs']} | {r['steps']} | {' | '.join(cells)} | {r['not_gated']} | {r['not_compared']} |"
        )
    some = df[df["rule_false"] > 0]
    out.append("")
    for w, name in (("perfkit", "perfkit (default)"), ("confirm1", "perfkit `--confirm 1`")):
        fewer = int((some[w + "_false"] < some["rule_false"]).sum())
        out.append(
            f"- {name}: fewer false alarms than the rule on {fewer} of the {len(some)} cases where the rule "
            f"has any; {int(df[w + '_missed'].sum())} of the rule's {int(t['rule_caught'])} caught steps missed."
        )
    return "\n".join(out) + "\n"


def add(
    store: str | Path, paths: Sequence[str | Path], *, commit: str | None = None, hardware: str | None = None
) -> AddResult:
    """``perfkit history add``: read every path first (a bad one stores nothing). Raises HistoryError."""
    runs = [r for p in paths for r in read_run(p, commit=commit, hardware=hardware)]
    return add_runs(store, runs)


def import_baselines(
    store: str | Path, repo: str | Path, path: str, *, hardware: str | None = None
) -> tuple[AddResult, list[str]]:
    """``perfkit history import REPO --baselines FILE``: every committed version of the file.
    Returns what was stored and a note per version skipped. Raises HistoryError: none read."""
    runs, skipped = read_baseline_history(repo, path, hardware=hardware)
    if not runs:
        raise HistoryError(f"{repo}: {path}: no version could be read:\n  " + "\n  ".join(skipped))
    return add_runs(store, runs), skipped


def import_nightly(store: str | Path, path: str | Path, *, hardware: str) -> AddResult:
    """``perfkit history import``: sglang's nightly comparison files under ``path``. Raises HistoryError."""
    return add_runs(store, read_nightly(path, hardware))


def check(
    store: str | Path,
    path: str | Path,
    out_dir: str | Path | None = None,
    *,
    hardware: str | None = None,
    commit: str | None = None,
    commit_url: str | None = None,
    settings: cp.Settings = cp.Settings(),
) -> tuple[CheckResult, Path]:
    """``perfkit history check``: judge the run at ``path`` (a nightly ``*.json`` with ``hardware``,
    or a perfkit run/A-B/bundle directory) and write ``out_dir/summary.md`` (default
    ``path/history/`` or ``outputs/history-check/<stem>/``). Returns (result, summary path)."""
    p = Path(path)
    if out_dir is None:
        out_dir = p / "history" if p.is_dir() else Path("outputs/history-check") / p.stem
    if p.is_file() and p.suffix == ".json":
        if not hardware:
            raise HistoryError(f"{p}: a nightly comparison file does not name its hardware; give --hardware")
        runs = read_nightly(p, hardware)
    else:
        runs = read_run(p, commit=commit, hardware=hardware)
    res = check_runs(read_store(store), runs, settings)
    summary = Path(out_dir) / "summary.md"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(summary_markdown(res, commit_url))
    return res, summary


def store_changes(
    store: str | Path, *, hardware: str | None = None, case: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """``perfkit history changes`` of the store (one hardware, case when given). Raises
    HistoryError when no series matches."""
    return changes(
        _analyses(store, " stored" + (f" for case {case!r}" if case else ""), hardware, case_id=case)
    )


def _analyses(store: str | Path, what: str, hardware: str | None, **match: str | None) -> list[cp.Analysis]:
    """The store's series of ``hardware`` whose columns equal ``match`` (None: any)."""
    df = read_store(store, hardware=hardware)
    for col, v in match.items():
        if v is not None:
            df = df[df[col] == v]
    if df.empty:
        raise HistoryError(f"{store}: no series{what}")
    return cp.analyse_frame(df)


def find_step(
    store: str | Path, series: str, change: str, *, hardware: str | None = None
) -> tuple[cp.Analysis, cp.Step]:
    """The step ``change`` (its number from 1, or a commit prefix of 4+ hex digits of the run
    after or before) of ``series`` (``CASE/METRIC``). Raises HistoryError: a malformed or missing
    series, several hardware without ``hardware``, no such step (the steps named)."""
    if "/" not in series:
        raise HistoryError(f"series {series!r}: expected CASE/METRIC (e.g. tiny/DenoisingStage_ms)")
    case_id, metric = series.rsplit("/", 1)
    on = f" on hardware {hardware!r}" if hardware else ""
    analyses = _analyses(store, f" {series!r}{on} stored", hardware, case_id=case_id, metric=metric)
    if len(analyses) > 1:
        hws = ", ".join(a.hardware for a in analyses)
        raise HistoryError(f"series {series!r} is stored for several hardware ({hws}): give --hardware")
    (analysis,) = analyses
    steps = analysis.steps
    listed = (
        "; ".join(
            f"{i}: {s.before.commit[:10]} .. {s.after.commit[:10]} ({s.change_pct:+.1f} %)"
            for i, s in enumerate(steps, 1)
        )
        or "none"
    )
    if change.isdigit() and len(change) < 4:
        k = int(change)
        if not 1 <= k <= len(steps):
            raise HistoryError(f"series {series!r} has no step {k}; its steps: {listed}")
        return analysis, steps[k - 1]
    c = change.lower()
    hits = [s for s in steps if s.after.commit.lower().startswith(c)] or [
        s for s in steps if s.before.commit.lower().startswith(c)
    ]
    if len(c) < 4 or not hits:
        raise HistoryError(f"series {series!r} has no step at commit {change!r}; its steps: {listed}")
    return analysis, hits[0]

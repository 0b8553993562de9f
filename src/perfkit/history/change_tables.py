"""Tables of a history: ``perfkit history changes`` (:func:`changes`, :func:`changes_table`),
and the docs tables of ``docs/history-sglang-nightly.md`` (``perfkit figures`` kinds
``history-nightly``: :func:`changes_markdown`; ``history-replay``: :func:`replay`, sglang's nightly
replayed day by day beside its "5 % over the mean of the last 3 runs" rule)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from perfkit.common.numfmt import number_text
from perfkit.common.slugs import md_text
from perfkit.history import changepoints as cp
from perfkit.history.check import judge
from perfkit.history.store import HistoryRun, runs_frame


def changes_markdown(analyses: Sequence[cp.Analysis], settings: cp.Settings = cp.Settings()) -> str:
    """Per case: runs, gaps, outliers, steps and its current level as the gate sees it (one
    mode, two, or not gated with its noise); then every change point and event
    (:func:`changes_table`)."""
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
    """One series of :func:`replay`."""
    verdicts = {
        p.run_key: judge(a.points[:i], p.value, metric=a.metric, settings=settings)
        for i, p in enumerate(a.points)
        if p.value is not None
    }
    after = [s.after.time for s in a.steps[1:]]
    outliers = {p.run_key for p, _ in a.outliers}

    def at_step(p: cp.Point) -> int | None:
        """The regression step whose onset ``p`` is: in its new level, nearer its new mean,
        no outlier, while the gate's level still began before it."""
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
    """Replay ``runs`` day by day: each measured value judged by
    :func:`perfkit.history.check.judge` against the runs before it, beside sglang's 5 % rule
    (:func:`perfkit.history.changepoints.last3_alarms`); "at a step" as in docs/history.md
    ("Replay"). ``perfkit``: ``settings``; ``confirm1``: ``--confirm 1``.

    Returns:
        one row per case: ``case``, ``runs`` (measured), ``steps`` (regression steps of the
        whole history); for ``rule``, ``perfkit`` and ``confirm1`` each ``<who>_alarms``,
        ``<who>_false``, ``<who>_caught`` (steps alarmed at) and ``<who>_missed`` (steps the
        rule caught and it did not); ``not_gated``, ``not_compared`` (runs perfkit did not
        judge).
    """
    frame = runs_frame(runs)
    return pd.DataFrame([_replay_series(a, settings) for a in cp.analyse_frame(frame, settings)])


def _run(p: cp.Point) -> dict[str, Any]:
    return {"commit": p.commit, "run_id": p.run_id, "time": p.time.isoformat()}


def changes(analyses: Sequence[cp.Analysis]) -> dict[str, list[dict[str, Any]]]:
    """``perfkit history changes`` as data: ``steps`` (every change point with its ``number``
    in the series, as ``history confirm`` takes it) and ``events`` (the narrowest common commit
    range and each series moved)."""
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
    """:func:`replay`'s frame as a Markdown table with a closing count of the goal: fewer false
    alarms than the rule on every case where the rule has any, and no step the rule caught
    missed."""
    out = [
        "| case | runs | regression steps | 5 % rule: alarms, false, steps caught | perfkit (default, "
        f"{cp.Settings().confirm_runs} runs in a row): alarms, false, steps caught | perfkit `--confirm 1` "
        "| not gated | not compared |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in df.itertuples(index=False):
        cell = [
            f"{getattr(r, w + '_alarms')}, {getattr(r, w + '_false')}, {getattr(r, w + '_caught')}"
            + (f" (missed {getattr(r, w + '_missed')})" if w != "rule" and getattr(r, w + "_missed") else "")
            for w in ("rule", "perfkit", "confirm1")
        ]
        out.append(
            f"| {md_text(r.case, cell=True, code=True)} | {r.runs} | {r.steps} | {' | '.join(cell)} | {r.not_gated} | {r.not_compared} |"
        )
    t = df.sum(numeric_only=True)
    out.append(
        f"| all | {t['runs']} | {t['steps']} | "
        + " | ".join(
            f"{t[w + '_alarms']}, {t[w + '_false']}, {t[w + '_caught']}"
            for w in ("rule", "perfkit", "confirm1")
        )
        + f" | {t['not_gated']} | {t['not_compared']} |"
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

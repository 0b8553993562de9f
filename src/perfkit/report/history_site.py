"""The history site (``perfkit history site``, docs/history.md) and the bisect and confirm reports."""

from __future__ import annotations

import base64
import functools
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from perfkit.checks import is_reported
from perfkit.common.numfmt import change_text, number_text
from perfkit.common.slugs import md_text
from perfkit.history import changepoints as cp
from perfkit.history.check import judge
from perfkit.history.store import HistoryError, read_confirmations, read_store
from perfkit.report.ab import design_text
from perfkit.report.plots import alt_text, figure_to_png_bytes
from perfkit.report.render import template_env, write_tool_outputs
from perfkit.report.tables import format_table, markdown_table

if TYPE_CHECKING:  # annotations only: matplotlib is imported where a figure is drawn
    from matplotlib.figure import Figure


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "hardware"


def _commit_link(commit: str, template: str | None) -> dict[str, str | None]:
    """``{"text": short hash, "url", "full"}``; raises ValueError: a template not http(s)."""
    if template and not template.lower().startswith(("https://", "http://")):
        raise ValueError(f"commit URL template {template!r} must start with https:// or http://")
    return {"text": commit[:10], "url": template.format(commit=commit) if template else None, "full": commit}


def trend_figure(a: cp.Analysis) -> Figure:
    """The trend of one series over run time (UTC): values, level means, steps, outliers, gaps."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 2.8), dpi=80)  # pyplot-free: no global backend, nothing to close
    ax = fig.add_subplot()
    bad = {p.run_key for p, _ in a.outliers} | {p.run_key for p in a.gaps}
    kept = [p for p in a.points if p.run_key not in bad]
    ax.plot(
        [p.time for p in kept], [p.value for p in kept], "-o", ms=2.5, lw=0.8, color="#0969da", label="run"
    )
    if a.outliers:
        ax.plot(
            *zip(*[(p.time, p.value) for p, _ in a.outliers]), "x", color="#cf222e", ms=6, label="outlier"
        )
    bounds = [kept[0].time] if kept else []
    for s in a.steps:
        ax.axvline(s.after.time, color="#bf8700", ls="--", lw=1)
        bounds.append(s.after.time)
    if kept:
        bounds.append(kept[-1].time)
        means = [s.mean_before for s in a.steps] + ([a.steps[-1].mean_after] if a.steps else [])
        if not a.steps:
            means = [sum(p.value for p in kept) / len(kept)]
        for (t0, t1), m in zip(zip(bounds[:-1], bounds[1:]), means):
            ax.hlines(m, t0, t1, color="#1a7f37", lw=2, alpha=0.7)
    if a.gaps:
        lo = min([p.value for p in kept] or [0.0])
        ax.plot([p.time for p in a.gaps], [lo] * len(a.gaps), "|", color="#6e7781", ms=10, label="gap")
    ax.set_title(f"{a.case_id}: {a.metric} on {a.hardware}", fontsize=10)
    ax.set_xlabel("run time (UTC)")
    ax.set_ylabel(f"{a.metric} ({a.unit})")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def _latest(a: cp.Analysis, settings: cp.Settings) -> dict[str, Any]:
    p = a.points[-1]
    if p.value is None:
        return {"status": "gap", "text": f"not measured: {p.error or 'no value'}", "point": p}
    j = judge(a.points[:-1], p.value, metric=a.metric, settings=settings)
    reason = j.reason
    if j.level is not None:
        reason += f"; level {number_text(j.level)} ({number_text(j.low)}–{number_text(j.high)}) {a.unit}"
    return {"status": j.status, "text": f"{number_text(p.value)} {a.unit}: {reason}", "point": p}


def _confirmed(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "–"
    iv = f" [{change_text(row['low'])} to {change_text(row['high'])}]" if is_reported(row.get("low")) else ""
    ab = f": A/B {change_text(row['ratio'])}{iv}" if is_reported(row.get("ratio")) else ""
    return f"{row['outcome']}{ab} ({row['time']:%Y-%m-%d})"


def series_context(
    a: cp.Analysis,
    commit_url: str | None,
    settings: cp.Settings,
    confirmations: Mapping[tuple[str, ...], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """What the template shows for one series (``confirmations``: step key -> latest confirmation)."""
    fig = trend_figure(a)
    png = base64.b64encode(figure_to_png_bytes(fig, dpi=80)).decode("ascii")
    alt = alt_text(fig)
    steps = [
        {
            "kind": s.kind,
            "before": _commit_link(s.before.commit, commit_url),
            "after": _commit_link(s.after.commit, commit_url),
            "before_time": f"{s.before.time:%Y-%m-%d %H:%M}",
            "after_time": f"{s.after.time:%Y-%m-%d %H:%M}",
            "between": len(s.between),
            "levels": f"{number_text(s.mean_before)} → {number_text(s.mean_after)} {a.unit}",
            "change": change_text(s.ratio),
            "interval": "–" if s.low is None else f"{change_text(s.low)} to {change_text(s.high)}",
            "runs": f"{s.n_before} / {s.n_after}",
            "confirmed": _confirmed(
                (confirmations or {}).get((a.hardware, a.case_id, a.metric, s.before.commit, s.after.commit))
            ),
        }
        for s in a.steps
    ]
    outliers = [
        {
            "time": f"{p.time:%Y-%m-%d %H:%M}",
            "commit": _commit_link(p.commit, commit_url),
            "value": f"{number_text(p.value)} {a.unit}",
            "ratio": f"× {r:.2f}",
        }
        for p, r in a.outliers
    ]
    gaps = Counter((p.error or "no value")[:160] for p in a.gaps)
    return {
        "id": _slug(f"{a.case_id}-{a.metric}"),
        "case": a.case_id,
        "metric": a.metric,
        "png": png,
        "alt": alt,
        "n": len(a.points),
        "noise": "–" if not math.isfinite(a.noise) else f"{a.noise * 100:.1f} %",
        "steps": steps,
        "outliers": outliers,
        "gaps": [{"reason": k, "count": v} for k, v in gaps.most_common()],
        "latest": {
            **_latest(a, settings),
            "commit": _commit_link(a.points[-1].commit, commit_url),
            "time": f"{a.points[-1].time:%Y-%m-%d %H:%M}",
        },
    }


def write_site(
    store: str | Path,
    out: str | Path,
    *,
    commit_url: str | None = None,
    settings: cp.Settings = cp.Settings(),
) -> list[Path]:
    """Write the site of ``store`` to ``out``; the pages, index first. Raises HistoryError."""
    frame = read_store(store)
    if frame.empty:
        raise HistoryError(f"{store}: the history store has no runs")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = template_env()
    analyses = cp.analyse_frame(frame, settings)
    conf = read_confirmations(store)
    keys = ["hardware", "case_id", "metric", "before_commit", "after_commit"]
    # oldest first: the latest confirmation of a step wins
    confirmations = {tuple(r[k] for k in keys): r for r in conf.to_dict("records")}
    hw_pages = []
    for hw in sorted(frame["hardware"].unique()):
        rows = frame[frame["hardware"] == hw]
        mine = [a for a in analyses if a.hardware == hw]
        cases: dict[str, list[dict[str, Any]]] = {}
        for a in mine:
            cases.setdefault(a.case_id, []).append(series_context(a, commit_url, settings, confirmations))
        latest = rows.sort_values("time").iloc[-1]
        page = out / f"{_slug(hw)}.html"
        info = {
            "hardware": hw,
            "href": page.name,
            "runs": rows["run_key"].nunique(),
            "steps": sum(len(a.steps) for a in mine),
            "last": f"{rows['time'].max():%Y-%m-%d}",
        }
        page.write_text(
            env.get_template("history/hardware.html.j2").render(
                **info,
                first=f"{rows['time'].min():%Y-%m-%d}",
                latest_commit=_commit_link(str(latest["commit"]), commit_url),
                sources=", ".join(sorted(rows["source"].unique())),
                events=[e for e in cp.events(mine) if len(e.members) > 1],
                link=functools.partial(_commit_link, template=commit_url),
                change_text=change_text,
                cases=cases,
                n_steps=info["steps"],
                n_outliers=sum(len(a.outliers) for a in mine),
                settings=settings,
            )
        )
        hw_pages.append({**info, "cases": len(cases)})
    index = out / "index.html"
    index.write_text(env.get_template("history/index.html.j2").render(pages=hw_pages, store=str(store)))
    return [index, *(out / p["href"] for p in hw_pages)]


_REPORT_FILE = "report.html"


def _commit(c: Mapping[str, Any] | None) -> str:
    return "?" if not c else f"{c['short']} {c['subject']}"


def _probes_frame(d: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for i, p in enumerate(d.get("probes") or [], 1):
        c = p.get("commit") or {}
        la = p.get("launches") or {}
        rows.append(
            {
                "probe": i,
                "position": p.get("position"),
                "commit": c.get("short"),
                "subject": c.get("subject"),
                "author date": c.get("author_date"),
                "status": p.get("verdict"),
                "A/B decision": p.get("decision") or "–",
                "B/A": change_text(p.get("ratio")),
                "interval": "–"
                if p.get("low") is None
                else f"[{change_text(p.get('low'))}, {change_text(p.get('high'))}]",
                "launches A/B": f"{la.get('A', 0)}/{la.get('B', 0)}",
                "note": p.get("error") or p.get("reason") or "",
            }
        )
    return pd.DataFrame(rows)


def _facts(d: Mapping[str, Any], md: bool = True) -> list[str]:
    """The facts as Markdown lines, or plain text for the page (``md=False``: it escapes)."""

    c = functools.partial(md_text, code=True) if md else str  # a name, in code font
    t = md_text if md else str  # words from outside
    s = d.get("setup") or {}
    how = (
        f"metric {t(s.get('metric'))}, threshold ±{float(s.get('threshold', 0.05)) * 100:.1f} %, "
        f"{design_text(s.get('design') or {}, probe=True)}, {s.get('warm')} warm requests a launch"
    )
    build = (f"build: {c(s['build'])}" if s.get("build") else "no build command") + (
        f"; Python overlay: {c(s['python_path'])} on PYTHONPATH" if s.get("python_path") is not None else ""
    )
    probes = d.get("probes") or []
    spent = f"{len(probes)} probe{'' if len(probes) == 1 else 's'}, {d.get('launches', 0)} launches in all"
    if d.get("kind") == "confirm":
        st, se = d.get("step") or {}, d.get("series") or {}
        lo = "" if st.get("low") is None else f" [{change_text(st['low'])}, {change_text(st['high'])}]"
        return [
            f"series: {t(se.get('hardware'))} / {c(se.get('case_id'))} {t(se.get('metric'))}",
            f"the history's step: {change_text(st.get('ratio'))}{lo} ({st.get('kind')}; {st.get('n_before')} runs before, "
            f"{st.get('n_after')} after; last run before {c(st.get('before_run'))}, first after {c(st.get('after_run'))})",
            f"commit before: {c(_commit(d.get('good')))} ({(d.get('good') or {}).get('author_date')}); "
            f"commit after: {c(_commit(d.get('bad')))} ({(d.get('bad') or {}).get('author_date')})",
            how,
            build,
            spent,
            f"recorded in the store: {c(d.get('stored'))}" if d.get("stored") else "not recorded",
        ]
    found = d.get("found")
    rng = d.get("range") or {}
    commits = d.get("commits") or []
    lines = [
        f"good {c(_commit(d.get('good')))} .. bad {c(_commit(d.get('bad')))}: {len(commits)} commits after the good one "
        f"({c(d.get('repo'))})",
    ]
    if found:
        lines.append(
            f"first bad commit: {c(found['sha'])} {t(found['subject'])} (author date {found['author_date']})"
        )
    elif commits and rng.get("hi") and d.get("outcome") == "not decided":
        lo, hi = int(rng.get("lo", 0)), int(rng["hi"])
        lines.append("the first bad commit is one of: " + ", ".join(c(_commit(x)) for x in commits[lo:hi]))
    lines += [how, build, spent + f", {d.get('wall_s')} s"]
    return lines


def bisect_summary_markdown(d: Mapping[str, Any]) -> str:
    """``summary.md`` of a bisect or confirm: the outcome with its exit code, the facts, the probes."""
    name = "perfkit history confirm" if d.get("kind") == "confirm" else "perfkit bisect"
    lines = [
        f"## {name}: {str(d.get('outcome')).upper()} (exit code {d.get('exit_code')})",
        "",
        md_text(d.get("message")),
        "",
    ]
    lines += [f"- {f}" for f in _facts(d)]
    probes = _probes_frame(d)
    lines += ["", "Probes, in the order they ran (B = the commit, A = the reference):", ""]
    lines += [markdown_table(probes) if not probes.empty else "no probe ran", ""]
    return "\n".join(lines)


def write_bisect_outputs(d: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    """``summary.md`` and ``report.html`` under ``out``: name -> path."""
    out = Path(out)
    confirm = d.get("kind") == "confirm"
    s = d.get("setup") or {}
    outcome = str(d.get("outcome"))
    links = []
    for i, p in enumerate(d.get("probes") or [], 1):
        page = Path(p.get("out") or "") / _REPORT_FILE
        if p.get("out") and page.is_file():
            href = os.path.relpath(page, out)
            links.append(
                {"href": href, "text": f"probe {i}: {(p.get('commit') or {}).get('short')} — its A/B page"}
            )
    section = dict(
        verdict=outcome,
        confirm=confirm,
        message=str(d.get("message") or ""),
        facts=_facts(d, md=False),
        metric=s.get("metric"),
        threshold=f"{float(s.get('threshold', 0.05)) * 100:.1f} %",
        probes=format_table(_probes_frame(d)),
        links=links,
    )
    return write_tool_outputs(
        out,
        bisect_summary_markdown(d),
        "sections/bisect.html.j2",
        section,
        "bisect",
        title="perfkit history confirm: does the step reproduce?"
        if confirm
        else "perfkit bisect: which commit?",
        verdict=outcome,
        exit_code=d.get("exit_code"),
        meta=[{"text": "repository", "code": d.get("repo") or s.get("spec")}],
        warnings=[],
        gates=format_table(pd.DataFrame([{"status": outcome, "what": str(d.get("message") or "")}])),
    )

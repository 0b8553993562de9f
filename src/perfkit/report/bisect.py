"""The reports of ``perfkit bisect`` and ``perfkit history confirm`` (``summary.md``,
``report.html``) from the plain dict of ``bisect.json`` / ``confirm.json``: this layer does not
import the one that runs them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from perfkit.common.numfmt import change_text
from perfkit.common.slugs import md_text
from perfkit.report.render import write_tool_outputs
from perfkit.report.tables import format_table, markdown_table

REPORT_FILE = "report.html"


def _commit(c: Mapping[str, Any] | None) -> str:
    return "?" if not c else f"{c['short']} {c['subject']}"


def probes_frame(d: Mapping[str, Any]) -> pd.DataFrame:
    """One row a probe, in the order they ran: commit, ``status`` (bad, good, undecided, error),
    the A/B decision, B/A and interval as % change, launches, the error or stop reason."""
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

    def c(x: Any) -> str:  # a name, in code font
        return md_text(x, code=True) if md else str(x)

    def t(x: Any) -> str:  # words from outside
        return md_text(x) if md else str(x)

    s = d.get("setup") or {}
    des = s.get("design") or {}
    how = (
        f"metric {t(s.get('metric'))}, threshold ±{float(s.get('threshold', 0.05)) * 100:.1f} %, "
        f"{des.get('min_launches')}–{des.get('max_launches')} launches a side a probe"
        f"{', paired' if des.get('paired') else ''} ({des.get('spending')} alpha spending, {float(des.get('confidence', 0.95)) * 100:.0f} % over the looks), "
        f"{s.get('warm')} warm requests a launch"
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
    """``summary.md``: the outcome with its exit code, the facts and the probes table."""
    name = "perfkit history confirm" if d.get("kind") == "confirm" else "perfkit bisect"
    lines = [
        f"## {name}: {str(d.get('outcome')).upper()} (exit code {d.get('exit_code')})",
        "",
        md_text(d.get("message")),
        "",
    ]
    lines += [f"- {f}" for f in _facts(d)]
    probes = probes_frame(d)
    lines += ["", "Probes, in the order they ran (B = the commit, A = the reference):", ""]
    lines += [markdown_table(probes) if not probes.empty else "no probe ran", ""]
    return "\n".join(lines)


def write_bisect_outputs(d: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    """``summary.md`` and ``report.html`` under ``out`` (as
    :func:`~perfkit.report.render.write_tool_outputs`); returns name -> path."""
    out = Path(out)
    confirm = d.get("kind") == "confirm"
    s = d.get("setup") or {}
    outcome = str(d.get("outcome"))
    links = []
    for i, p in enumerate(d.get("probes") or [], 1):
        page = Path(p.get("out") or "") / REPORT_FILE
        if p.get("out") and page.is_file():
            href = os.path.relpath(page, out)
            links.append(
                {"href": href, "text": f"probe {i}: {(p.get('commit') or {}).get('short')} — its A/B page"}
            )
    section = dict(
        verdict=outcome,
        heading="Does the step reproduce?" if confirm else "Which commit?",
        question=(
            "The A/B between the commits on either side of the history's change point, on the series' metric."
            if confirm
            else "A binary search between the good and the bad commit, an A/B against the good commit at each probe."
        ),
        message=str(d.get("message") or ""),
        facts=_facts(d, md=False),
        reference="the commit before the step" if confirm else "the good commit",
        metric=s.get("metric"),
        threshold=f"{float(s.get('threshold', 0.05)) * 100:.1f} %",
        probes=format_table(probes_frame(d)),
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

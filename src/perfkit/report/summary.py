"""``summary.md``: the run's verdict as Markdown for a PR comment or ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

import bisect
import logging
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from perfkit.common.slugs import clip, md_text
from perfkit.gate.verdicts import check_counts, nothing_measured_reason
from perfkit.report.runinfo import (
    bundle_dirs,
    engine_ends_frame,
    gate_view,
    investigations,
    investigations_table,
    key_numbers,
    plural,
    run_status,
    run_warnings,
    units_frame,
)
from perfkit.report.tables import markdown_table

log = logging.getLogger(__name__)


#: what summary.md is fitted into: GitHub's 65,536-character comment limit less room for a
#: caller's header or footer
SUMMARY_LIMIT = 60_000
#: a table cell's text is wrapped (``<br>``) at about this many characters
WRAP_AT = 60


def wrap_cell(text: Any, width: int = WRAP_AT) -> str:
    """``text`` broken at words every ``width`` characters, so it wraps in a GitHub table."""
    import textwrap

    t = str(text if text is not None else "").strip()
    if len(t) <= width:
        return t
    return "\n".join(textwrap.wrap(t, width, break_long_words=True, break_on_hyphens=False))


def _rows_table(df: pd.DataFrame, cols: list[str], n: int | None = None) -> tuple[str, int]:
    """(Markdown table of the first ``n`` rows of ``df[cols]``, reasons wrapped; rows left out)."""
    v = df[[c for c in cols if c in df.columns]]
    left, v = 0 if n is None else max(0, len(v) - n), v.iloc[:n]
    if "reason" in v.columns:
        v = v.assign(reason=v["reason"].map(wrap_cell))
    return markdown_table(v), left


def engine_versions_text(meta: Mapping[str, Any]) -> str:
    """The first launch's engine versions (``engine: sglang 0.5.23, torch 2.14.1+cu130,
    diffusers 0.37.0``), else perfkit's torch and diffusers, said as such."""
    ev = next(iter((meta.get("engine_versions") or {}).values()), None)
    if not ev or "error" in ev:
        why = f" ({ev['error']})" if ev else ""
        return (
            f"engine versions not recorded{why}; perfkit's torch {meta.get('torch_version')}, "
            f"diffusers {meta.get('diffusers_version')}"
        )
    return "engine: " + ", ".join(f"{p} {ev[p]}" for p in ("sglang", "torch", "diffusers") if ev.get(p))


def _engine_lines(run_dir: Path) -> list[str]:
    """The first launch's engine versions and where its config and cold start parts were read from."""
    from perfkit.bundle import ResultBundle

    for d in bundle_dirs(run_dir):
        try:
            b = ResultBundle.load(d)
            ln = b.table("launches")
        except Exception as exc:  # noqa: BLE001 - the summary is written in every case
            log.warning("summary: engine facts of %s: %r", d.name, exc)
            continue
        if ln.empty:
            continue
        row = ln.iloc[0]
        return [
            f"- {md_text(engine_versions_text(b.meta))}",
            f"- effective config from: {md_text(row.get('config_source'))}",
            f"- cold start parts from: {md_text(row.get('cold_start_sources'))}",
        ]
    return []


def _middle_blocks(run_dir: Path, info: Mapping[str, Any]) -> list[str]:
    """The summary's blocks between the failed and the passing gate rows."""
    nbs = info.get("notebooks", [])
    inv = [
        {**r, "note": wrap_cell(clip(r["note"]))} for r in investigations_table(investigations(run_dir, nbs))
    ]
    keys = key_numbers(run_dir)
    units, ends = units_frame(info), engine_ends_frame(run_dir)
    blocks = [
        (
            "Errors",
            [
                f"- **{md_text(n['name'])}**: {md_text(clip(n.get('error'), 400))}"
                for n in nbs
                if n.get("status") == "error"
            ],
        ),
        ("Investigations", [markdown_table(pd.DataFrame(inv))] if inv else []),
        (
            "Key numbers",
            [
                "Informational: what was measured. The gate rows decide the verdict; a key number is not a check.",
                "",
                markdown_table(pd.DataFrame(keys, columns=["what", "value"])),
            ]
            if keys
            else [],
        ),
        ("Engine", _engine_lines(run_dir)),
        ("Units of work", [markdown_table(units)] if units is not None else []),
        ("Merge notes", [f"- {md_text(n)}" for n in (info.get("scaleout") or {}).get("notes") or []]),
        ("How the engines ended", [markdown_table(ends)] if ends is not None else []),
        (
            "Warnings",
            [f"- {md_text(w)}" for w in run_warnings(run_dir)],
        ),
    ]
    return [line for title, lines in blocks if lines for line in ("", f"### {title}", "", *lines)]


def summary_markdown(run_dir: str | Path, limit: int = SUMMARY_LIMIT) -> str:
    """The run's verdict as Markdown, the passing rows in a collapsed ``<details>``, within
    ``limit`` characters: passing rows, then failed rows, left out from the end, whole rows only."""
    run_dir = Path(run_dir)
    info, verdicts, code, word = run_status(run_dir)
    icon = {"pass": "✅", "inconclusive": "⚠️", "regression": "❌", "error": "💥"}.get(word, "")
    view = gate_view(verdicts)
    n_fail, n_inc = ((view["status"] == s).sum() for s in ("fail", "inconclusive"))
    head = [
        f"## perfkit: {md_text(info.get('name', run_dir.name))} — {icon} {word.upper()} (exit {code})",
        "",
        f"{check_counts(view['status'])}"
        + (" (inconclusive: over the limit within the run's noise)." if n_inc else "."),
    ]
    why = nothing_measured_reason(verdicts)
    if why:
        head += ["", f"**Error: {md_text(why)}**"]
    if info.get("description"):
        head += ["", md_text(info["description"])]
    cols = ["case", "metric", "baseline", "measured", "limit", "status", "reason"]
    if view["baseline"].isna().all():  # invariants only: no baseline value to show
        cols.remove("baseline")
    shown = view[view["status"] != "skipped"]
    look = shown["status"].isin(["fail", "inconclusive", "improved"])
    attention, passing = shown[look], shown[~look]
    # passing rows: compact (their reasons are on the page), a status column only when mixed
    pass_cols = [c for c in cols if c not in ("status", "reason")]
    if len(passing) and set(passing["status"].astype(str)) != {"pass"}:
        pass_cols.append("status")

    middle = _middle_blocks(run_dir, info)
    sk = len(verdicts) - len(shown)
    page = "the report page (`report.html`)"

    def build(n_att: int | None, n_pass_rows: int | None) -> str:
        parts = list(head)
        if len(attention):
            t, left = _rows_table(attention, cols, n_att)
            title = (
                "Failed gate rows"
                if n_fail == len(attention)
                else "Failed, inconclusive and improved gate rows"
            )
            parts += ["", f"### {title}", "", t]
            if left:
                parts.append(f"\n{plural(left, 'more row')} not shown here: see {page}.")
        parts += middle
        if len(passing):
            t, left = _rows_table(passing, pass_cols, n_pass_rows)
            parts += [
                "",
                "<details><summary>" + f"{plural(len(passing), 'passing gate row')}</summary>",
                "",
                f"Each row's reason (tolerance, pad, interval) is on {page}.",
                "",
                t,
            ]
            if left:
                parts.append(f"\n{plural(left, 'more passing row')} not shown here: see {page}.")
            parts += ["", "</details>"]
        if sk:
            parts.append(f"\n{plural(sk, 'row')} skipped (not measured here).")
        return "\n".join(parts) + "\n"

    def most(n: int, make: Callable[[int], str]) -> str:
        """``make(k)`` for the most rows ``k`` <= ``n`` that fit (0 when none does): a bisection."""
        return make(max(bisect.bisect_left(range(n + 1), True, key=lambda k: len(make(k)) > limit) - 1, 0))

    text = build(None, None)
    if len(text) > limit:  # fit: passing rows first, then failed rows, whole rows only
        text = most(len(passing), lambda k: build(None, k))
    if len(text) > limit:
        text = most(len(attention), lambda k: build(k, 0))
    if len(text) <= limit:
        return text
    # still too long (a huge units or warnings list): cut between blocks, never inside a table
    return text[: limit - 200].rsplit("\n\n", 1)[0] + f"\n\n… cut at {limit} characters: see {page}.\n"


def relative_paths(text: str, run_dir: str | Path) -> str:
    """``text`` with the run directory's, the checkout's and the working directory's absolute
    paths made relative (``/tmp/x/baseline.json`` -> ``baseline.json``; itself -> ``.``)."""
    from perfkit.common.provenance import repo_root

    roots: list[str] = []
    for r in (Path(run_dir), repo_root(), Path.cwd()):
        for form in {str(r), str(r.resolve())}:
            if form not in roots and form != "/":
                roots.append(form)
    roots.sort(key=len, reverse=True)  # the run dir may lie inside the checkout: longest first
    for root in roots:
        text = re.sub(re.escape(root) + r"/(?=[^\s/])", "", text)
        text = re.sub(re.escape(root) + r"(?![\w./-])", ".", text)
    return text


def write_summary(run_dir: str | Path) -> str:
    """Write ``run_dir/summary.md`` (paths made relative) and return its text."""
    text = relative_paths(summary_markdown(run_dir), run_dir)
    (Path(run_dir) / "summary.md").write_text(text, encoding="utf-8")
    return text

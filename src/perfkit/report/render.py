"""One self-contained HTML report per run, a Markdown summary, and notebook display helpers.

:func:`render_report` turns a run directory (``run.json``, executed notebooks, verdicts,
bundles; see :mod:`perfkit.suite`) into ``report.html``:

- the verdict and a summary table at the top (notebook statuses, key numbers, gate rows);
- one section per investigation: the executed notebook with code hidden (nbconvert's
  ``HTMLExporter`` with ``exclude_input``; a failing cell's traceback stays visible);
- images embedded as base64 ``data:`` URIs, our own small stylesheet inline.

The page is rendered by jinja2 from ``perfkit/report/templates/``: ``page.html.j2`` (the page,
with ``report.css`` included inline) and one section template per notebook
(``sections/<scenario>.html.j2``, named by the scenario registry, and
``sections/baseline_gate.html.j2``), all extending ``sections/_base.html.j2``. Every table goes
through :func:`perfkit.report.tables.format_table`, which the Markdown summary uses too. No
Python file of this package writes HTML markup.

The page makes no network request: nbconvert's ``basic`` template is used (no require.js, no
MathJax, no web fonts), scripts/stylesheets loaded from elsewhere are dropped, and
:func:`external_refs` checks that no ``src``/``href``/``url()`` points outside the page; any
that a notebook output carries is made inert (:func:`neutralise_external`).

:func:`write_summary` writes ``summary.md`` (a verdict table for a PR comment);
:func:`show` displays a matplotlib Figure as an embedded PNG in a notebook;
:func:`reading` writes the short plain-words reading of a scenario's results.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping

import jinja2
import markupsafe
import pandas as pd

from perfkit.gate.verdicts import (
    GATE,
    STATUS_WORD,
    collect_verdicts,
    exit_code_for,
    notebooks,
    nothing_measured_reason,
    read_verdict,
)
from perfkit.report.belowstage import panel as below_stage_panel
from perfkit.report.rootcause import root_cause
from perfkit.report.tables import Table, format_table, markdown_table, status_class
from perfkit.scenarios import registry

log = logging.getLogger(__name__)

GATE_TITLE = "Baseline gate"
GATE_QUESTION = "This run's numbers against the baseline, and the invariants."


def section_title(name: str) -> str:
    """The heading of a notebook's section: the scenario's title, or the gate's."""
    return GATE_TITLE if name == GATE else registry.get(name).title


def section_question(name: str) -> str:
    """The one-sentence question of a notebook's section (the scenario's, or the gate's).
    Raises KeyError for a name that is neither registered nor the gate."""
    return GATE_QUESTION if name == GATE else registry.get(name).question


# ---------------------------------------------------------------------------------------------
# Notebook helpers
# ---------------------------------------------------------------------------------------------


def figure_title(fig: Any) -> str:
    """Alt text of a figure: its title and what its axes show
    (:func:`perfkit.report.plots.alt_text`); never empty."""
    from perfkit.report.plots import alt_text

    return alt_text(fig)


def show(fig: Any, dpi: int = 100, alt: str | None = None) -> None:
    """Display a matplotlib Figure as an embedded PNG with alt text (the figure's title and
    axes, :func:`perfkit.report.plots.alt_text`).

    Works without pyplot or ``%matplotlib``; the PNG lands in the notebook's outputs, so the
    HTML report embeds it as a ``data:`` URI.
    """
    from IPython.display import Image, display

    from perfkit.report.plots import figure_to_png_bytes

    display(Image(data=figure_to_png_bytes(fig, dpi=dpi), format="png", alt=alt or figure_title(fig)))


def reading(scenario: str, results: Mapping[str, Any]) -> str:
    """A few sentences of Markdown saying what the results mean (the scenario's ``reading``)."""
    return registry.get(scenario).reading(results or {})


def summary_frame(scenario: str, results: Mapping[str, Any]) -> pd.DataFrame:
    """The headline numbers of a scenario as a small table (the scenario's ``summary_table``)."""
    return registry.get(scenario).summary_table(results or {})


def notebook_error(nb_path: Path) -> tuple[str | None, str | None]:
    """(ename, text) of the first error output in an executed notebook."""
    import nbformat

    try:
        nb = nbformat.read(str(nb_path), as_version=4)
    except Exception:  # noqa: BLE001
        return None, None
    for cell in nb.cells:
        for o in cell.get("outputs", []) or []:
            if o.get("output_type") == "error":
                return o.get("ename"), f"{o.get('ename')}: {o.get('evalue')}"
    return None, None


# ---------------------------------------------------------------------------------------------
# Summary (Markdown)
# ---------------------------------------------------------------------------------------------


def _run_info(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "run.json"
    if p.exists():
        info = json.loads(p.read_text())
        # a verdict file that cannot be read makes its notebook an error (never a pass)
        for n in info.get("notebooks") or []:
            doc = read_verdict(run_dir / str(n.get("name")))
            if doc and doc.get("status") == "error" and n.get("status") == "ok":
                n.update({"status": "error", "error": doc.get("error")})
                info["exit_code"] = None  # recomputed from the files as they are now
        return info
    # a run dir made by hand (perfkit run): infer from files; a directory with no notebook and
    # no verdict is not a run
    nbs = []
    for name in notebooks():
        nbp = run_dir / "notebooks" / f"{name}.ipynb"
        if nbp.exists() or read_verdict(run_dir / name):
            ename, err = notebook_error(nbp) if nbp.exists() else (None, None)
            nbs.append(
                {
                    "name": name,
                    "status": "error" if err else "ok",
                    "error": err,
                    "ename": ename,
                    "wall_s": None,
                    "output": str(nbp),
                }
            )
    return {"name": run_dir.name, "notebooks": nbs}


def _scenario_key_numbers(run_dir: Path, name: str) -> list[registry.KeyNumber]:
    """The key numbers of scenario ``name`` from ``run_dir/<name>/results.json`` ([] when the
    file is not there). Raises KeyError (unknown scenario), ValueError (unreadable JSON) or
    whatever the scenario's ``key_numbers`` raises."""
    s = registry.get(name)
    p = run_dir / s.name / "results.json"
    if not p.exists():
        return []
    return list(s.key_numbers(json.loads(p.read_text())))


def key_numbers(run_dir: str | Path) -> list[tuple[str, str]]:
    """(what, value) of every scenario's key numbers, from ``run_dir/<scenario>/results.json``,
    in registry order. A scenario whose results cannot be read is logged and left out."""
    out: list[tuple[str, str]] = []
    for s in registry.all_scenarios():
        try:
            out += [(k.label, k.text) for k in _scenario_key_numbers(Path(run_dir), s.name)]
        except Exception as exc:  # noqa: BLE001 - the summary is written in every case
            log.warning("report: key numbers of %s: %r", s.name, exc)
    return out


def _status_text(n: Mapping[str, Any]) -> str:
    """Whether a notebook ran, with the reason when skipped: ``ran``, ``error``,
    ``skipped (no bundle in replay dir)``. ``ran`` (run.json's ``ok``) says only that the notebook
    ran to its end; its gate result is :func:`gate_result`."""
    st = str(n.get("status"))
    if st == "ok":
        return "ran"
    return f"{st} ({n['reason']})" if st == "skipped" and n.get("reason") else st


#: the gate result of one investigation (:func:`gate_result`), worst first
GATE_RESULTS = ("error", "fail", "not gated", "pass", "not run")


def gate_result(run_dir: str | Path, n: Mapping[str, Any]) -> tuple[str, str]:
    """(result, text) of notebook entry ``n``'s gate, distinct from whether it ran.

    result: ``error`` (the notebook failed, or its verdict file is unreadable), ``fail`` (a
    check failed), ``pass`` (at least one check compared, none failed), ``not gated`` (it ran
    and no check compared: none declared, or every one skipped), ``not run`` (skipped).
    text: the result with its counts (``fail: 1 of 4 checks failed``, ``pass: 4 checks``,
    ``not gated: 3 checks skipped``) or the notebook's error.
    """
    from perfkit.checks import check_table
    from perfkit.gate.outcome import gate_result as gate_word

    st = str(n.get("status") or "")
    if st == "skipped":
        return "not run", "not run"
    if st == "error":
        return "error", "error: " + (_clip(n.get("error"), 120) or "notebook failed")
    doc = read_verdict(Path(run_dir) / str(n.get("name")))
    if doc is None:
        return "not gated", "not gated: no verdict written"
    word = gate_word("ok", doc)  # the one rule, shared with papermill's last cell and perfkit run
    if word == "error":
        return "error", "error: " + (_clip(doc.get("error"), 120) or "verdict unreadable")
    rows = check_table(doc.get("rows") or [])
    counts = rows["status"].astype(str).value_counts() if not rows.empty else pd.Series(dtype=int)
    n_fail, n_skip = int(counts.get("fail", 0)), int(counts.get("skipped", 0))
    compared = len(rows) - n_skip
    if word == "fail":
        why = f"{n_fail} of {_plural(compared, 'check')} failed" if n_fail else _clip(doc.get("reason"), 120)
        return "fail", f"fail: {why or 'the verdict says fail'}"
    if word == "not gated":
        return (
            "not gated",
            f"not gated: {_plural(n_skip, 'check')} skipped" if n_skip else "not gated: no check declared",
        )
    return "pass", f"pass: {_plural(compared, 'check')}" + (f", {n_skip} skipped" if n_skip else "")


def _measured_elsewhere(run_dir: Path, name: str) -> str | None:
    """The title of another investigation whose results hold skipped investigation ``name``'s
    measurement (the scenario's ``found_in``, e.g. an in-session probe), or None."""
    try:
        s = registry.get(name)
    except KeyError:
        return None
    if s.found_in is None:
        return None
    for other in registry.all_scenarios():
        p = run_dir / other.name / "results.json"
        if other.name == name or not p.exists():
            continue
        try:
            if s.found_in(json.loads(p.read_text())):
                return other.title
        except (OSError, ValueError) as exc:
            log.warning("report: results of %s: %r", other.name, exc)
    return None


def investigations(run_dir: str | Path, nbs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per notebook for the page's contents and the summaries: ``name``, ``title``,
    ``ran`` (:func:`_status_text`), ``gate``/``gate_text`` (:func:`gate_result`), ``note``
    (a skipped investigation whose figures another one measured says where, e.g. "not run on
    its own; measured inside Cold vs warm: see its root-cause panel"; else None)."""
    run_dir = Path(run_dir)
    out = []
    for n in nbs:
        name = str(n.get("name"))
        try:
            title = section_title(name)
        except KeyError:
            title = name
        gate, text = gate_result(run_dir, n)
        note = None
        if gate == "not run" and (where := _measured_elsewhere(run_dir, name)):
            note = f"not run on its own; measured inside {where}: see its root-cause panel"
        out.append(
            {
                "name": name,
                "title": title,
                "ran": _status_text(n),
                "gate": gate,
                "gate_text": text,
                "note": note,
                "wall_s": n.get("wall_s"),
                "error": n.get("error") or n.get("reason") or "",
            }
        )
    return out


def _run_status(run_dir: Path) -> tuple[dict[str, Any], pd.DataFrame, int, str]:
    """(run.json info, verdict rows, exit code, status word) of a run directory."""
    info = _run_info(run_dir)
    verdicts = collect_verdicts(run_dir)
    code = info.get("exit_code")
    if code is None:
        code = exit_code_for(info.get("notebooks", []), verdicts)
    return info, verdicts, code, STATUS_WORD.get(code, "error")


def _clip(text: Any, n: int = 200) -> str | None:
    """``text`` cut to ``n`` characters at a word boundary, with "…" when cut (None for empty)."""
    t = str(text or "").strip()
    if len(t) <= n:
        return t or None
    return t[:n].rsplit(" ", 1)[0].rstrip() + " …"


def _part_id(part: Mapping[str, Any]) -> str:
    """A planned part's id (``scaleout.units.Part.id``): ``scenario`` or ``scenario.key``."""
    return str(part.get("scenario", "")) + (f".{part['key']}" if part.get("key") else "")


def units_frame(info: Mapping[str, Any]) -> pd.DataFrame | None:
    """The units of work of a merged run (``run.json``'s ``scaleout``), one row each: unit,
    parts, shard, status, attempts, wall (s), the GPUs it ran on (NVML UUIDs, shortened), the
    units it ran beside (overlapping in time: its timings were taken next to theirs), the
    commit its parts were measured at (only when the merge holds several: ``perfkit merge
    --allow-mixed-commits``), the merge's notes on its parts (only when there are any, e.g.
    "plan not recorded: not checked" for a part of an older perfkit) and the error. None for a run
    without units (plain ``perfkit suite``)."""
    so = info.get("scaleout") or {}
    units = so.get("units") or []
    if not units:
        return None
    outcomes = {o.get("unit_id"): o for o in so.get("outcomes") or [] if isinstance(o, Mapping)}
    beside: dict[str, set[str]] = {}
    for pair in so.get("concurrent") or []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            a, b = (str(x) for x in pair)
            beside.setdefault(a, set()).add(b)
            beside.setdefault(b, set()).add(a)
    parts_info = so.get("parts") if isinstance(so.get("parts"), Mapping) else {}
    mixed = len(so.get("commits") or []) > 1  # merged on purpose (--allow-mixed-commits): say whose
    noted = any((v or {}).get("notes") for v in parts_info.values() if isinstance(v, Mapping))
    rows = []
    for u in units:
        uid = u.get("id")
        o = outcomes.get(uid) or {}
        commits = {
            str((parts_info.get(_part_id(p)) or {}).get("commit") or "")[:12] for p in u.get("parts") or []
        } - {""}
        rows.append(
            {
                "unit": uid,
                "parts": ", ".join(
                    p.get("scenario", "") + (f".{p['key']}" if p.get("key") else "")
                    for p in u.get("parts") or []
                ),
                "shard": u.get("shard"),
                "status": o.get("status") or "not run",
                "attempts": o.get("attempts"),
                "wall (s)": o.get("wall_s"),
                "GPUs": ", ".join(g[:12] + "…" for g in o.get("gpu_uuids") or []) or None,
                "ran beside": ", ".join(sorted(beside.get(uid, ()))) or None,
                **({"commit": ", ".join(sorted(commits)) or None} if mixed else {}),
                **({"notes": _unit_notes(u, parts_info)} if noted else {}),
                "error": _clip(o.get("error")),
            }
        )
    return pd.DataFrame(rows)


def _unit_notes(unit: Mapping[str, Any], parts_info: Mapping[str, Any]) -> str | None:
    """The merge's notes on ``unit``'s parts, distinct, in order ("; "-joined); None without."""
    out: list[str] = []
    for p in unit.get("parts") or []:
        for n in (parts_info.get(_part_id(p)) or {}).get("notes") or []:
            if n not in out:
                out.append(str(n))
    return "; ".join(out) or None


def refused_records(run_dir: str | Path) -> list[str]:
    """One line per request that failed because the engine's performance.log record for it was
    refused (a NaN, infinite or negative time, invalid UTF-8, a wrong type: the reason names the
    file and line), from every bundle's ``requests`` table under ``run_dir`` (merged bundles
    included). [] when there are none or no bundle is readable."""
    from perfkit.readings.records import REFUSED

    out: list[str] = []
    run_dir = Path(run_dir)
    paths = sorted(run_dir.glob("*/requests.parquet")) + sorted(run_dir.glob("merged/*/requests.parquet"))
    for p in paths:
        try:
            df = pd.read_parquet(p, columns=["launch", "request_id", "index", "error"])
        except Exception as exc:  # noqa: BLE001 - the summary is written in every case
            log.warning("summary: cannot read %s: %r", p, exc)
            continue
        for r in df.itertuples(index=False):
            if isinstance(r.error, str) and r.error.startswith(REFUSED):
                out.append(
                    f"{p.parent.name}: request {r.request_id} ({r.launch} #{r.index}) failed: {r.error}"
                )
    return out


def _na(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def engine_ends_frame(run_dir: str | Path) -> pd.DataFrame | None:
    """The launches that did not end by perfkit's plain teardown, one row each: investigation,
    launch, the request that hung or failed (its index in the launch, 0 = cold), how the engine
    ended (exit code, signal, ``killed by perfkit (SIGKILL) after N s``) and the host's OOM-kill
    record (read from the kernel log or the cgroup, "no record found" when none); then every
    process a notebook's kernel left running that the suite (its owner) ended (its failed request:
    the one in flight when the kernel stopped, run.json's ``in_flight``). Read from each
    ``RUN/<scenario>/launches.parquet`` (and the units' bundles of an ``--executor`` run under
    ``RUN/shards/``; columns ``failed_request``, ``ended``, ``end_signal``,
    ``end_by_perfkit``, ``oom_record``) and run.json's ``outlived``. None when there is none."""
    from perfkit.bundle import ResultBundle

    run_dir = Path(run_dir)
    rows = []
    # the run's bundles, then those of its units (--executor: RUN/shards/<i>/units/<unit>/<part>)
    dirs = [(name, run_dir / name) for name in registry.names()]
    dirs += [(d.name, d) for d in sorted(run_dir.glob("shards/*/units/*/*")) if d.is_dir()]
    seen: set[tuple[Any, ...]] = set()
    for name, d in dirs:
        if not (d / "meta.json").exists():
            continue
        try:
            la = ResultBundle.load(d).table("launches")
        except (OSError, ValueError, KeyError) as exc:
            log.warning("%s: launches not readable: %s", d, exc)
            continue
        for r in la.to_dict("records"):
            failed, by_perfkit = r.get("failed_request"), r.get("end_by_perfkit")
            if _na(failed) and (_na(r.get("ended")) or by_perfkit is True or _na(r.get("end_signal"))):
                continue
            key = (name.split(".")[0], r.get("launch"), r.get("ended"), str(failed))
            if key in seen:  # a merged bundle and its unit's own copy
                continue
            seen.add(key)
            rows.append(
                {
                    "investigation": name,
                    "launch": r.get("launch"),
                    "failed request": None if _na(failed) else int(failed),
                    "how the engine ended": r.get("ended") or "not recorded",
                    "OOM-kill record": r.get("oom_record") or "–",
                }
            )
    for n in _run_info(run_dir).get("notebooks", []):
        fl = n.get("in_flight") or {}
        for e in n.get("outlived") or []:
            label = str(e.get("label") or "")
            mine = fl and label.split(" ")[0] == str(fl.get("launch"))
            rows.append(
                {
                    "investigation": n.get("name"),
                    "launch": f"pid {e.get('pid')} {label}".strip(),
                    "failed request": fl.get("request") if mine else None,
                    "how the engine ended": f"found after its notebook's kernel ended: {e.get('how')}",
                    "OOM-kill record": "–",
                }
            )
    return pd.DataFrame(rows) if rows else None


#: GitHub's limit on a PR comment's body (characters); summary.md stays below it with a margin
GITHUB_COMMENT_LIMIT = 65_536
#: what summary.md is fitted into (:func:`summary_markdown`): the limit less room for a caller's
#: header or footer
SUMMARY_LIMIT = 60_000
#: a table cell's text is wrapped (``<br>``) at about this many characters
WRAP_AT = 60


def wrap_cell(text: Any, width: int = WRAP_AT) -> str:
    """``text`` with ``<br>`` at word boundaries every ``width`` characters or so, so a long
    reason wraps inside a GitHub table instead of making it scroll sideways."""
    import textwrap

    t = str(text if text is not None else "").strip()
    if len(t) <= width:
        return t
    return "<br>".join(textwrap.wrap(t, width, break_long_words=True, break_on_hyphens=False))


def _rows_table(df: pd.DataFrame, cols: list[str], n: int | None = None) -> tuple[str, int]:
    """(Markdown table of the first ``n`` rows of ``df[cols]`` with ``reason`` wrapped, rows
    left out). A table is cut between rows only, never inside one."""
    v = df[[c for c in cols if c in df.columns]]
    left = 0 if n is None else max(0, len(v) - n)
    if n is not None:
        v = v.iloc[:n]
    if "reason" in v.columns:
        v = v.assign(reason=v["reason"].map(wrap_cell))
    return markdown_table(v), left


def summary_markdown(run_dir: str | Path, limit: int = SUMMARY_LIMIT) -> str:
    """The run's verdict as Markdown for a PR comment or ``$GITHUB_STEP_SUMMARY``.

    Order: the verdict line and counts; the failed gate rows (with their reasons, wrapped);
    notebook errors; one row per investigation with its gate result (pass / fail / not gated /
    error / not run) apart from whether its notebook ran; the key numbers (informational:
    measured, not checks); units, merge notes, engine ends, warnings; then the passing gate
    rows in a collapsed ``<details>`` block.

    The text stays within ``limit`` characters (default :data:`SUMMARY_LIMIT`, below GitHub's
    65,536-character comment limit): passing rows, then failed rows, are left out from the end,
    whole rows only, with a line saying how many and pointing at ``report.html``.
    """
    run_dir = Path(run_dir)
    info, verdicts, code, word = _run_status(run_dir)
    icon = {"pass": "✅", "regression": "❌", "error": "💥"}.get(word, "")
    n_fail = int((verdicts["status"] == "fail").sum()) if not verdicts.empty else 0
    n_pass = int(verdicts["status"].isin(["pass", "improved"]).sum()) if not verdicts.empty else 0
    head = [
        f"## perfkit: {info.get('name', run_dir.name)} — {icon} {word.upper()} (exit {code})",
        "",
        f"{_plural(n_pass, 'gate')} passed, {n_fail} failed.",
    ]
    why = nothing_measured_reason(verdicts)
    if why:
        head += ["", f"**Error: {why}**"]
    if info.get("description"):
        head += ["", info["description"]]
    cols = ["case", "metric", "expected", "actual", "status", "reason"]
    shown = verdicts[verdicts["status"] != "skipped"] if not verdicts.empty else verdicts
    order = shown["status"].map(_GATE_ORDER).fillna(5) if not shown.empty else None
    shown = (
        shown.assign(_o=order).sort_values("_o", kind="stable").drop(columns="_o")
        if not shown.empty
        else shown
    )
    attention = shown[shown["status"].isin(["fail", "improved"])] if not shown.empty else shown
    passing = shown[~shown["status"].isin(["fail", "improved"])] if not shown.empty else shown
    # passing rows: compact (their reasons are on the page), a status column only when mixed
    pass_cols = ["case", "metric", "expected", "actual"]
    if len(passing) and set(passing["status"].astype(str)) != {"pass"}:
        pass_cols.append("status")

    nbs = info.get("notebooks", [])
    errors = [n for n in nbs if n.get("status") == "error"]
    middle: list[str] = []
    if errors:
        middle += [
            "",
            "### Errors",
            "",
            *[f"- **{n['name']}**: {_clip(n.get('error'), 400)}" for n in errors],
        ]
    inv = investigations(run_dir, nbs)
    if inv:
        middle += [
            "",
            "### Investigations",
            "",
            markdown_table(
                pd.DataFrame(
                    [
                        {
                            "investigation": i["title"],
                            "gate": i["gate_text"],
                            "notebook": i["ran"],
                            "wall (s)": i["wall_s"],
                            "note": wrap_cell(
                                i["note"] or (_clip(i["error"]) if i["gate"] != "error" else "")
                            ),
                        }
                        for i in inv
                    ]
                )
            ),
        ]
    keys = key_numbers(run_dir)
    if keys:
        middle += [
            "",
            "### Key numbers",
            "",
            "Informational: what was measured. The gate rows decide the verdict; a key number is not a check.",
            "",
            markdown_table(pd.DataFrame(keys, columns=["what", "value"])),
        ]
    units = units_frame(info)
    if units is not None:
        middle += ["", "### Units of work", "", markdown_table(units)]
    merge_notes = (info.get("scaleout") or {}).get("notes") or []
    if merge_notes:
        middle += ["", "### Merge notes", "", *[f"- {n}" for n in merge_notes]]
    ends = engine_ends_frame(run_dir)
    if ends is not None:
        middle += ["", "### How the engines ended", "", markdown_table(ends)]
    gate_doc = read_verdict(run_dir / GATE) or {}
    warnings = [*(gate_doc.get("warnings") or []), *refused_records(run_dir)]
    if warnings:
        middle += ["", "### Warnings", "", *[f"- {w}" for w in warnings]]
    sk = len(verdicts) - len(shown)
    page = "the report page (`report.html`)"

    def build(n_att: int | None, n_pass_rows: int | None) -> str:
        parts = list(head)
        if len(attention):
            t, left = _rows_table(attention, cols, n_att)
            title = "Failed gate rows" if n_fail == len(attention) else "Failed and improved gate rows"
            parts += ["", f"### {title}", "", t]
            if left:
                parts.append(f"\n{_plural(left, 'more row')} not shown here: see {page}.")
        parts += middle
        if len(passing):
            t, left = _rows_table(passing, pass_cols, n_pass_rows)
            parts += [
                "",
                "<details><summary>" + f"{_plural(len(passing), 'passing gate row')}</summary>",
                "",
                f"Each row's reason (tolerance, pad, interval) is on {page}.",
                "",
                t,
            ]
            if left:
                parts.append(f"\n{_plural(left, 'more passing row')} not shown here: see {page}.")
            parts += ["", "</details>"]
        if sk:
            parts.append(f"\n{sk} row{'' if sk == 1 else 's'} skipped (not measured here).")
        return "\n".join(parts) + "\n"

    text = build(None, None)
    if len(text) <= limit:
        return text
    # fit: passing rows first, then failed rows, whole rows only (binary search on the count)
    n_att: int | None = None
    for which in ("pass", "att"):
        lo, hi = 0, len(passing) if which == "pass" else len(attention)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            t = build(mid, 0) if which == "att" else build(None, mid)
            if len(t) <= limit:
                lo = mid
            else:
                hi = mid - 1
        text = build(n_att, lo) if which == "pass" else build(lo, 0)
        if len(text) <= limit:
            return text
        n_att = None
    # still too long (a huge units or warnings list): cut between blocks, never inside a table
    return text[: limit - 200].rsplit("\n\n", 1)[0] + f"\n\n… cut at {limit} characters: see {page}.\n"


def relative_paths(text: str, run_dir: str | Path) -> str:
    """``text`` with the absolute paths of this machine made relative: the run directory's
    (``/tmp/x/baseline.json`` -> ``baseline.json``: relative to the page and summary, which sit
    in it; the directory itself -> ``.``), then perfkit's checkout's and the working
    directory's (``/work/perfkit/examples/h200/bundles`` -> ``examples/h200/bundles``). So a
    committed report names no path of the machine that rendered it."""
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
    """Write ``run_dir/summary.md`` (:func:`summary_markdown`, paths made relative by
    :func:`relative_paths`) and return its text."""
    text = relative_paths(summary_markdown(run_dir), run_dir)
    (Path(run_dir) / "summary.md").write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------------------------------------
# HTML (jinja2 templates under perfkit/report/templates/)
# ---------------------------------------------------------------------------------------------

#: the page template; it includes ``report.css`` inline and renders each section's HTML
PAGE_TEMPLATE = "page.html.j2"
#: the gate notebook's section template (scenario sections come from the registry)
GATE_TEMPLATE = f"sections/{GATE}.html.j2"
#: the section of a notebook that is neither registered nor the gate (a run of an older perfkit)
FALLBACK_SECTION_TEMPLATE = "sections/_base.html.j2"

#: gate rows sort failures first
_GATE_ORDER = {"fail": 0, "improved": 1, "pass": 2, "new": 3, "skipped": 4}
_GATE_COLUMNS = ["notebook", "case", "metric", "expected", "actual", "bound", "status", "reason"]


@functools.lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The report's jinja2 environment: templates from the ``perfkit.report`` package
    (``templates/``), HTML autoescaped, plus the ``status_class`` filter
    (:func:`perfkit.report.tables.status_class`).

    Raises:
        ValueError: (from jinja2's PackageLoader) if the templates directory is not installed.
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("perfkit.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.filters["status_class"] = status_class
    return env


_EXTERNAL = re.compile(
    r"""(?:(?<![\w-])(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//)"""
    r"""|(?:url\(\s*["']?\s*(?:https?:)?//)|(?:@import\s+["']?(?:https?:)?//)""",
    re.I,
)


def external_refs(text: str) -> list[str]:
    """Snippets of ``text`` that would make a browser fetch something from the network
    (``src=``/``href=``/``action=``/``poster=``/``data=`` to ``//`` or ``http(s)://``, CSS
    ``url(//…)`` and ``@import``). Empty when the page is self-contained."""
    return [text[max(0, m.start() - 40) : m.end() + 60] for m in _EXTERNAL.finditer(text)]


_ATTR_EXT = re.compile(r"""(?<![\w-])(src|href|action|poster|data)(\s*=\s*["']?\s*)((?:https?:)?//)""", re.I)
_URL_EXT = re.compile(r"""(url\(\s*["']?\s*)((?:https?:)?//)""", re.I)
_IMPORT_EXT = re.compile(r"""(@import\s+["']?)((?:https?:)?//)""", re.I)


def neutralise_external(text: str) -> str:
    """Make network references inert: ``src="https://x"`` -> ``data-offline-src="https://x"``,
    ``url(https://x)`` -> ``url(data:,https://x)``."""
    text = _ATTR_EXT.sub(lambda m: f"data-offline-{m.group(1)}{m.group(2)}{m.group(3)}", text)
    text = _URL_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)
    return _IMPORT_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)


_SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc\s*=[^>]*>\s*</script>", re.I)
_LINK_EXT = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", re.I)


def _strip_external(body: str) -> str:
    """Drop script/link elements that load from the network (belt and braces)."""
    return _LINK_EXT.sub("", _SCRIPT_SRC.sub("", body))


def notebook_body(nb_path: str | Path, drop_heading: str | None = None) -> str:
    """HTML fragment of an executed notebook: code hidden, outputs (images embedded) kept.

    Args:
        nb_path: an executed ``.ipynb``.
        drop_heading: when the first cell is Markdown starting with ``# <drop_heading>``, it is
            left out (the report's section already shows the title and the question).

    Returns:
        nbconvert's ``basic`` HTML (no scripts or stylesheets loaded from the network); stderr
        stream outputs are dropped, error outputs (tracebacks) kept.

    Raises:
        OSError, nbformat.ValidationError, ValueError: when the notebook cannot be read.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    if drop_heading and nb.cells and nb.cells[0].cell_type == "markdown":
        first = (nb.cells[0].source.strip().splitlines() or [""])[0].strip()
        if first == f"# {drop_heading}":
            nb.cells = nb.cells[1:]
    # progress bars and log lines on stderr are for the person at the terminal, not the report
    # (the executed notebook keeps them); errors (tracebacks) stay
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [
                o
                for o in cell.get("outputs", [])
                if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
            ]
    exp = HTMLExporter(
        template_name="basic",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        embed_images=True,
    )
    exp.mathjax_url = ""
    body, _ = exp.from_notebook_node(nb)
    return _strip_external(body)


def section_template(name: str) -> str:
    """The section template of notebook ``name``: the scenario's ``template`` (registry), the
    gate's, or the shared base for a name neither knows (logged)."""
    if name == GATE:
        return GATE_TEMPLATE
    try:
        return registry.get(name).template
    except KeyError:
        log.warning("report: notebook %r is not a registered scenario; plain section", name)
        return FALLBACK_SECTION_TEMPLATE


def _notebook_path(run_dir: Path, n: Mapping[str, Any]) -> Path:
    name = n["name"]
    nbp = Path(n.get("output") or run_dir / "notebooks" / f"{name}.ipynb")
    if not nbp.is_absolute():
        nbp = run_dir / nbp
    if not nbp.exists():
        nbp = run_dir / "notebooks" / f"{name}.ipynb"
    return nbp


def section_context(run_dir: str | Path, n: Mapping[str, Any]) -> dict[str, Any]:
    """What a section template gets for one notebook entry ``n`` of ``run.json``.

    Keys: ``name``, ``title``, ``question``, ``status`` (``ok``/``error``/``skipped``/…),
    ``status_text`` (``ran``, or the skip reason), ``gate``/``gate_text`` (:func:`gate_result`), ``reason``, ``error``, ``wall_s``, ``keys``
    (:class:`~perfkit.scenarios.registry.KeyNumber` list), ``keys_error``, ``verdict`` (the
    notebook's verdict.json without its rows, or {}), ``notebook_path``, ``body`` (notebook
    HTML, or None), ``body_error``, ``root_cause`` (the root-cause panel,
    :func:`perfkit.report.rootcause.root_cause`, or None) and ``below_stage`` (the profiled
    requests' panel, :func:`perfkit.report.belowstage.panel`, or None). Never raises on a broken notebook or results file: the
    problem is logged and shown in the section.
    """
    run_dir = Path(run_dir)
    name = str(n["name"])
    status = str(n.get("status") or "")
    try:
        title, question = section_title(name), section_question(name)
    except KeyError:
        title, question = name, ""
    keys, keys_error = [], None
    if name != GATE:
        try:
            keys = _scenario_key_numbers(run_dir, name)
        except Exception as exc:  # noqa: BLE001 - a broken results file must not kill the report
            log.warning("report: key numbers of %s: %r", name, exc)
            keys_error = repr(exc)
    verdict = {k: v for k, v in (read_verdict(run_dir / name) or {}).items() if k != "rows"}
    rc = root_cause(run_dir, name) if name != GATE and status != "skipped" else None
    # the bundle sits at RUN/<name>/, beside the page: trace links are relative to the page
    below = below_stage_panel(run_dir / name, link_prefix=f"{name}/") if name != GATE else None
    nbp = _notebook_path(run_dir, n)
    body, body_error = None, None
    if status != "skipped" and nbp.exists():
        try:
            body = notebook_body(nbp, drop_heading=title)
        except Exception as exc:  # noqa: BLE001 - a broken notebook must not kill the report
            log.warning("report: cannot render %s: %r", nbp, exc)
            body_error = repr(exc)
    gate, gate_text = gate_result(run_dir, n)
    return {
        "name": name,
        "title": title,
        "question": question,
        "status": status,
        "status_text": _status_text(n),
        "gate": gate,
        "gate_text": gate_text,
        "reason": n.get("reason"),
        "error": n.get("error"),
        "wall_s": n.get("wall_s"),
        "keys": keys,
        "keys_error": keys_error,
        "verdict": verdict,
        "notebook_path": str(nbp),
        "body": body,
        "body_error": body_error,
        "root_cause": rc,
        "below_stage": below,
    }


def render_section(run_dir: str | Path, n: Mapping[str, Any]) -> str:
    """The HTML of one notebook's section (``<section id=NAME>``), from its section template
    (:func:`section_template`) and :func:`section_context`.

    Raises:
        jinja2.TemplateNotFound: if a registered scenario's template file is missing.
    """
    ctx = section_context(run_dir, n)
    return template_env().get_template(section_template(ctx["name"])).render(**ctx)


def _gate_table(verdicts: pd.DataFrame, statuses: tuple[str, ...] | None = None) -> Table:
    """The gate rows (failures first) as a formatted table; only rows whose status is in
    ``statuses`` when given."""
    if verdicts.empty:
        return format_table(pd.DataFrame(columns=_GATE_COLUMNS))
    v = verdicts[[c for c in _GATE_COLUMNS if c in verdicts.columns]]
    if statuses is not None:
        v = v[v["status"].isin(statuses)]
    v = (
        v.assign(_o=v["status"].map(_GATE_ORDER).fillna(5))
        .sort_values("_o", kind="stable")
        .drop(columns="_o")
    )
    return format_table(v)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    """``"1 row"``, ``"3 rows"``, ``"0 rows"``."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def gate_counts(verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    """``[{"status", "n", "text"}]`` per gate status present, failures first
    (``"60 passed"``, ``"1 failed"``, ``"30 skipped"``)."""
    if verdicts.empty:
        return []
    words = {"fail": "failed", "pass": "passed", "improved": "improved", "new": "new", "skipped": "skipped"}
    counts = verdicts["status"].astype(str).value_counts()
    order = sorted(counts.index, key=lambda s: _GATE_ORDER.get(s, 5))
    return [{"status": s, "n": int(counts[s]), "text": f"{int(counts[s])} {words.get(s, s)}"} for s in order]


def page_context(run_dir: str | Path) -> dict[str, Any]:
    """What ``page.html.j2`` gets for a run directory.

    Keys: ``title``, ``verdict`` (``pass``/``regression``/``error``), ``exit_code``, ``meta``
    (list of ``{"text", "code"}`` items of the run meta line), ``environment`` (str),
    ``toc`` (``{"name", "title", "status_text", "gate", "gate_text", "note"}`` per notebook:
    whether it ran, and its gate result, :func:`investigations`), ``failed`` (the toc entries
    whose gate failed), ``errors`` (failed notebook entries), ``notebooks_table``, ``units_table`` (:func:`units_frame`; None without units),
    ``engine_ends_table`` (:func:`engine_ends_frame`: launches that hung, failed or were
    killed, and processes the owner ended; None without),
    ``key_numbers``, ``gates`` (:class:`~perfkit.report.tables.Table`
    of every gate row), ``gates_attention`` (only failed and improved rows), ``gate_counts``
    (:func:`gate_counts`),
    ``warnings`` (the gate's), ``sections`` (rendered section HTML, one per notebook, as
    :class:`markupsafe.Markup`).
    """
    run_dir = Path(run_dir)
    info, verdicts, code, word = _run_status(run_dir)
    nbs = info.get("notebooks", [])
    meta: list[dict[str, Any]] = []
    if info.get("description"):
        meta.append({"text": info["description"]})
    if info.get("params_file"):
        meta.append({"text": "params", "code": info["params_file"]})
    if info.get("finished"):
        meta.append({"text": f"finished {info['finished']}"})
    if info.get("wall_s") is not None:
        meta.append({"text": f"wall time {info['wall_s']:.0f} s"})
    if info.get("replay"):
        meta.append({"text": "replayed from", "code": info["replay"]})
    inv = investigations(run_dir, nbs)
    toc = [
        {
            "name": i["name"],
            "title": i["title"],
            "status_text": i["ran"],
            "gate": i["gate"],
            "gate_text": i["gate_text"],
            "note": i["note"],
        }
        for i in inv
    ]
    nb_table = (
        format_table(
            pd.DataFrame(
                [
                    {
                        "investigation": i["title"],
                        "gate": i["gate"],
                        "checks": i["gate_text"].partition(": ")[2],
                        "notebook": i["ran"],
                        "wall (s)": i["wall_s"],
                        "note": i["note"] or (i["error"] if i["gate"] != "error" else ""),
                    }
                    for i in inv
                ],
                columns=["investigation", "gate", "checks", "notebook", "wall (s)", "note"],
            ),
            status_col="gate",
        )
        if nbs
        else None
    )
    keys = key_numbers(run_dir)
    gate_doc = read_verdict(run_dir / GATE) or {}
    return {
        "title": f"perfkit report: {info.get('name', run_dir.name)}",
        "verdict": word,
        "exit_code": code,
        "meta": meta,
        "environment": _env_line(run_dir),
        "toc": toc,
        "failed": [t for t in toc if t["gate"] == "fail"],
        "errors": [n for n in nbs if n.get("status") == "error"],
        "notebooks_table": nb_table,
        "units_table": format_table(units) if (units := units_frame(info)) is not None else None,
        "engine_ends_table": format_table(ends) if (ends := engine_ends_frame(run_dir)) is not None else None,
        "key_numbers": format_table(pd.DataFrame(keys, columns=["what", "value"]), None) if keys else None,
        "warnings": [*(gate_doc.get("warnings") or []), *refused_records(run_dir)],
        "gates": _gate_table(verdicts),
        "gates_attention": _gate_table(verdicts, ("fail", "improved")),
        "gate_counts": gate_counts(verdicts),
        "sections": [markupsafe.Markup(render_section(run_dir, n)) for n in nbs],
    }


def render_page(run_dir: str | Path) -> str:
    """The report page of ``run_dir`` as an HTML string (not yet checked for network
    references; :func:`render_report` does that)."""
    return template_env().get_template(PAGE_TEMPLATE).render(**page_context(run_dir))


def render_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``run_dir/report.html`` (or ``out``) from the run's files. Returns its path.

    Raises:
        RuntimeError: if the page would load anything from the network (a bug to fix here).
        jinja2.TemplateError: if a template is missing or broken (a packaging bug).
    """
    run_dir = Path(run_dir)
    page = relative_paths(render_page(run_dir), run_dir)
    bad = external_refs(page)
    if bad:  # e.g. an HTML output of a notebook pointing at the web: neutralise, keep offline
        log.warning("report: %d network reference(s) neutralised, e.g. %s", len(bad), bad[0])
        page = neutralise_external(page)
        left = external_refs(page)
        if left:
            raise RuntimeError(f"report would load from the network: {left[:3]}")
    dst = Path(out) if out else run_dir / "report.html"
    dst.write_text(page, encoding="utf-8")
    log.info("report: %s", dst)
    return dst


def _env_line(run_dir: Path) -> str:
    """Hardware and versions from the first scenario bundle's ``meta.json`` ("" when none)."""
    for s in registry.all_scenarios():
        p = run_dir / s.name / "meta.json"
        if not p.exists():
            continue
        try:
            m = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            log.warning("report: unreadable %s: %r", p, exc)
            continue
        bits = [
            m.get("gpu_name") or f"CPU x{m.get('cpu_count')}",
            f"torch {m.get('torch_version')}",
            f"diffusers {m.get('diffusers_version')}",
            f"perfkit {m.get('perfkit_version')}",
        ]
        if m.get("git_commit"):
            c = str(m["git_commit"])
            bits.append(f"commit {c[:10]}" + ("+dirty" if c.endswith("+dirty") else ""))
        if m.get("source_digest"):
            bits.append(f"source {m['source_digest']}")
        return ", ".join(str(b) for b in bits)
    return ""


# ---------------------------------------------------------------------------------------------
# Headless Chromium
# ---------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--hide-scrollbars",
    "--disable-extensions",
]


def chromium_binary() -> str | None:
    """Path of a Chromium/Chrome binary (``$PERFKIT_CHROMIUM`` first), or None."""
    for name in (os.environ.get("PERFKIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def screenshot(
    html_path: str | Path,
    png_path: str | Path,
    *,
    width: int = 1280,
    height: int = 2400,
    timeout_s: float = 90,
) -> Path:
    """Save a PNG of the page with headless Chromium. Raises RuntimeError when it cannot."""
    exe = chromium_binary()
    if exe is None:
        raise RuntimeError("chromium not found")
    png = Path(png_path).resolve()
    with tempfile.TemporaryDirectory(prefix="perfkit-chromium-") as prof:
        cmd = [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={prof}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            Path(html_path).resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png

"""One self-contained HTML report per run, a Markdown summary, and notebook display helpers.

:func:`render_report` turns a run directory (``run.json``, executed notebooks, verdicts,
bundles; see :mod:`perfkit.suite`) into ``report.html``:

- the verdict and a summary table at the top (notebook statuses, key numbers, gate rows);
- one section per investigation: the executed notebook with code hidden (nbconvert's
  ``HTMLExporter`` with ``exclude_input``; a failing cell's traceback stays visible);
- images embedded as base64 ``data:`` URIs, our own small stylesheet inline.

The page makes no network request: nbconvert's ``basic`` template is used (no require.js, no
MathJax, no web fonts), scripts/stylesheets loaded from elsewhere are dropped, and
:func:`external_refs` checks that no ``src``/``href``/``url()`` points outside the page; any
that a notebook output carries is made inert (:func:`neutralise_external`).

:func:`write_summary` writes ``summary.md`` (a verdict table for a PR comment);
:func:`show` displays a matplotlib Figure as an embedded PNG in a notebook;
:func:`reading` writes the short plain-words reading of a scenario's results.
"""
from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

log = logging.getLogger(__name__)

TITLES = {
    "cold_warm": "Cold vs warm",
    "warmup_shapes": "Warmup shapes",
    "memory_budget": "Memory budget",
    "baseline_gate": "Baseline gate",
}
QUESTIONS = {
    "cold_warm": "Does the warm request in one server session meet the numbers of the first, "
                 "or does state leak across requests?",
    "warmup_shapes": "Does the startup warmup cover the shapes users send?",
    "memory_budget": "Does the pipeline fit the memory budget, and what does it cost in latency?",
    "baseline_gate": "This run's numbers against the baseline, and the invariants.",
}
STATUS_COLOR = {"pass": "#1a7f37", "ok": "#1a7f37", "fail": "#cf222e", "error": "#cf222e",
                "regression": "#cf222e", "improved": "#0969da", "new": "#6e7781",
                "skipped": "#6e7781", "pending": "#6e7781"}


# ---------------------------------------------------------------------------------------------
# Notebook helpers
# ---------------------------------------------------------------------------------------------

def figure_title(fig: Any) -> str:
    """The figure's title (suptitle, else its axes' titles), for alt text."""
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        return sup.get_text()
    titles = [ax.get_title() for ax in fig.get_axes() if ax.get_title()]
    return "; ".join(titles) or "perfkit figure"


def show(fig: Any, dpi: int = 100, alt: str | None = None) -> None:
    """Display a matplotlib Figure as an embedded PNG with alt text (the figure's title).

    Works without pyplot or ``%matplotlib``; the PNG lands in the notebook's outputs, so the
    HTML report embeds it as a ``data:`` URI.
    """
    from IPython.display import Image, display

    from perfkit.plots import figure_to_png_bytes

    display(Image(data=figure_to_png_bytes(fig, dpi=dpi), format="png",
                  alt=alt or figure_title(fig)))


def _f(v: Any, fmt: str = ".0f", unit: str = "") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(x):
        return "n/a"
    return f"{x:{fmt}}{unit}"


def reading(scenario: str, results: Mapping[str, Any]) -> str:
    """A few sentences of Markdown saying what the results mean, in the design doc's words."""
    r = results or {}
    if scenario == "cold_warm":
        ci = r.get("warm_cold_ratio_ci") or [None, None]
        cs = r.get("cold_start") or {}
        pen = r.get("penalty_ms") or {}
        stage = r.get("penalty_stage")
        ratio = r.get("warm_cold_ratio")
        lines = [
            f"**Cold start** took {_f(cs.get('ready_s'), '.1f', ' s')} until ready "
            f"(process start {_f(cs.get('process_start_s'), '.1f', ' s')}, models loaded "
            f"{_f(cs.get('models_loaded_s'), '.1f', ' s')}, startup warmup "
            f"{_f(cs.get('warmup_s'), '.1f', ' s')}).",
            f"The **cold request** took {_f(r.get('cold_ms'), '.0f', ' ms')}; the **warm** "
            f"median is {_f(r.get('warm_median_ms'), '.0f', ' ms')}: warm/cold ratio "
            f"{_f(ratio, '.2f')} (95% CI {_f(ci[0], '.2f')}..{_f(ci[1], '.2f')}).",
        ]
        if stage:
            lines.append(f"The **first-request penalty** sits mostly in `{stage}` "
                         f"({_f(pen.get(stage), '.0f', ' ms')}).")
        try:
            if ratio is not None and float(ratio) > 1.0:
                lines.append("Warm requests are *slower* than the cold one: look for state that "
                             "leaks across requests (residency, in-flight copies, host copies).")
        except (TypeError, ValueError):
            pass
        failed = [c for c in (r.get("leak_checks") or []) if c.get("passed") is False]
        if failed:
            lines.append("Leak checks failed: " + ", ".join(
                f"`{c['name']}` = {_f(c.get('value'), '.3g')} > {_f(c.get('threshold'), '.3g')}"
                for c in failed) + ".")
        elif r.get("leak_checks"):
            measured = [c for c in r["leak_checks"] if c.get("value") is not None]
            unmeasured = [c for c in r["leak_checks"] if c.get("value") is None]
            if measured:
                lines.append("Every measured leak check passed (" + ", ".join(
                    f"`{c['name']}`" for c in measured) + ").")
            if unmeasured:
                lines.append("Not measured on this host: " + ", ".join(
                    f"`{c['name']}`" for c in unmeasured) + " (no device memory readings).")
        return "\n\n".join(lines)
    if scenario == "warmup_shapes":
        rows = r.get("coverage") or []
        if not rows:
            return "No coverage results."
        out = []
        for c in rows:
            cov = "covered" if c.get("covered") else "**not covered**"
            out.append(f"- warmup {c.get('warmup_frames')} frames → request "
                       f"{c.get('request_frames')} frames: {cov}; first request "
                       f"{_f(c.get('first_ms'), '.0f', ' ms')} vs warm median "
                       f"{_f(c.get('warm_median_ms'), '.0f', ' ms')} (penalty "
                       f"{_f(c.get('penalty_ms'), '.0f', ' ms')}, x{_f(c.get('ratio'), '.2f')}, "
                       f"{c.get('compiles', 'n/a')} compiles"
                       + (f", mostly in `{c['penalty_stage']}`" if c.get("penalty_stage") else "")
                       + ").")
        uncovered = [c for c in rows if not c.get("covered")]
        tail = ("A shape the warmup does not cover pays its shape setup (recompilation, graph "
                "capture) on the first user request." if uncovered else
                "Every requested shape is covered by the startup warmup.")
        return "\n".join(out) + "\n\n" + tail
    if scenario == "memory_budget":
        rows = r.get("caps") or []
        out = []
        for c in rows:
            out.append(f"- **{c.get('label')}**: "
                       + ("completed" if c.get("completed") else "**did not complete**")
                       + ", cap " + ("held" if c.get("cap_held") else "**not held**")
                       + f" (enforcement {c.get('enforcement')}); peak reserved "
                       f"{_f(c.get('peak_reserved_mb'), '.0f', ' MiB')}, host anon peak "
                       f"{_f(c.get('host_anon_peak_mib'), '.0f', ' MiB')}, placement "
                       f"{c.get('placement') or 'n/a'}"
                       + ("; warm requests degrade" if c.get("warm_degrades") else "") + ".")
        mb = r.get("min_budget_gib")
        out.append("")
        out.append(f"Smallest device budget that completes: {_f(mb, '.1f', ' GiB')}." if mb
                   is not None else "Smallest device budget: not searched (no GPU, or not asked).")
        return "\n".join(out)
    return ""


def summary_frame(scenario: str, results: Mapping[str, Any]) -> pd.DataFrame:
    """The headline numbers of a scenario as a small table (for notebooks and the report)."""
    r = results or {}
    if scenario == "cold_warm":
        cs = r.get("cold_start") or {}
        ci = r.get("warm_cold_ratio_ci") or [None, None]
        rows = [("cold start: ready (s)", cs.get("ready_s")),
                ("cold start: models loaded (s)", cs.get("models_loaded_s")),
                ("cold start: startup warmup (s)", cs.get("warmup_s")),
                ("cold request (ms)", r.get("cold_ms")),
                ("warm median (ms)", r.get("warm_median_ms")),
                ("warm/cold ratio", r.get("warm_cold_ratio")),
                ("warm/cold ratio 95% CI", f"{_f(ci[0], '.3f')}..{_f(ci[1], '.3f')}"),
                ("first-request penalty stage", r.get("penalty_stage"))]
        for st, ms in (r.get("penalty_ms") or {}).items():
            rows.append((f"penalty {st} (ms)", ms))
        return pd.DataFrame(rows, columns=["metric", "value"])
    if scenario == "warmup_shapes":
        return _cols(pd.DataFrame(r.get("coverage") or []), COVERAGE_COLUMNS)
    if scenario == "memory_budget":
        return _cols(pd.DataFrame(r.get("caps") or []), CAPS_COLUMNS)
    return pd.DataFrame()


COVERAGE_COLUMNS = ["warmup_frames", "request_frames", "warmup_latent_frames",
                    "request_latent_frames", "covered", "first_ms", "warm_median_ms", "penalty_ms",
                    "ratio", "compiles", "penalty_stage", "error"]
CAPS_COLUMNS = ["label", "device_cap_gib", "host_cap_gib", "completed", "cap_held", "enforcement",
                "peak_reserved_mb", "host_anon_peak_mib", "placement", "cold_ms", "warm_ms",
                "warm_degrades", "error"]


def _cols(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The listed columns that exist, in that order (the full rows stay in results.json)."""
    if df.empty:
        return df
    keep = [c for c in cols if c in df.columns]
    if "error" in keep and df["error"].isna().all():
        keep.remove("error")
    return df[keep]


# ---------------------------------------------------------------------------------------------
# Summary (Markdown)
# ---------------------------------------------------------------------------------------------

def _run_info(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "run.json"
    if p.exists():
        return json.loads(p.read_text())
    # a run dir made by hand (perfkit run): infer from files
    from perfkit.suite import NOTEBOOKS, read_verdict

    nbs = []
    for name in NOTEBOOKS:
        nbp = run_dir / "notebooks" / f"{name}.ipynb"
        if nbp.exists() or read_verdict(run_dir / name):
            from perfkit.suite import _error_of

            ename, err = _error_of(nbp) if nbp.exists() else (None, None)
            nbs.append({"name": name, "status": "error" if err else "ok", "error": err,
                        "ename": ename, "wall_s": None, "output": str(nbp)})
    return {"name": run_dir.name, "notebooks": nbs}


def _key_numbers(run_dir: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for s in ("cold_warm", "warmup_shapes", "memory_budget"):
        p = run_dir / s / "results.json"
        if not p.exists():
            continue
        r = json.loads(p.read_text())
        if s == "cold_warm":
            cs = r.get("cold_start") or {}
            out += [("cold start, ready", _f(cs.get("ready_s"), ".1f", " s")),
                    ("cold request", _f(r.get("cold_ms"), ".0f", " ms")),
                    ("warm median", _f(r.get("warm_median_ms"), ".0f", " ms")),
                    ("warm/cold ratio", _f(r.get("warm_cold_ratio"), ".2f")),
                    ("first-request penalty stage", str(r.get("penalty_stage") or "n/a"))]
        elif s == "warmup_shapes":
            for c in r.get("coverage") or []:
                out.append((f"warmup {c.get('warmup_frames')}f → request {c.get('request_frames')}f",
                            ("covered" if c.get("covered") else "not covered")
                            + f", penalty {_f(c.get('penalty_ms'), '.0f', ' ms')}, "
                            f"{c.get('compiles', 'n/a')} compiles"))
        else:
            for c in r.get("caps") or []:
                out.append((f"cap {c.get('label')}",
                            ("completed" if c.get("completed") else "did not complete")
                            + ", " + ("held" if c.get("cap_held") else "not held")
                            + f", peak reserved {_f(c.get('peak_reserved_mb'), '.0f', ' MiB')}"))
            if r.get("min_budget_gib") is not None:
                out.append(("minimum device budget", _f(r["min_budget_gib"], ".1f", " GiB")))
    return out


def _md_cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(v) for v in rec) + " |")
    return "\n".join(lines)


def _status_text(n: dict[str, Any]) -> str:
    """A notebook's status, with the reason when skipped: ``skipped (no bundle in replay dir)``."""
    st = str(n.get("status"))
    return f"{st} ({n['reason']})" if st == "skipped" and n.get("reason") else st


def _run_status(run_dir: Path) -> tuple[dict[str, Any], pd.DataFrame, int, str]:
    """(run.json info, verdict rows, exit code, status word) of a run directory."""
    from perfkit.suite import STATUS_WORD, collect_verdicts, exit_code_for

    info = _run_info(run_dir)
    verdicts = collect_verdicts(run_dir)
    code = info.get("exit_code")
    if code is None:
        code = exit_code_for(info.get("notebooks", []), verdicts)
    return info, verdicts, code, STATUS_WORD.get(code, "error")


def summary_markdown(run_dir: str | Path) -> str:
    """The run's verdict as Markdown: status line, notebooks, key numbers, gate rows."""
    from perfkit.suite import read_verdict

    run_dir = Path(run_dir)
    info, verdicts, code, word = _run_status(run_dir)
    icon = {"pass": "✅", "regression": "❌", "error": "💥"}.get(word, "")
    n_fail = int((verdicts["status"] == "fail").sum()) if not verdicts.empty else 0
    n_pass = int(verdicts["status"].isin(["pass", "improved"]).sum()) if not verdicts.empty else 0
    parts = [f"## perfkit: {info.get('name', run_dir.name)} — {icon} {word.upper()} (exit {code})",
             "", f"{n_pass} gates passed, {n_fail} failed."]
    if info.get("description"):
        parts += ["", info["description"]]
    nbs = info.get("notebooks", [])
    if nbs:
        parts += ["", "### Notebooks", "",
                  _md_table(pd.DataFrame([{"notebook": n["name"], "status": _status_text(n),
                                           "wall (s)": n.get("wall_s"),
                                           "error": (n.get("error") or "")[:200]}
                                          for n in nbs]))]
    gate_doc = read_verdict(run_dir / "baseline_gate") or {}
    if gate_doc.get("warnings"):
        parts += ["", "### Warnings", "", *[f"- {w}" for w in gate_doc["warnings"]]]
    keys = _key_numbers(run_dir)
    if keys:
        parts += ["", "### Key numbers", "",
                  _md_table(pd.DataFrame(keys, columns=["what", "value"]))]
    if not verdicts.empty:
        shown = verdicts[verdicts["status"] != "skipped"]
        parts += ["", "### Gates", "",
                  _md_table(shown[["case", "metric", "expected", "actual", "status", "reason"]])]
        sk = len(verdicts) - len(shown)
        if sk:
            parts.append(f"\n{sk} rows skipped (not measured here).")
    return "\n".join(parts) + "\n"


def write_summary(run_dir: str | Path) -> str:
    text = summary_markdown(run_dir)
    (Path(run_dir) / "summary.md").write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1f2328;
 background:#fff;line-height:1.45}
main{max-width:1100px;margin:0 auto;padding:16px 24px 64px}
h1{font-size:1.6em;margin:.4em 0} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;
 margin-top:1.6em} h3{margin-top:1.2em}
.badge{display:inline-block;padding:.15em .6em;border-radius:1em;color:#fff;font-weight:600}
#verdict{font-size:1.3em;margin:.5em 0 1em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa} tr:nth-child(even) td{background:#fbfcfd}
td.st{font-weight:600}
nav ul{columns:2;padding-left:1.2em}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:.85em;white-space:pre-wrap}
img{max-width:100%;height:auto}
.nb .jp-OutputArea-output,.nb .output_area{margin:.4em 0}
.nb .output_error pre{background:#ffebe9}
.error-box{border:2px solid #cf222e;background:#ffebe9;padding:8px 12px;margin:.6em 0}
.muted{color:#6e7781}
.nb h1{font-size:1.5em;border-bottom:2px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
.nb h2{font-size:1.15em;border:0} .anchor-link{display:none}
section{margin-top:2.5em}
.ansi-red-fg{color:#cf222e}.ansi-green-fg{color:#1a7f37}.ansi-yellow-fg{color:#9a6700}
.ansi-blue-fg{color:#0969da}.ansi-magenta-fg{color:#8250df}.ansi-cyan-fg{color:#1b7c83}
.ansi-bold{font-weight:bold}
"""

_EXTERNAL = re.compile(
    r"""(?:(?<![\w-])(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//)"""
    r"""|(?:url\(\s*["']?\s*(?:https?:)?//)|(?:@import\s+["']?(?:https?:)?//)""", re.I)


def external_refs(text: str) -> list[str]:
    """Snippets of ``text`` that would make a browser fetch something from the network."""
    return [text[max(0, m.start() - 40): m.end() + 60] for m in _EXTERNAL.finditer(text)]


_ATTR_EXT = re.compile(r"""(?<![\w-])(src|href|action|poster|data)(\s*=\s*["']?\s*)((?:https?:)?//)""", re.I)
_URL_EXT = re.compile(r"""(url\(\s*["']?\s*)((?:https?:)?//)""", re.I)
_IMPORT_EXT = re.compile(r"""(@import\s+["']?)((?:https?:)?//)""", re.I)


def neutralise_external(text: str) -> str:
    """Make network references inert: ``src="https://x"`` -> ``data-offline-src="https://x"``,
    ``url(https://x)`` -> ``url(data:,https://x)``."""
    text = _ATTR_EXT.sub(lambda m: f"data-offline-{m.group(1)}{m.group(2)}{m.group(3)}", text)
    text = _URL_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)
    return _IMPORT_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)


def _strip_external(body: str) -> str:
    """Drop script/link elements that load from the network (belt and braces)."""
    body = re.sub(r"<script[^>]*\bsrc\s*=[^>]*>\s*</script>", "", body, flags=re.I)
    body = re.sub(r"<link[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", "", body, flags=re.I)
    return body


def notebook_body(nb_path: str | Path) -> str:
    """HTML fragment of an executed notebook: code hidden, outputs (images embedded) kept."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    # progress bars and log lines on stderr are for the person at the terminal, not the report
    # (the executed notebook keeps them); errors (tracebacks) stay
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.get("outputs", [])
                            if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    exp = HTMLExporter(template_name="basic", exclude_input=True, exclude_input_prompt=True,
                       exclude_output_prompt=True, embed_images=True)
    exp.mathjax_url = ""
    body, _ = exp.from_notebook_node(nb)
    return _strip_external(body)


def _table_html(df: pd.DataFrame, status_col: str | None = "status") -> str:
    if df.empty:
        return "<p class='muted'>none</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.to_dict("records"):
        cells = []
        for c in df.columns:
            v = rec[c]
            txt = _md_cell(v).replace("\\|", "|")
            if c == status_col and isinstance(v, str):
                cells.append(f"<td class='st' style='color:{STATUS_COLOR.get(v, '#1f2328')}'>"
                             f"{html.escape(v)}</td>")
            else:
                cells.append(f"<td>{html.escape(txt)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def render_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``run_dir/report.html`` (or ``out``) from the run's files. Returns its path.

    Raises:
        RuntimeError: if the page would load anything from the network (a bug to fix here).
    """
    run_dir = Path(run_dir)
    info, verdicts, code, word = _run_status(run_dir)
    color = STATUS_COLOR.get(word, "#cf222e")
    title = f"perfkit report: {info.get('name', run_dir.name)}"
    nbs = info.get("notebooks", [])

    parts = [f"<h1>{html.escape(title)}</h1>",
             f"<div id='verdict'>Verdict: <span class='badge' style='background:{color}'>"
             f"{html.escape(word.upper())}</span> <span class='muted'>(exit code {code})</span>"
             "</div>"]
    meta = []
    if info.get("description"):
        meta.append(html.escape(info["description"]))
    if info.get("params_file"):
        meta.append(f"params <code>{html.escape(info['params_file'])}</code>")
    if info.get("finished"):
        meta.append(f"finished {html.escape(info['finished'])}")
    if info.get("wall_s") is not None:
        meta.append(f"wall time {info['wall_s']:.0f} s")
    if info.get("replay"):
        meta.append(f"replayed from <code>{html.escape(info['replay'])}</code>")
    env = _env_line(run_dir)
    if env:
        meta.append(html.escape(env))
    if meta:
        parts.append("<p class='muted'>" + " · ".join(meta) + "</p>")
    errors = [n for n in nbs if n.get("status") == "error"]
    for n in errors:
        parts.append(f"<div class='error-box'><b>{html.escape(n['name'])} failed:</b> "
                     f"<code>{html.escape(n.get('error') or 'unknown error')}</code> — see "
                     f"<a href='#{html.escape(n['name'])}'>its section</a>.</div>")
    parts.append("<h2 id='summary'>Summary</h2>")
    if nbs:
        parts.append(_table_html(pd.DataFrame([{"notebook": n["name"], "status": n["status"],
                                                "wall (s)": n.get("wall_s"),
                                                "error": n.get("error") or n.get("reason") or ""}
                                               for n in nbs])))
    keys = _key_numbers(run_dir)
    if keys:
        parts.append("<h3>Key numbers</h3>")
        parts.append(_table_html(pd.DataFrame(keys, columns=["what", "value"]), None))
    parts.append("<h3>Gates</h3>")
    if verdicts.empty:
        parts.append("<p class='muted'>no gate rows (see errors above)</p>")
    else:
        v = verdicts[["notebook", "case", "metric", "expected", "actual", "bound", "status",
                      "reason"]]
        order = {"fail": 0, "improved": 1, "pass": 2, "new": 3, "skipped": 4}
        v = v.assign(_o=v["status"].map(order).fillna(5)).sort_values("_o", kind="stable") \
            .drop(columns="_o")
        parts.append(_table_html(v))
    toc = "".join(f"<li><a href='#{n['name']}'>{html.escape(TITLES.get(n['name'], n['name']))}"
                  f"</a> — <span style='color:{STATUS_COLOR.get(n['status'], '#1f2328')}'>"
                  f"{html.escape(_status_text(n))}</span></li>" for n in nbs)
    if toc:
        parts.insert(2, f"<nav><ul>{toc}</ul></nav>")
    for n in nbs:
        name = n["name"]
        parts.append(f"<section id='{html.escape(name)}'>")
        nbp = Path(n.get("output") or run_dir / "notebooks" / f"{name}.ipynb")
        if not nbp.is_absolute():
            nbp = run_dir / nbp
        if not nbp.exists():
            nbp = run_dir / "notebooks" / f"{name}.ipynb"
        if n.get("status") == "skipped" or not nbp.exists():
            parts.append(f"<h2>{html.escape(TITLES.get(name, name))}</h2>")
            if QUESTIONS.get(name):
                parts.append(f"<p><i>{html.escape(QUESTIONS[name])}</i></p>")
        if n.get("status") == "skipped":
            why = n.get("reason") or "disabled in the params"
            parts.append(f"<p class='muted'>skipped ({html.escape(why)})</p></section>")
            continue
        if n.get("status") == "error":
            parts.append(f"<div class='error-box'><b>{html.escape(name)} failed:</b> "
                         f"<code>{html.escape(n.get('error') or '')}</code> (traceback below)"
                         "</div>")
        if nbp.exists():
            try:
                parts.append(f"<div class='nb'>{notebook_body(nbp)}</div>")
            except Exception as exc:  # noqa: BLE001 - a broken notebook must not kill the report
                parts.append(f"<div class='error-box'>cannot render {html.escape(str(nbp))}: "
                             f"{html.escape(repr(exc))}</div>")
        else:
            parts.append("<p class='muted'>no executed notebook</p>")
        parts.append("</section>")
    page = ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(parts)}</main></body></html>\n")
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
    for s in ("cold_warm", "warmup_shapes", "memory_budget"):
        p = run_dir / s / "meta.json"
        if p.exists():
            m = json.loads(p.read_text())
            bits = [m.get("gpu_name") or f"CPU x{m.get('cpu_count')}",
                    f"torch {m.get('torch_version')}", f"diffusers {m.get('diffusers_version')}",
                    f"perfkit {m.get('perfkit_version')}"]
            if m.get("git_commit"):
                bits.append(f"commit {str(m['git_commit'])[:10]}")
            return ", ".join(str(b) for b in bits)
    return ""


# ---------------------------------------------------------------------------------------------
# Headless Chromium
# ---------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic",
                  "--no-first-run", "--hide-scrollbars", "--disable-extensions"]


def chromium_binary() -> str | None:
    for name in (os.environ.get("PERFKIT_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def screenshot(html_path: str | Path, png_path: str | Path, *, width: int = 1280,
               height: int = 2400, timeout_s: float = 90) -> Path:
    """Save a PNG of the page with headless Chromium. Raises RuntimeError when it cannot."""
    exe = chromium_binary()
    if exe is None:
        raise RuntimeError("chromium not found")
    png = Path(png_path).resolve()
    with tempfile.TemporaryDirectory(prefix="perfkit-chromium-") as prof:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={prof}", f"--window-size={width},{height}",
               f"--screenshot={png}", Path(html_path).resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): "
                           f"{proc.stderr[-500:]}")
    return png


def data_uri_png(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()

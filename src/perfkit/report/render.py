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

from perfkit.gate.verdicts import GATE, STATUS_WORD, collect_verdicts, exit_code_for, notebooks, read_verdict
from perfkit.scenarios import registry

log = logging.getLogger(__name__)

GATE_TITLE = "Baseline gate"
GATE_QUESTION = "This run's numbers against the baseline, and the invariants."


def section_title(name: str) -> str:
    """The heading of a notebook's section: the scenario's title, or the gate's."""
    return GATE_TITLE if name == GATE else registry.get(name).title


def section_question(name: str) -> str:
    return GATE_QUESTION if name == GATE else registry.get(name).question


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

    from perfkit.report.plots import figure_to_png_bytes

    display(Image(data=figure_to_png_bytes(fig, dpi=dpi), format="png",
                  alt=alt or figure_title(fig)))


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
        return json.loads(p.read_text())
    # a run dir made by hand (perfkit run): infer from files
    nbs = []
    for name in notebooks():
        nbp = run_dir / "notebooks" / f"{name}.ipynb"
        if nbp.exists() or read_verdict(run_dir / name):
            ename, err = notebook_error(nbp) if nbp.exists() else (None, None)
            nbs.append({"name": name, "status": "error" if err else "ok", "error": err,
                        "ename": ename, "wall_s": None, "output": str(nbp)})
    return {"name": run_dir.name, "notebooks": nbs}


def key_numbers(run_dir: Path) -> list[tuple[str, str]]:
    """(what, value) of every scenario's key numbers, from ``run_dir/<scenario>/results.json``."""
    out: list[tuple[str, str]] = []
    for s in registry.all_scenarios():
        p = run_dir / s.name / "results.json"
        if p.exists():
            out += [(k.label, k.text) for k in s.key_numbers(json.loads(p.read_text()))]
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
    info = _run_info(run_dir)
    verdicts = collect_verdicts(run_dir)
    code = info.get("exit_code")
    if code is None:
        code = exit_code_for(info.get("notebooks", []), verdicts)
    return info, verdicts, code, STATUS_WORD.get(code, "error")


def summary_markdown(run_dir: str | Path) -> str:
    """The run's verdict as Markdown: status line, notebooks, key numbers, gate rows."""
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
    keys = key_numbers(run_dir)
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
    keys = key_numbers(run_dir)
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
    toc = "".join(f"<li><a href='#{n['name']}'>{html.escape(section_title(n['name']))}"
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
            parts.append(f"<h2>{html.escape(section_title(name))}</h2>")
            parts.append(f"<p><i>{html.escape(section_question(name))}</i></p>")
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

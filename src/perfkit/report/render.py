"""The run's HTML page (:func:`render_report`) and one notebook's section of it (its template
:func:`section_template`, what it gets :func:`section_context`, the executed notebook as offline
HTML :func:`notebook_body`; :func:`external_refs` finds what would make a browser fetch from the
network, :func:`neutralise_external` makes it inert), the jinja2 environment, the page's PNG
(:func:`screenshot`, headless Chromium) and the notebook display helpers; re-exports the names
callers import. The page's rules (no network, no markup in Python, one table formatter):
docs/suite.md, "The report page"."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import markupsafe
import pandas as pd

from perfkit.bundle import read_meta
from perfkit.engine.owner import run_bounded
from perfkit.gate.verdicts import GATE, check_counts, read_verdict
from perfkit.investigations import registry
from perfkit.report.belowstage import panel as below_stage_panel
from perfkit.report.rootcause import root_cause
from perfkit.report.runinfo import (  # noqa: F401
    GATE_COLUMNS,
    GATE_ORDER,
    bundle_dirs,
    engine_ends_frame,
    gate_result,
    gate_view,
    investigation_key_numbers,
    investigations,
    investigations_table,
    key_numbers,
    notebook_error,
    refused_records,
    run_status,
    run_warnings,
    section_question,
    section_title,
    status_text,
    units_frame,
)
from perfkit.report.summary import (  # noqa: F401
    engine_versions_text,
    relative_paths,
    summary_markdown,
    write_summary,
)
from perfkit.report.tables import Table, format_table, status_class

if TYPE_CHECKING:  # annotations only: jinja2 is imported where HTML is rendered
    import jinja2

log = logging.getLogger(__name__)


_ATTR_EXT = re.compile(r"""(?<![\w-])(src|href|action|poster|data)(\s*=\s*["']?\s*)((?:https?:)?//)""", re.I)
_URL_EXT = re.compile(r"""(url\(\s*["']?\s*)((?:https?:)?//)""", re.I)
_IMPORT_EXT = re.compile(r"""(@import\s+["']?)((?:https?:)?//)""", re.I)
_EXTERNAL = re.compile("|".join(p.pattern for p in (_ATTR_EXT, _URL_EXT, _IMPORT_EXT)), re.I)
_SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc\s*=[^>]*>\s*</script>", re.I)
_LINK_EXT = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", re.I)


def external_refs(text: str) -> list[str]:
    """Snippets of ``text`` that would make a browser fetch something from the network
    (``src=``/``href=``/``action=``/``poster=``/``data=`` to ``//`` or ``http(s)://``, CSS
    ``url(//…)`` and ``@import``). Empty when the page is self-contained."""
    return [text[max(0, m.start() - 40) : m.end() + 60] for m in _EXTERNAL.finditer(text)]


def neutralise_external(text: str) -> str:
    """Make network references inert: ``src="https://x"`` -> ``data-offline-src="https://x"``,
    ``url(https://x)`` -> ``url(data:,https://x)``."""
    text = _ATTR_EXT.sub(lambda m: f"data-offline-{m.group(1)}{m.group(2)}{m.group(3)}", text)
    text = _URL_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)
    return _IMPORT_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)


#: the page template; it includes ``report.css`` inline and renders each section's HTML
PAGE_TEMPLATE = "page.html.j2"
#: the gate notebook's section template (investigation sections come from the registry)
GATE_TEMPLATE = f"sections/{GATE}.html.j2"
#: the section of a notebook that is neither registered nor the gate (a run of an older perfkit)
FALLBACK_SECTION_TEMPLATE = "sections/_base.html.j2"


@functools.lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The report's jinja2 environment (``templates/``, autoescaped, filter ``status_class``).
    Raises ValueError: the templates directory is not installed."""
    import jinja2  # here, not at the top: a notebook kernel renders no HTML

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("perfkit.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )
    env.filters["status_class"] = status_class
    return env


def notebook_body(nb_path: str | Path, drop_heading: str | None = None) -> str:
    """HTML of an executed notebook (nbconvert's ``basic``, offline): code hidden, stderr
    dropped, a first Markdown cell ``# <drop_heading>`` left out.

    Raises:
        OSError, nbformat.ValidationError, ValueError: when the notebook cannot be read."""
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
    return _LINK_EXT.sub("", _SCRIPT_SRC.sub("", body))  # network scripts and links: dropped


def section_template(name: str) -> str:
    """The section template of ``name``: the investigation's, the gate's, or the shared base."""
    if name == GATE:
        return GATE_TEMPLATE
    try:
        return registry.get(name).template
    except KeyError:
        log.warning("report: notebook %r is not a registered investigation; plain section", name)
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
    """What a section template gets for notebook entry ``n`` of ``run.json`` (the keys below).
    Never raises on a broken notebook or results file: logged and shown in the section."""
    run_dir = Path(run_dir)
    name = str(n["name"])
    status = str(n.get("status") or "")
    try:
        title, question = section_title(name), section_question(name)
        intro = registry.get(name).section_intro if name != GATE else ""
    except KeyError:
        title, question, intro = name, "", ""
    keys, keys_error = [], None
    if name != GATE:
        try:
            keys = investigation_key_numbers(run_dir, name)
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
        "intro": intro,
        "status": status,
        "status_text": status_text(n),
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
    """The HTML of one notebook's section. Raises jinja2.TemplateNotFound: a missing template."""
    ctx = section_context(run_dir, n)
    return template_env().get_template(section_template(ctx["name"])).render(**ctx)


CHROMIUM_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update "
    "--disable-sync --disable-quic --no-first-run --hide-scrollbars --disable-extensions"
).split()


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
        proc = run_bounded(cmd, timeout_s, capture_output=True, text=True)  # its helpers too
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png


def show(fig: Any, dpi: int = 100, alt: str | None = None) -> None:
    """Display a matplotlib Figure in a notebook as a PNG with alt text (:func:`perfkit.report.plots.alt_text`);
    no pyplot needed, and the report embeds it as a ``data:`` URI."""
    from IPython.display import Image, display

    from perfkit.report.plots import alt_text, figure_to_png_bytes

    display(Image(data=figure_to_png_bytes(fig, dpi=dpi), format="png", alt=alt or alt_text(fig)))


def reading(investigation: str, results: Mapping[str, Any]) -> str:
    """A few sentences of Markdown saying what the results mean (the investigation's ``reading``)."""
    return registry.get(investigation).reading(results or {})


def summary_frame(investigation: str, results: Mapping[str, Any]) -> pd.DataFrame:
    """The headline numbers of an investigation as a small table (the investigation's ``summary_table``)."""
    return registry.get(investigation).summary_table(results or {})


def _gate_table(verdicts: pd.DataFrame, statuses: tuple[str, ...] | None = None) -> Table:
    """The gate rows (failures first) as a table, of ``statuses`` only when given."""
    v = gate_view(verdicts)[GATE_COLUMNS]
    return format_table(v if statuses is None else v[v["status"].isin(statuses)])


def gate_counts(verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    """``[{"status", "n", "text"}]`` per gate status present, failures first
    (``"60 passed"``, ``"1 failed"``, ``"30 skipped"``)."""
    if verdicts.empty:
        return []
    words = {"fail": "failed", "pass": "passed", "improved": "improved", "new": "new", "skipped": "skipped"}
    words["inconclusive"] = "inconclusive (noise could flip)"
    counts = verdicts["status"].astype(str).value_counts()
    order = sorted(counts.index, key=lambda s: GATE_ORDER.get(s, 5))
    return [{"status": s, "n": int(counts[s]), "text": f"{int(counts[s])} {words.get(s, s)}"} for s in order]


def page_context(run_dir: str | Path) -> dict[str, Any]:
    """What ``page.html.j2`` gets for a run directory (the keys below; tables are
    :class:`~perfkit.report.tables.Table` or None, sections :class:`markupsafe.Markup`)."""
    run_dir = Path(run_dir)
    info, verdicts, code, word = run_status(run_dir)
    nbs = info.get("notebooks", [])
    meta: list[dict[str, Any]] = []
    if info.get("description"):
        meta.append({"text": info["description"]})
    if info.get("params_file"):
        sets = "".join(f" --set {x}" for x in info.get("params_set") or ())
        meta.append({"text": "params", "code": info["params_file"] + sets})
    if info.get("finished"):
        meta.append({"text": f"finished {info['finished']}"})
    if info.get("wall_s") is not None:
        meta.append({"text": f"wall time {info['wall_s']:.0f} s"})
    if info.get("replay"):
        meta.append({"text": "replayed from", "code": info["replay"]})
    inv = investigations(run_dir, nbs)
    toc = [{**i, "status_text": i["ran"]} for i in inv]
    rows = pd.DataFrame(investigations_table(inv, checks=True))
    nb_table = format_table(rows, status_col="gate") if nbs else None
    keys = key_numbers(run_dir)
    return {
        "title": f"perfkit report: {info.get('name', run_dir.name)}",
        "verdict": word,
        "exit_code": code,
        "meta": meta,
        "environment": _env_line(run_dir),
        "toc": toc,
        "failed": _failed_boxes(toc, verdicts),
        "errors": [n for n in nbs if n.get("status") == "error"],
        "notebooks_table": nb_table,
        "units_table": format_table(units) if (units := units_frame(info)) is not None else None,
        "engine_ends_table": format_table(ends) if (ends := engine_ends_frame(run_dir)) is not None else None,
        "key_numbers": format_table(pd.DataFrame(keys, columns=["what", "value"]), None) if keys else None,
        "warnings": run_warnings(run_dir),
        "gates": _gate_table(verdicts),
        "gates_attention": _gate_table(verdicts, ("fail", "improved")),
        "gate_counts": gate_counts(verdicts),
        "sections": [markupsafe.Markup(render_section(run_dir, n)) for n in nbs],
    }


def _failed_boxes(toc: list[dict[str, Any]], verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    """The toc entries that get a red box (docs/suite.md)."""
    out = []
    for t in toc:
        if t["gate"] != "fail":
            continue
        if t["name"] == GATE and "notebook" in verdicts:
            own = verdicts[verdicts["notebook"] == GATE]["status"]
            if not (own == "fail").any():
                continue
            t = {**t, "gate_text": f"fail: {check_counts(own)} that no investigation holds"}
        out.append(t)
    return out


def render_page(run_dir: str | Path) -> str:
    """The report page of ``run_dir`` as HTML (not yet checked for network references)."""
    return template_env().get_template(PAGE_TEMPLATE).render(**page_context(run_dir))


def render_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``run_dir/report.html`` (or ``out``) and return its path. Raises RuntimeError: the
    page would load from the network; jinja2.TemplateError: a missing or broken template."""
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


def write_tool_outputs(
    out: str | Path, md: str, template: str, context: Mapping[str, Any], what: str, **page: Any
) -> dict[str, Path]:
    """``summary.md`` (``md``, also appended to ``$GITHUB_STEP_SUMMARY``) and ``report.html`` (the
    page with the one section ``template`` renders from ``context``; ``page``: its title, verdict,
    exit_code, meta, warnings, gates) under ``out``: ``{"summary": path, "report": path}``.
    Raises RuntimeError: the page would load from the network (names ``what``)."""
    section = template_env().get_template(template).render(**context)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(md, encoding="utf-8")
    gh = os.environ.get("GITHUB_STEP_SUMMARY")
    if gh:
        with open(gh, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    html = (
        template_env()
        .get_template(PAGE_TEMPLATE)
        .render(
            environment=None,
            toc=[],
            errors=[],
            notebooks_table=None,
            key_numbers=None,
            sections=[markupsafe.Markup(section)],
            **page,
        )
    )
    bad = external_refs(html)
    if bad:
        raise RuntimeError(f"{what} report would load from the network: {bad[:3]}")
    (out / "report.html").write_text(html, encoding="utf-8")
    return {"summary": out / "summary.md", "report": out / "report.html"}


def _env_line(run_dir: Path) -> str:
    """Hardware and versions (engine's, perfkit's) from the first bundle's ``meta.json``, or ""."""
    for d in bundle_dirs(run_dir):
        try:
            m = read_meta(d)
        except (OSError, ValueError) as exc:
            log.warning("report: unreadable %s: %r", d / "meta.json", exc)
            continue
        bits = [m.get("gpu_name") or f"CPU x{m.get('cpu_count')}", engine_versions_text(m)]
        bits.append(f"perfkit {m.get('perfkit_version')} (torch {m.get('torch_version')})")
        if m.get("git_commit"):
            c = str(m["git_commit"])
            bits.append(f"commit {c[:10]}" + ("+dirty" if c.endswith("+dirty") else ""))
        if m.get("source_digest"):
            bits.append(f"source {m['source_digest']}")
        return ", ".join(str(b) for b in bits)
    return ""

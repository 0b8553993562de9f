"""One notebook's section of the report page: its template (:func:`section_template`), what the
template gets (:func:`section_context`), the executed notebook as offline HTML
(:func:`notebook_body`; :func:`external_refs` finds what would make a browser fetch from the
network, :func:`neutralise_external` makes it inert) and the jinja2 environment."""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from perfkit.gate.verdicts import GATE, read_verdict
from perfkit.investigations import registry
from perfkit.report.belowstage import panel as below_stage_panel
from perfkit.report.rootcause import root_cause
from perfkit.report.runinfo import (
    gate_result,
    investigation_key_numbers,
    section_question,
    section_title,
    status_text,
)
from perfkit.report.tables import status_class

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

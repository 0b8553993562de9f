"""The run's HTML page (:func:`render_report`), its PNG (:func:`screenshot`, headless Chromium)
and the notebook display helpers; re-exports the names callers import. The page's rules (no
network, no markup in Python, one table formatter): docs/suite.md, "The report page"."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import markupsafe
import pandas as pd

from perfkit.bundle import read_meta
from perfkit.engine.owner import run_bounded
from perfkit.gate.verdicts import GATE, check_counts
from perfkit.investigations import registry
from perfkit.report.runinfo import (  # noqa: F401
    GATE_COLUMNS,
    GATE_ORDER,
    engine_ends_frame,
    gate_view,
    investigations,
    investigations_table,
    key_numbers,
    notebook_error,
    refused_records,
    run_status,
    run_warnings,
    section_title,
    units_frame,
)
from perfkit.report.sections import (  # noqa: F401
    FALLBACK_SECTION_TEMPLATE,
    GATE_TEMPLATE,
    PAGE_TEMPLATE,
    external_refs,
    neutralise_external,
    notebook_body,
    render_section,
    section_template,
    template_env,
)
from perfkit.report.summary import (  # noqa: F401
    engine_versions_text,
    relative_paths,
    summary_markdown,
    write_summary,
)
from perfkit.report.tables import Table, format_table

log = logging.getLogger(__name__)

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
    """The gate rows (failures first) as a formatted table; only rows whose status is in
    ``statuses`` when given."""
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
    """The toc entries that get a red box; the gate's only for failed rows no investigation
    holds (docs/suite.md)."""
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
    for s in registry.all_investigations():
        if not (run_dir / s.name / "meta.json").exists():
            continue
        try:
            m = read_meta(run_dir / s.name)
        except (OSError, ValueError) as exc:
            log.warning("report: unreadable %s: %r", run_dir / s.name / "meta.json", exc)
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

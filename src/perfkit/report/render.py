"""The run's offline HTML page (:func:`render_report`, :func:`screenshot`), ``summary.md``
(:func:`write_summary`) and the notebook display helpers. Rules: docs/suite.md."""

from __future__ import annotations

import bisect
import functools
import logging
import os
import re
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import markupsafe
import pandas as pd

from perfkit.bundle import ResultBundle
from perfkit.common import SUMMARY_LIMIT
from perfkit.common.provenance import repo_root
from perfkit.common.slugs import clip, md_text
from perfkit.engine.owner import run_bounded
from perfkit.gate.verdicts import GATE, check_counts, nothing_measured_reason, read_verdict
from perfkit.investigations import registry
from perfkit.report import runinfo as ri
from perfkit.report.belowstage import panel as below_stage_panel
from perfkit.report.plots import alt_text, figure_to_png_bytes
from perfkit.report.rootcause import root_cause
from perfkit.report.tables import Table, format_table, markdown_table, status_class

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
    """Snippets of ``text`` that would make a browser fetch from the network; empty when none."""
    return [text[max(0, m.start() - 40) : m.end() + 60] for m in _EXTERNAL.finditer(text)]


PAGE_TEMPLATE = "page.html.j2"
GATE_TEMPLATE = f"sections/{GATE}.html.j2"
#: a notebook neither registered nor the gate (a run of an older perfkit)
FALLBACK_SECTION_TEMPLATE = "sections/_base.html.j2"


@functools.lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The report's jinja2 environment (``templates/``, autoescaped). Raises ValueError: not installed."""
    import jinja2  # here, not at the top: a notebook kernel renders no HTML

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("perfkit.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )
    env.filters["status_class"] = status_class
    return env


def notebook_body(nb_path: str | Path, drop_heading: str | None = None) -> str:
    """Notebook HTML, code and stderr hidden. Raises OSError, nbformat.ValidationError, ValueError."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    if drop_heading and nb.cells and nb.cells[0].cell_type == "markdown":
        first = (nb.cells[0].source.strip().splitlines() or [""])[0].strip()
        if first == f"# {drop_heading}":
            nb.cells = nb.cells[1:]
    # stderr (progress bars, log lines) is for the terminal; tracebacks stay
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


def section_context(run_dir: Path, n: Mapping[str, Any], reads: Mapping[str, Any]) -> dict[str, Any]:
    """What a section template gets for notebook entry ``n`` (``reads``: :func:`_reads`); never raises."""
    name = str(n["name"])
    status = str(n.get("status") or "")
    title, question, intro = ri.section_head(name)
    keys = reads["keys"].get(name, [])
    verdict = {k: v for k, v in (read_verdict(run_dir / name) or {}).items() if k != "rows"}
    d = run_dir / name
    b = reads["bundles"].get(d)
    if b is None and name != GATE:  # not a registered investigation
        b = ri.load_bundles([d]).get(d)
    rc = root_cause(b, name, reads["results"]) if name != GATE and status != "skipped" else None
    below = below_stage_panel(b, link_prefix=f"{name}/") if name != GATE else None
    nbp = run_dir / (n.get("output") or f"notebooks/{name}.ipynb")  # relative to the run, or absolute
    nbp = nbp if nbp.exists() else run_dir / "notebooks" / f"{name}.ipynb"
    body, body_error = None, None
    if status != "skipped" and nbp.exists():
        try:
            body = notebook_body(nbp, drop_heading=title)
        except Exception as exc:  # noqa: BLE001 - a broken notebook must not kill the report
            log.warning("report: cannot render %s: %r", nbp, exc)
            body_error = repr(exc)
    gate, gate_text = ri.gate_result(run_dir, n)
    return {
        "name": name,
        "title": title,
        "question": question,
        "intro": intro,
        "status": status,
        "status_text": ri.status_text(n),
        "gate": gate,
        "gate_text": gate_text,
        "reason": n.get("reason"),
        "error": n.get("error"),
        "wall_s": n.get("wall_s"),
        "keys": [] if isinstance(keys, str) else keys,
        "keys_error": keys if isinstance(keys, str) else None,
        "verdict": verdict,
        "notebook_path": str(nbp),
        "body": body,
        "body_error": body_error,
        "root_cause": rc,
        "below_stage": below,
    }


def render_section(run_dir: str | Path, n: Mapping[str, Any], reads: Mapping | None = None) -> str:
    """The HTML of one notebook's section. Raises jinja2.TemplateNotFound: a missing template."""
    ctx = section_context(Path(run_dir), n, reads or _reads(Path(run_dir)))
    return template_env().get_template(section_template(ctx["name"])).render(**ctx)


CHROMIUM_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update "
    "--disable-sync --disable-quic --no-first-run --hide-scrollbars --disable-extensions"
).split()


def chromium_binary() -> str | None:
    """Path of a Chromium/Chrome binary (``$PERFKIT_CHROMIUM`` first), or None."""
    names = (os.environ.get("PERFKIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome")
    return next((shutil.which(n) for n in names if n and shutil.which(n)), None)


def screenshot(html_path: str | Path, png_path: str | Path) -> Path:
    """Save a 1280x2400 PNG of the page with headless Chromium (at most 90 s). Raises RuntimeError."""
    exe = chromium_binary()
    if exe is None:
        raise RuntimeError("chromium not found")
    png = Path(png_path).resolve()
    with tempfile.TemporaryDirectory(prefix="perfkit-chromium-") as prof:
        cmd = [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={prof}",
            "--window-size=1280,2400",
            f"--screenshot={png}",
            Path(html_path).resolve().as_uri(),
        ]
        proc = run_bounded(cmd, 90, capture_output=True, text=True)  # its helpers too
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png


def show(fig: Any, dpi: int = 100, alt: str | None = None) -> None:
    """Display a Figure in a notebook as a PNG with alt text (the report embeds it as ``data:``)."""
    from IPython.display import Image, display

    display(Image(data=figure_to_png_bytes(fig, dpi=dpi), format="png", alt=alt or alt_text(fig)))


def reading(investigation: str, results: Mapping[str, Any]) -> str:
    """A few sentences of Markdown saying what the results mean (the investigation's ``reading``)."""
    return registry.get(investigation).reading(results or {})


def summary_frame(investigation: str, results: Mapping[str, Any]) -> pd.DataFrame:
    """The headline numbers of an investigation as a small table (the investigation's ``summary_table``)."""
    return registry.get(investigation).summary_table(results or {})


def _gate_table(verdicts: pd.DataFrame, statuses: tuple[str, ...] | None = None) -> Table:
    v = ri.gate_view(verdicts)[ri.GATE_COLUMNS]
    return format_table(v if statuses is None else v[v["status"].isin(statuses)])


def _gate_counts(verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    """``[{"status", "n", "text": "60 passed"}]``, failures first."""
    if verdicts.empty:
        return []
    words = {"fail": "failed", "pass": "passed", "inconclusive": "inconclusive (noise could flip)"}
    counts = verdicts["status"].astype(str).value_counts()
    order = sorted(counts.index, key=lambda s: ri.GATE_ORDER.get(s, 5))
    return [{"status": s, "n": int(counts[s]), "text": f"{int(counts[s])} {words.get(s, s)}"} for s in order]


def _reads(run_dir: Path) -> dict[str, Any]:
    """The run's results (:func:`~perfkit.report.runinfo.run_results`), key numbers and bundles."""
    results = ri.run_results(run_dir)
    bundles = ri.load_bundles(run_dir / s.name for s in registry.all_investigations())
    return {"results": results, "keys": ri.key_numbers(results), "bundles": bundles}


def _run_view(run_dir: Path) -> dict[str, Any]:
    info, verdicts, code, word = ri.run_status(run_dir)
    reads = _reads(run_dir)
    rows = [(k.label, k.text) for v in reads["keys"].values() if not isinstance(v, str) for k in v]
    env, engine = _engine_facts(reads["bundles"])
    return {
        "info": info,
        "verdicts": verdicts,
        "code": code,
        "word": word,
        "inv": ri.investigations(run_dir, info.get("notebooks", []), reads["results"]),
        "reads": reads,
        "env": env,
        "engine": engine,
        "key_rows": pd.DataFrame(rows, columns=["what", "value"]) if rows else None,
        "units": ri.units_frame(info),
        "ends": ri.engine_ends_frame(run_dir, reads["bundles"]),
        "warnings": ri.run_warnings(run_dir),
    }


def page_context(run_dir: str | Path) -> dict[str, Any]:
    """What ``page.html.j2`` gets for a run directory (tables: Table or None)."""
    run_dir = Path(run_dir)
    v = _run_view(run_dir)
    info, verdicts, nbs = v["info"], v["verdicts"], v["info"].get("notebooks", [])
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
    toc = [{**i, "status_text": i["ran"]} for i in v["inv"]]
    failed = []  # the toc entries that get a red box (docs/suite.md)
    for t in toc:
        if t["gate"] != "fail":
            continue
        if t["name"] == GATE and "notebook" in verdicts:
            own = verdicts[verdicts["notebook"] == GATE]["status"]
            if not (own == "fail").any():
                continue
            t = {**t, "gate_text": f"fail: {check_counts(own)} that no investigation holds"}
        failed.append(t)
    rows = pd.DataFrame(ri.investigations_table(v["inv"], checks=True))
    return {
        "title": f"perfkit report: {info.get('name', run_dir.name)}",
        "verdict": v["word"],
        "exit_code": v["code"],
        "meta": meta,
        "environment": v["env"],
        "toc": toc,
        "failed": failed,
        "errors": [n for n in nbs if n.get("status") == "error"],
        "notebooks_table": format_table(rows, status_col="gate") if nbs else None,
        "units_table": None if v["units"] is None else format_table(v["units"]),
        "engine_ends_table": None if v["ends"] is None else format_table(v["ends"]),
        "key_numbers": None if v["key_rows"] is None else format_table(v["key_rows"], None),
        "warnings": v["warnings"],
        "gates": _gate_table(verdicts),
        "gates_attention": _gate_table(verdicts, ("fail", "improved")),
        "gate_counts": _gate_counts(verdicts),
        "sections": [markupsafe.Markup(render_section(run_dir, n, v["reads"])) for n in nbs],
    }


def render_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``run_dir/report.html`` (or ``out``). Raises RuntimeError (it would load from the network),
    jinja2.TemplateError."""
    run_dir = Path(run_dir)
    page = template_env().get_template(PAGE_TEMPLATE).render(**page_context(run_dir))
    page = _relative_paths(page, run_dir)
    bad = external_refs(page)
    if bad:  # e.g. an HTML output of a notebook pointing at the web: neutralise, keep offline
        log.warning("report: %d network reference(s) neutralised, e.g. %s", len(bad), bad[0])
        page = _ATTR_EXT.sub(lambda m: f"data-offline-{m.group(1)}{m.group(2)}{m.group(3)}", page)
        page = _URL_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", page)
        page = _IMPORT_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", page)
        if left := external_refs(page):
            raise RuntimeError(f"report would load from the network: {left[:3]}")
    dst = Path(out) if out else run_dir / "report.html"
    dst.write_text(page, encoding="utf-8")
    log.info("report: %s", dst)
    return dst


def write_tool_outputs(
    out: str | Path, md: str, template: str, context: Mapping[str, Any], what: str, **page: Any
) -> dict[str, Path]:
    """``summary.md`` (``md``, also appended to ``$GITHUB_STEP_SUMMARY``) and a one-section
    ``report.html`` under ``out``: name -> path. Raises RuntimeError: the page would load from the network."""
    section = template_env().get_template(template).render(**context)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(md, encoding="utf-8")
    if gh := os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(gh, "a", encoding="utf-8") as fh:
            fh.write(md + "\n")
    html = template_env().get_template(PAGE_TEMPLATE).render(sections=[markupsafe.Markup(section)], **page)
    if bad := external_refs(html):
        raise RuntimeError(f"{what} report would load from the network: {bad[:3]}")
    (out / "report.html").write_text(html, encoding="utf-8")
    return {"summary": out / "summary.md", "report": out / "report.html"}


_WRAP_AT = 60


def _wrap_cell(text: Any) -> str:
    t = str(text if text is not None else "").strip()
    wrapped = textwrap.wrap(t, _WRAP_AT, break_long_words=True, break_on_hyphens=False)
    return t if len(t) <= _WRAP_AT else "\n".join(wrapped)


def _rows_table(df: pd.DataFrame, cols: list[str], n: int | None = None) -> tuple[str, int]:
    """(Markdown table of the first ``n`` rows of ``df[cols]``, reasons wrapped; rows left out)."""
    v = df[[c for c in cols if c in df.columns]]
    left, v = 0 if n is None else max(0, len(v) - n), v.iloc[:n]
    if "reason" in v.columns:
        v = v.assign(reason=v["reason"].map(_wrap_cell))
    return markdown_table(v), left


def _engine_versions_text(meta: Mapping[str, Any]) -> str:
    ev = next(iter((meta.get("engine_versions") or {}).values()), None)
    if not ev or "error" in ev:
        why = f" ({ev['error']})" if ev else ""
        return (
            f"engine versions not recorded{why}; perfkit's torch {meta.get('torch_version')}, "
            f"diffusers {meta.get('diffusers_version')}"
        )
    return "engine: " + ", ".join(f"{p} {ev[p]}" for p in ("sglang", "torch", "diffusers") if ev.get(p))


def _engine_facts(bundles: Mapping[Path, ResultBundle | Exception]) -> tuple[str, list[str]]:
    """(the page's hardware and versions line, summary.md's Engine lines) from the run's bundles."""
    env = ""
    for b in bundles.values():
        if isinstance(b, Exception):
            continue
        m, ln = b.meta, b.launches
        if not env:
            bits = [m.get("gpu_name") or f"CPU x{m.get('cpu_count')}", _engine_versions_text(m)]
            bits.append(f"perfkit {m.get('perfkit_version')} (torch {m.get('torch_version')})")
            if m.get("git_commit"):
                c = str(m["git_commit"])
                bits.append(f"commit {c[:10]}" + ("+dirty" if c.endswith("+dirty") else ""))
            if m.get("source_digest"):
                bits.append(f"source {m['source_digest']}")
            env = ", ".join(str(x) for x in bits)
        if not ln.empty:
            row = ln.iloc[0]
            return env, [
                f"- {md_text(_engine_versions_text(m))}",
                f"- effective config from: {md_text(row.get('config_source'))}",
                f"- cold start parts from: {md_text(row.get('cold_start_sources'))}",
            ]
    return env, []


def _middle_blocks(v: Mapping[str, Any]) -> list[str]:
    info, keys, units, ends = v["info"], v["key_rows"], v["units"], v["ends"]
    nbs = info.get("notebooks", [])
    inv = [{**r, "note": _wrap_cell(clip(r["note"]))} for r in ri.investigations_table(v["inv"])]
    errors = [n for n in nbs if n.get("status") == "error"]
    keys_note = (
        "Informational: what was measured. The gate rows decide the verdict; a key number is not a check."
    )
    blocks = [
        ("Errors", [f"- **{md_text(n['name'])}**: {md_text(clip(n.get('error'), 400))}" for n in errors]),
        ("Investigations", [markdown_table(pd.DataFrame(inv))] if inv else []),
        ("Key numbers", [keys_note, "", markdown_table(keys)] if keys is not None else []),
        ("Engine", v["engine"]),
        ("Units of work", [markdown_table(units)] if units is not None else []),
        ("Merge notes", [f"- {md_text(n)}" for n in (info.get("scaleout") or {}).get("notes") or []]),
        ("How the engines ended", [markdown_table(ends)] if ends is not None else []),
        ("Warnings", [f"- {md_text(w)}" for w in v["warnings"]]),
    ]
    return [line for title, lines in blocks if lines for line in ("", f"### {title}", "", *lines)]


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


def summary_markdown(run_dir: str | Path, limit: int = SUMMARY_LIMIT) -> str:
    """The run's verdict as Markdown within ``limit`` characters (docs/suite.md)."""
    run_dir = Path(run_dir)
    v = _run_view(run_dir)
    info, verdicts, code, word = v["info"], v["verdicts"], v["code"], v["word"]
    icon = {"pass": "✅", "inconclusive": "⚠️", "regression": "❌", "error": "💥"}.get(word, "")
    view = ri.gate_view(verdicts)
    n_fail, n_inc = ((view["status"] == s).sum() for s in ("fail", "inconclusive"))
    head = [
        f"## perfkit: {md_text(info.get('name', run_dir.name))} — {icon} {word.upper()} (exit {code})",
        "",
        f"{check_counts(view['status'])}"
        + (" (inconclusive: over the limit within the run's noise)." if n_inc else "."),
    ]
    if why := nothing_measured_reason(verdicts):
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

    middle = _middle_blocks(v)
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
            parts.append(f"\n{_plural(sk, 'row')} skipped (not measured here).")
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


def _relative_paths(text: str, run_dir: str | Path) -> str:
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
    text = _relative_paths(summary_markdown(run_dir), run_dir)
    (Path(run_dir) / "summary.md").write_text(text, encoding="utf-8")
    return text

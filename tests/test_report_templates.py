"""The HTML report renders from jinja2 templates: no HTML markup in the report's Python files,
one table formatter for the page and the Markdown summary, one section template per
registered investigation (named by the registry) plus the gate's, and a real replayed H200 run that
renders with its key numbers, its verdict and no network reference."""

from __future__ import annotations

import ast
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import markupsafe
import numpy as np
import pandas as pd
import pytest

import perfkit.report
from perfkit.gate.verdicts import GATE
from perfkit.investigations import registry
from perfkit.report import render, runinfo, tables
from perfkit.report.render import external_refs

ROOT = Path(__file__).resolve().parents[1]
REPORT_PKG = Path(perfkit.report.__file__).parent
PERFKIT = Path(sys.executable).parent / "perfkit"

# markup we would write: an opening tag (or a closing one) of the elements a report page uses
_TAG = re.compile(
    r"</?(?:h[1-6]|p|div|table|thead|tbody|tr|td|th|span|li|ul|ol|nav|section|"
    r"style|html|body|head|code|pre|b|i|main|title|meta)(?=[\s>/])|<a\s|<!doctype",
    re.I,
)


# --------------------------------------------------------------------------- no markup in .py


def _markup_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    patterns = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
        ):
            patterns |= {id(s) for s in ast.walk(node.args[0]) if isinstance(s, ast.Constant)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in patterns:
            # docstrings name elements in backquotes (``<section id=NAME>``): prose, not output
            text = re.sub(r"``[^`]*``", "", node.value)
            if _TAG.search(text):
                bad.append(f"{path.name}:{node.lineno}: {node.value[:80]!r}")
    return bad


def test_the_markup_check_catches_markup(tmp_path: Path):
    """The check is real: f-strings and plain strings holding tags are flagged, regex patterns
    and prose are not."""
    p = tmp_path / "sample.py"
    p.write_text(
        "import re\n"
        "x = 1\n"
        'a = f"<h2>{x}</h2>"\n'
        "b = \"<td class='st'>\"\n"
        "c = \"<a href='#x'>x</a>\"\n"
        'd = re.compile(r"<script[^>]*>")\n'
        'e = "a < b and p > q"\n'
        'f = "returns ``<section id=NAME>``"\n'
    )
    bad = _markup_literals(p)
    assert {int(b.split(":")[1]) for b in bad} == {3, 4, 5}, bad


def test_no_html_markup_in_report_python_files():
    files = sorted(REPORT_PKG.glob("*.py"))
    assert {f.name for f in files} >= {"render.py", "tables.py", "__init__.py"}
    bad = [b for f in files for b in _markup_literals(f)]
    assert bad == [], "HTML markup written in Python (move it to a template):\n" + "\n".join(bad)


# --------------------------------------------------------------------------- templates


def test_every_registered_investigation_has_its_section_template():
    env = render.template_env()
    names = registry.names()
    assert names, "no investigation registered"
    for s in registry.all_investigations():
        # no template of its own: the generic one reads its declarations (issue 32)
        assert s.template == registry.GENERIC_TEMPLATE == "sections/investigation.html.j2"
        tpl = env.get_template(s.template)  # raises TemplateNotFound
        assert render.section_template(s.name) == s.template
        assert s.section_intro, s.name
        ctx = {"name": s.name, "title": s.title, "question": s.question, "intro": s.section_intro}
        html = tpl.render(**ctx, status="skipped", status_text="skipped", gate="not run", wall_s=None)
        assert f'<p class="muted">{markupsafe.escape(s.section_intro)}</p>' in html, s.name
    env.get_template(render.GATE_TEMPLATE)
    assert render.section_template(GATE) == f"sections/{GATE}.html.j2"
    env.get_template(render.PAGE_TEMPLATE)
    assert render.section_template("no_such_investigation") == render.FALLBACK_SECTION_TEMPLATE


def test_environment_autoescapes_html_templates():
    env = render.template_env()
    assert isinstance(env.loader, jinja2.PackageLoader)
    out = env.get_template("sections/_base.html.j2").render(
        name="x",
        title="<script>alert(1)</script>",
        question="",
        status="ok",
        status_text="ok",
        keys=[],
        body=None,
        wall_s=None,
        verdict={},
    )
    assert "<script>" not in out and "&lt;script&gt;" in out


def test_templates_are_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"report/templates/*"' in text and '"report/templates/**/*"' in text
    tpl = REPORT_PKG / "templates"
    for name in (
        "page.html.j2",
        "report.css",
        "sections/_base.html.j2",
        f"sections/{GATE}.html.j2",
        *(s.template for s in registry.all_investigations()),
    ):
        assert (tpl / name).is_file(), name


# --------------------------------------------------------------------------- table formatter


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "–"),
        (float("nan"), "–"),
        (np.nan, "–"),
        (pd.NA, "–"),
        (pd.NaT, "–"),
        ("None", "–"),
        ("nan", "–"),
        ("none", "none"),  # a word (offload mode, enforcement), not a missing value
        (True, "yes"),
        (False, "no"),
        (np.bool_(True), "yes"),
        (3, "3"),
        (np.int64(14512), "14,512"),
        (0, "0"),
        (14512.0, "14,512"),
        (58427.881, "58,428"),
        (973.14, "973"),
        (-1234.6, "-1,235"),
        (100.0, "100"),
        (91.94, "91.9"),
        (72.95, "73.0"),
        (16.0, "16"),
        (-12.34, "-12.3"),
        (2.3137, "2.31"),
        (1.5, "1.5"),
        (0.25, "0.25"),
        (0.0163331, "0.016"),
        (0.885395, "0.885"),
        (1.0, "1"),
        (-3.9126e-13, "0"),
        (1.633308e-02, "0.016"),
        (float("inf"), "∞"),
        ([1, 2.5], "1, 2.5"),
        ({"a": None, "b": True}, "a=–, b=yes"),
        ("pass", "pass"),
        ("two\nlines", "two lines"),
    ],
)
def test_cell_text(value, text):
    assert tables.cell_text(value) == text


def test_format_table_drops_the_index_and_marks_status():
    df = pd.DataFrame(
        {
            "case": ["a", "b"],
            "actual": [954.2, None],
            "status": ["pass", "fail"],
            "held": [True, False],
            "n": pd.array([1, None], dtype="Int64"),
        },
        index=["i0", "i1"],
    )
    t = tables.format_table(df)
    header, rows = t
    assert header == ["case", "actual", "status", "held", "n"]
    assert rows == [["a", "954", "pass", "yes", "1"], ["b", "–", "fail", "no", "–"]]
    assert tables.format_table(df.rename(columns={"actual": "actual_ms"})).header[1] == "actual (ms)"
    assert t.status_col == 2
    assert tables.format_table(df, None).status_col is None
    assert tables.format_table(pd.DataFrame(columns=["x"])).empty
    with pytest.raises(TypeError):
        tables.format_table([1, 2])  # type: ignore[arg-type]


def test_markdown_uses_the_same_cells():
    df = pd.DataFrame({"metric": ["a|b"], "actual": [0.0163331], "bound": [None]})
    md = tables.markdown_table(df)
    assert md.splitlines() == ["| metric | actual | bound |", "|---|---|---|", "| a&#124;b | 0.016 | – |"]


def test_status_class():
    assert tables.status_class("pass") == "pass"
    assert tables.status_class("skipped (no bundle in replay dir)") == "skipped"
    assert tables.status_class("") == "none"


# --------------------------------------------------------------------------- a real replayed run


class _Cells(HTMLParser):
    """Text of every table cell the page itself writes (outside notebook bodies), and the
    section ids."""

    def __init__(self) -> None:
        super().__init__()
        self.depth_nb = 0  # >0 inside <div class="nb">
        self.div_stack: list[bool] = []
        self.cells: list[str] = []
        self.status_cells: list[tuple[str, str]] = []
        self.sections: list[str] = []
        self._cell: list[str] | None = None
        self._cls = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            is_nb = "nb" in (a.get("class") or "").split()
            self.div_stack.append(is_nb)
            self.depth_nb += is_nb
        elif tag == "section":
            self.sections.append(a.get("id") or "")
        elif tag in ("td", "th") and not self.depth_nb:
            self._cell, self._cls = [], a.get("class") or ""

    def handle_endtag(self, tag):
        if tag == "div" and self.div_stack:
            self.depth_nb -= self.div_stack.pop()
        elif tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            self.cells.append(text)
            if "st" in self._cls.split():
                self.status_cells.append((self._cls, text))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _rounded(cell: str) -> bool:
    """False for a number shown with more digits than the formatter allows (more than three
    decimals, a decimal above 100, two above 10) or in exponent notation."""
    if re.search(r"\d[eE][-+]?\d", cell):
        return False
    m = re.fullmatch(r"-?([\d,]+)\.(\d+)", cell)
    if not m:
        return True
    a = abs(float(cell.replace(",", "")))
    if a >= 100:
        return False
    if a >= 10:
        return len(m.group(2)) == 1
    return len(m.group(2)) <= 3


@pytest.fixture(scope="module")
def h200_run(h200_replay_run: Path) -> Path:
    """``perfkit suite`` replaying the recorded H200 bundles (conftest: one run per session)."""
    return h200_replay_run


@pytest.fixture(scope="module")
def h200_html(h200_run: Path) -> str:
    return (h200_run / "report.html").read_text(encoding="utf-8")


def test_page_has_every_enabled_section(h200_run: Path, h200_html: str):
    from perfkit.params import load_params

    enabled = load_params(ROOT / "params" / "h200.yaml").enabled()
    assert enabled, "params/h200.yaml enables no investigation"
    p = _Cells()
    p.feed(h200_html)
    for name in (*enabled, GATE):
        assert f'<section id="{name}"' in h200_html, name
        assert name in p.sections
        title = runinfo.section_head(name)[0]
        assert f"<h2>{title}</h2>" in h200_html, title
    # every registered investigation appears once (a disabled one as a skipped section), in run order
    assert p.sections == [*registry.names(), GATE]


def test_page_key_numbers_and_verdict(h200_html: str):
    assert re.search(r'id="verdict">Verdict: <span class="badge badge-pass">PASS</span>', h200_html), (
        h200_html[:3000]
    )
    p = _Cells()
    p.feed(h200_html)
    assert "954 ms" in p.cells  # warm median
    assert "73.0 s" in p.cells  # cold start, ready
    i = p.cells.index("warm median")
    assert p.cells[i + 1] == "954 ms"
    i = p.cells.index("cold start, ready")
    assert p.cells[i + 1] == "73.0 s"
    # the cold_warm section quotes its own key numbers
    sec = h200_html[h200_html.index('<section id="cold_warm"') :]
    sec = sec[: sec.index("</section>")]
    assert "<td>warm median</td><td>954 ms</td>" in sec


def test_page_tables_are_formatted(h200_html: str):
    p = _Cells()
    p.feed(h200_html)
    assert len(p.cells) > 100
    junk = {"nan", "NaN", "None", "<NA>", "NaT", "null"}  # "none" is a word (cap enforcement)
    assert [c for c in p.cells if c in junk] == []
    # numbers are rounded: >= 100 no decimals, >= 10 one, below that at most 3 decimals
    assert [c for c in p.cells if not _rounded(c)] == []
    # status words keep their word, coloured by class
    assert p.status_cells and all(cls == f"st st-{tables.status_class(t)}" for cls, t in p.status_cells)
    # each investigation's gate result (pass / not run), apart from whether its notebook ran
    assert {t for _, t in p.status_cells} >= {"pass", "not run"}
    assert "ok" not in {t for _, t in p.status_cells}
    assert "<th></th>" not in h200_html.split('<div class="nb">')[0]  # no index column


def test_page_is_self_contained(h200_html: str):
    assert external_refs(h200_html) == []
    assert "<script" not in h200_html.lower()
    assert "<link" not in h200_html.lower()
    assert h200_html.count("data:image/png;base64,") >= 8
    css = (REPORT_PKG / "templates" / "report.css").read_text()
    assert css.strip()[:40] in h200_html  # the stylesheet is inline


def test_summary_markdown_uses_the_formatter(h200_run: Path):
    text = (h200_run / "summary.md").read_text(encoding="utf-8")
    assert "PASS" in text
    assert "| warm median | 954 ms |" in text
    assert "| cold start, ready | 73.0 s |" in text
    assert "| nan |" not in text.lower() and "| None |" not in text


def test_h200_summary_is_short_failures_first_passing_rows_collapsed(h200_run: Path):
    """The replayed H200 run's summary.md (issue 40): at most 10 KB, the investigations' gate
    results before the key numbers (labelled informational), the 92 passing rows inside a
    collapsed <details>, no path of this machine, and the overhead investigation (skipped)
    saying that cold vs warm measured it rather than a bare "skipped"."""
    text = (h200_run / "summary.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 10 * 1024, len(text.encode())
    assert text.index("### Investigations") < text.index("### Key numbers") < text.index("<details>")
    assert "| Cold vs warm | pass: 4 checks: 4 passed | ran |" in text
    assert "Informational" in text.split("### Key numbers", 1)[1].split("|", 1)[0]
    assert (
        "<details><summary>92 passing gate rows</summary>" in text and text.rstrip().count("</details>") == 1
    )
    assert "not run on its own; measured inside Cold vs warm" in text
    assert str(h200_run) not in text and str(ROOT) not in text
    html = (h200_run / "report.html").read_text(encoding="utf-8")
    assert str(h200_run) not in html and str(ROOT) not in html
    assert "/tmp/work/" not in html  # the measuring host's engine commands are cut to their last parts


def test_summary_fits_a_limit_by_whole_rows(h200_run: Path):
    """Under a small limit the passing rows are left out from the end, whole rows only, with a
    pointer to the page; every table row keeps every column."""
    full = render.summary_markdown(h200_run)
    text = render.summary_markdown(h200_run, limit=4000)
    assert len(text) <= 4000 < len(full)
    m = re.search(r"(\d+) more passing rows? not shown here: see the report page", text)
    assert m, text[-600:]
    shown = text.split("<details>", 1)[1].split("</details>", 1)[0]
    rows = [ln for ln in shown.splitlines() if ln.startswith("| ")][1:]  # minus the header
    assert len(rows) + int(m.group(1)) == 92
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        assert len({len(re.findall(r"(?<!\\)\|", ln)) for ln in lines}) <= 1, block  # no row cut


def test_report_renders_again_into_another_file(h200_run: Path, tmp_path: Path):
    dst = render.render_report(h200_run, tmp_path / "again.html")
    html = dst.read_text(encoding="utf-8")
    assert "954 ms" in html and external_refs(html) == []


def test_network_reference_in_a_notebook_is_neutralised(h200_run: Path, tmp_path: Path, monkeypatch):
    """A notebook output pointing at the web does not make the page fetch it."""
    real = render.notebook_body

    def body(path, drop_heading=None):
        return real(path, drop_heading) + "<img src='https://example.invalid/x.png' alt='x'>"

    monkeypatch.setattr(render, "notebook_body", body)  # section_context calls it there
    html = render.render_report(h200_run, tmp_path / "r.html").read_text(encoding="utf-8")
    assert external_refs(html) == []
    assert "data-offline-src='https://example.invalid/x.png'" in html


# --------------------------------------------------------------------------- the formatter's rules


@pytest.mark.parametrize(
    "name, label",
    [
        ("peak_reserved_mib", "peak reserved (MiB)"),
        ("e2e_ms", "e2e (ms)"),
        ("ms", "time (ms)"),
        ("ready_s", "ready (s)"),
        ("device_cap_gib", "device cap (GiB)"),
        ("runtime_peak_vram_mb", "runtime peak vram (MiB)"),
        ("host_anon_slope_mib_per_request", "host anon slope (MiB/request)"),
        ("warmup_frames", "warmup frames"),
        ("wall (s)", "wall (s)"),
        ("warm median", "warm median"),
        ("status", "status"),
    ],
)
def test_column_label_puts_the_unit_in_the_header(name, label):
    assert tables.column_label(name) == label


def test_wide_table_with_few_rows_is_transposed():
    df = pd.DataFrame({"mode": ["none", "model"], **{f"c{i}_ms": [1234.5, None] for i in range(9)}})
    assert not tables.format_table(df).transposed  # the default keeps the API's shape
    t = tables.format_table(df, transpose="auto")
    assert t.transposed and t.header == ["mode", "none", "model"]
    assert t.rows[0] == ["c0 (ms)", "1,234", "–"] and len(t.rows) == 9
    narrow = tables.format_table(df.iloc[:, :4], transpose="auto")
    assert not narrow.transposed and narrow.header[0] == "mode"


def _html_cells(html: str) -> tuple[list[str], list[str]]:
    class P(HTMLParser):
        def __init__(self):
            super().__init__()
            self.th, self.td, self.cur = [], [], None

        def handle_starttag(self, tag, attrs):
            if tag in ("th", "td"):
                self.cur = (tag, [])

        def handle_endtag(self, tag):
            if tag in ("th", "td") and self.cur:
                (self.th if self.cur[0] == "th" else self.td).append("".join(self.cur[1]).strip())
                self.cur = None

        def handle_data(self, data):
            if self.cur:
                self.cur[1].append(data)

    p = P()
    p.feed(html)
    return p.th, p.td


def test_styled_renders_the_formatter_cells_without_an_index():
    df = pd.DataFrame(
        {
            "case": ["cold_warm", "cold_warm"],
            "actual": [1.633308e-02, -3.912629e-13],
            "bound": [1.0, np.nan],
            "status": ["pass", "skipped"],
            "peak_reserved_mib": [16196.0, None],
        },
        index=[7, 9],
    )
    html = tables.styled(df).to_html()
    th, td = _html_cells(html)
    assert th == ["case", "actual", "bound", "status", "peak reserved (MiB)"]  # no index header
    assert td == ["cold_warm", "0.016", "1", "pass", "16,196", "cold_warm", "0", "–", "skipped", "–"]
    assert not re.search(r"\b(NaN|None|nan)\b", html) and not re.search(r"\de-\d", html)
    # a labelled index (a transposed frame) is kept as the first column
    t = pd.DataFrame({"DenoisingStage": [57445.2885]}, index=["warmup 17f → request 25f"])
    th, td = _html_cells(tables.styled(t).to_html())
    assert td == ["warmup 17f → request 25f", "57,445"]


def test_use_in_notebook_registers_the_dataframe_formatter():
    from IPython.core.interactiveshell import InteractiveShell

    assert tables.use_in_notebook() is False  # not in IPython: nothing done
    shell = InteractiveShell.instance()
    try:
        assert tables.use_in_notebook() is True
        data, _ = shell.display_formatter.format(pd.DataFrame({"x_ms": [1.633308e-02, None]}))
        th, td = _html_cells(data["text/html"])
        assert th == ["x (ms)"] and td == ["0.016", "–"]
    finally:
        InteractiveShell.clear_instance()


def test_key_number_text_separates_thousands():
    assert registry.KeyNumber("cold request", 58427.881, "ms").text == "58,428 ms"
    assert registry.KeyNumber("ratio", 0.0163331, "", "g").text == "0.016"
    assert registry.KeyNumber("x", None, "ms").text == "–"


# --------------------------------------------------------------------------- root-cause panel


def test_root_cause_parts_on_small_tables():
    from perfkit.report import rootcause

    launches = pd.DataFrame(
        {
            "launch": ["cap0", "cap1"],
            "device_cap_gib": [np.nan, 12.0],
            "host_cap_gib": [np.nan, 32.0],
            "host_cap_asked_gib": [np.nan, 64.0],
            "host_cap_effective_gib": [np.nan, 31.2],
            "host_cap_clamp": [None, "cgroup memory.max 31.2 GiB"],
            "compile_active": [True, False],
            "compile_disabled_reason": [None, "offload"],
            "cold_start_sources": [
                None,
                "models_loaded: engine log: [server-load] workers_ready_monotonic_ns",
            ],
        }
    )
    cfg = rootcause.engine_config(launches)
    assert cfg.header == ["setting", "cap0 (unlimited)", "cap1 (12 GiB GPU + 32 GiB host)"]
    rows = {r[0]: r[1:] for r in cfg.rows}
    assert rows["torch.compile active"] == ["yes", "no"]
    assert rows["compile disabled because"] == ["not reported", "offload"]
    assert (
        rows["cold start parts from"][1]
        == "models_loaded: engine log: [server-load] workers_ready_monotonic_ns"
    )
    assert "dtype" not in rows and "dtype" in rootcause.not_reported(launches)
    active = launches.drop(columns="compile_disabled_reason").assign(compile_active=True)
    assert "compile disabled because" not in rootcause.not_reported(active)
    assert "compile disabled because" in rootcause.not_reported(active.assign(compile_active=[True, False]))
    assert rootcause.budget_clamps(launches) == [
        "cap1: host cap asked 64 GiB, in force 31.2 GiB (cgroup memory.max 31.2 GiB)"
    ]
    logs = {
        "cap1.stderr.log": "2026-11-29 16:03:08,693 WARNING x: compile disabled under offload (layer 3)\n"
        "2026-11-29 16:03:09,001 WARNING x: compile disabled under offload (layer 4)\n"
        "INFO fine\nRuntimeError: CUDA out of memory\n",
        "cap0.stderr.log": "W1129 15:55:29.799000 451 torch/x.py:1] slow path taken\n",
    }
    t = rootcause.log_findings(logs)
    assert t.header == ["count", "logged by", "message"]
    assert t.rows[0][:2] == ["2", "cap1"] and "compile disabled under offload" in t.rows[0][2]
    assert {r[2] for r in t.rows[1:]} >= {"RuntimeError: CUDA out of memory"}
    assert len(t.rows) == 3
    assert rootcause.log_findings({"a.log": "all good\n"}) is None


def test_root_cause_panel_on_the_h200_replay(h200_html: str):
    sec = h200_html[h200_html.index('<section id="cold_warm"') :]
    sec = sec[: sec.index("</section>")]
    panel = sec[sec.index('class="rootcause"') :]
    # the recompilation reason, its cost and the stage that paid, from the requests table
    assert "size mismatch at index 1. expected 1152, actual 1536" in panel
    assert "<td>56.9</td>" in panel and "<td>DenoisingStage</td>" in panel
    # the instrumentation overhead measured with the run (results.json only before)
    assert "<td>sampler</td>" in panel and "<td>stage timing</td>" in panel
    # settings the engine of 2026-11 did not report are named, not invented
    assert "Not recorded for any launch (the engine did not report it" in panel
    mb = h200_html[h200_html.index('<section id="memory_budget"') :]
    assert "cap1 (12 GiB GPU + 32 GiB host)" in mb[: mb.index("</section>")]


def test_numbers_quoted_twice_agree(h200_html: str):
    """A figure on the page reads the same wherever it is quoted (key numbers, reading, tables)."""
    sec = h200_html[h200_html.index('<section id="cold_warm"') :]
    sec = sec[: sec.index("</section>")]
    assert "<td>cold request</td><td>58,428 ms</td>" in h200_html
    assert "took 58,428 ms" in sec  # the reading quotes the key number
    assert "<td>warm/cold ratio</td><td>0.016</td>" in sec
    assert "warm/cold ratio 0.016" in sec
    assert not re.search(r"(?<![\d.,])1 (compiles|requests|gates|rows|cases)\b", h200_html)  # plurals
    assert "two-stage pipeline" not in h200_html  # a sentence for a stage this run has not


def test_styled_tables_escape_cell_text():
    """Check reasons hold '<=' and engine messages may hold markup: shown as text, never as HTML."""
    import pandas as pd

    from perfkit.report.tables import styled

    html = styled(pd.DataFrame({"reason": ["1.0 <= 2 <b>engine</b>"], "status": ["pass"]})).to_html()
    assert "1.0 &lt;= 2 &lt;b&gt;engine&lt;/b&gt;" in html and "<b>engine" not in html


def test_recompilations_say_what_a_compile_is_made_of(tmp_path):
    """torch's compile timers in the requests table (``compile_phases``) read as the phases of
    :data:`~perfkit.report.rootcause.COMPILE_PHASES` in the recompilations table; a bundle whose
    engine did not report them (the H200 bundle of 2026-12-02) gets no such column."""
    import json
    import shutil

    import pandas as pd

    from perfkit.bundle import ResultBundle
    from perfkit.report import rootcause

    src = Path(__file__).resolve().parents[1] / "examples/h200/evidence/consumer-12g/nocap/cold_warm"
    t = rootcause.recompilations(ResultBundle.load(src))
    assert "made of" not in t.header and len(t.rows) == 2  # warmup and first 25-frame request
    d = tmp_path / "b"
    shutil.copytree(src, d)
    req = pd.read_parquet(d / "requests.parquet")
    phases = {
        "bytecode_tracing": 1500.0,
        "OutputGraph.call_user_compiler": 80000.0,
        "async_compile.wait": 61000.0,
    }
    req["compile_phases"] = [json.dumps(phases) if c > 0 else None for c in req["compiles"]]
    req.loc[req["index"] == -1, "compile_phases"] = None  # one compiling request without timers
    req.to_parquet(d / "requests.parquet")
    t = rootcause.recompilations(ResultBundle.load(d))
    col = t.header.index("made of")
    assert [r[col] for r in t.rows] == [
        "not reported",
        "dynamo tracing 1.50 s · AOT + inductor 80.00 s · kernel compile wait 61.00 s",
    ]
    assert rootcause.compile_phase_text("{not json").startswith("unreadable: ")
    assert rootcause.compile_phase_text("{}") == "none of the known phases"
    # found on review: a JSON string or a text value is unreadable, not a substring match or a crash
    assert rootcause.compile_phase_text('"bytecode_tracing"').startswith("unreadable: ")
    assert rootcause.compile_phase_text('{"bytecode_tracing": "fast"}').startswith("unreadable: ")
    # found probing: a phase time that is not a number perfkit reads is not shown as a time
    # (it read "1500" as 1.50 s, true as 0.00 s, and showed -1.50 s, nan s, inf s)
    for bad in ('"1500"', "true", "-1500", "NaN", "Infinity", "null"):
        text = rootcause.compile_phase_text(f'{{"bytecode_tracing": {bad}}}')
        assert text.startswith("unreadable: "), (bad, text)
    assert rootcause.compile_phase_text('{"bytecode_tracing": 1500}') == "dynamo tracing 1.50 s"

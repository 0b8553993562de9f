"""The HTML report renders from jinja2 templates: no HTML markup in the report's Python files,
one table formatter for the page and the Markdown summary, one section template per
registered scenario (named by the registry) plus the gate's, and a real replayed H200 run that
renders with its key numbers, its verdict and no network reference."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import pytest

import perfkit.report
from perfkit.gate.verdicts import GATE
from perfkit.report import render, tables
from perfkit.report.render import external_refs
from perfkit.scenarios import registry

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


def test_every_registered_scenario_has_its_section_template():
    env = render.template_env()
    names = registry.names()
    assert names, "no scenario registered"
    for s in registry.all_scenarios():
        assert s.template == f"sections/{s.name}.html.j2"
        env.get_template(s.template)  # raises TemplateNotFound
        assert render.section_template(s.name) == s.template
    env.get_template(render.GATE_TEMPLATE)
    assert render.section_template(GATE) == f"sections/{GATE}.html.j2"
    env.get_template(render.PAGE_TEMPLATE)
    assert render.section_template("no_such_scenario") == render.FALLBACK_SECTION_TEMPLATE


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
        *(s.template for s in registry.all_scenarios()),
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
        (True, "yes"),
        (False, "no"),
        (np.bool_(True), "yes"),
        (3, "3"),
        (np.int64(14512), "14512"),
        (0, "0"),
        (14512.0, "14,512"),
        (973.14, "973"),
        (-1234.6, "-1,235"),
        (100.0, "100"),
        (91.94, "91.9"),
        (16.0, "16"),
        (-12.34, "-12.3"),
        (2.3137, "2.31"),
        (0.0163331, "0.016"),
        (1.0, "1"),
        (-3.9126e-13, "0"),
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
    assert t.status_col == 2
    assert tables.format_table(df, None).status_col is None
    assert tables.format_table(pd.DataFrame(columns=["x"])).empty
    with pytest.raises(TypeError):
        tables.format_table([1, 2])  # type: ignore[arg-type]


def test_markdown_uses_the_same_cells():
    df = pd.DataFrame({"metric": ["a|b"], "actual": [0.0163331], "bound": [None]})
    md = tables.markdown_table(df)
    assert md.splitlines() == ["| metric | actual | bound |", "|---|---|---|", "| a\\|b | 0.0163 | – |"]


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
    """False for a plain decimal number shown with more digits than the formatter allows."""
    m = re.fullmatch(r"-?(\d+)\.(\d+)", cell)
    if not m:
        return True
    a = abs(float(cell))
    if a >= 100:
        return False
    if a >= 10:
        return len(m.group(2)) == 1
    return len((m.group(1) + m.group(2)).lstrip("0")) <= 3


@pytest.fixture(scope="module")
def h200_run(tmp_path_factory) -> Path:
    """``perfkit suite`` replaying the recorded H200 bundles (papermill, notebooks, report)."""
    out = tmp_path_factory.mktemp("h200") / "run"
    proc = subprocess.run(
        [
            str(PERFKIT),
            "suite",
            "--params",
            "params/h200.yaml",
            "--replay",
            "examples/h200/bundles",
            "--out",
            str(out),
            "--no-screenshot",
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def h200_html(h200_run: Path) -> str:
    return (h200_run / "report.html").read_text(encoding="utf-8")


def test_page_has_every_enabled_section(h200_run: Path, h200_html: str):
    from perfkit.params import load_params

    enabled = load_params(ROOT / "params" / "h200.yaml").enabled()
    assert enabled, "params/h200.yaml enables no scenario"
    p = _Cells()
    p.feed(h200_html)
    for name in (*enabled, GATE):
        assert f'<section id="{name}"' in h200_html, name
        assert name in p.sections
        title = render.section_title(name)
        assert f"<h2>{title}</h2>" in h200_html, title
    # every registered scenario appears once (a disabled one as a skipped section), in run order
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
    junk = {"nan", "none", "<na>", "nat", "null"}
    assert [c for c in p.cells if c.lower() in junk] == []
    # numbers are rounded: >= 100 no decimals, >= 10 one, below that 3 significant figures
    assert [c for c in p.cells if not _rounded(c)] == []
    # status words keep their word, coloured by class
    assert p.status_cells and all(cls == f"st st-{t}" for cls, t in p.status_cells)
    assert {t for _, t in p.status_cells} >= {"pass", "ok", "skipped"}
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


def test_report_renders_again_into_another_file(h200_run: Path, tmp_path: Path):
    dst = render.render_report(h200_run, tmp_path / "again.html")
    html = dst.read_text(encoding="utf-8")
    assert "954 ms" in html and external_refs(html) == []


def test_network_reference_in_a_notebook_is_neutralised(h200_run: Path, tmp_path: Path, monkeypatch):
    """A notebook output pointing at the web does not make the page fetch it."""
    real = render.notebook_body

    def body(path, drop_heading=None):
        return real(path, drop_heading) + "<img src='https://example.invalid/x.png' alt='x'>"

    monkeypatch.setattr(render, "notebook_body", body)
    html = render.render_report(h200_run, tmp_path / "r.html").read_text(encoding="utf-8")
    assert external_refs(html) == []
    assert "data-offline-src='https://example.invalid/x.png'" in html

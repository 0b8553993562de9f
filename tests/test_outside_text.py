"""Text from outside never becomes live markup (issue 54, item 3).

Hostile strings (backticks, ``<svg onload>``, ``&``, quotes, ``|``, line breaks, links, very long)
go through every function that writes outside text into Markdown; each output is rendered by
the renderer that shows it (nbconvert's, the report page's notebook Markdown; its table plugin
stands in for GitHub's for summary.md) and checked: every tag is one the surface writes itself,
no ``on*`` attribute, no ``javascript:`` link, no image; each table keeps its rows and each row
its cells. The end-to-end case: a real profiler trace whose op name holds a backtick and
``<svg onload=...>``, through the cold_warm notebook, leaves report.html without a live ``<svg``.
"""

from __future__ import annotations

import gzip
import json
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfkit.common.slugs import md_text

ROOT = Path(__file__).resolve().parents[1]

#: the pieces a hostile text is made of
PIECES = [
    "`", "``", "<svg onload=alert(1)>", "<iframe src=x>", "</td>", "<script>", "&", "&lt;", "&#96;",
    '"', "'", "|", "\n", "\r\n", "\\", "[x](javascript:alert(1))", "![i](http://evil/i.png)",
    "<br>", "*", "_", "#", "- ", "> ", "$", "<!--", "-->", "]", "(", "op", " ",
]  # fmt: skip
hostile = st.lists(st.sampled_from(PIECES) | st.text(max_size=5), min_size=1, max_size=30).map("".join)
#: the tags Markdown of perfkit's own may hold
ALLOWED = {
    "p", "code", "em", "strong", "br", "table", "thead", "tbody", "tr", "th", "td", "ul", "li",
    "h1", "h2", "h3", "h4", "a", "del", "details", "summary", "hr", "ol", "blockquote",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list]] = []
        self.rows: list[int] = []  # cells per table row

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th") and self.rows:
            self.rows[-1] += 1


def render(md: str) -> _Tags:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    p = _Tags()
    p.feed(markdown2html_mistune(md))
    return p


def assert_inert(md: str, rows: int | None = None, cells: int | None = None) -> None:
    """No tag outside ALLOWED, no event handler, no script link; the table (when given) keeps
    ``rows`` rows (with the header) of ``cells`` cells each."""
    p = render(md)
    for tag, attrs in p.tags:
        assert tag in ALLOWED, f"live <{tag}> in {md!r}"
        for k, v in attrs:
            assert not k.startswith("on"), f"<{tag} {k}> in {md!r}"
            assert not (v or "").strip().lower().startswith(("javascript:", "data:")), md
    if rows is not None:
        assert p.rows == [cells] * rows, f"table broken: {p.rows} in {md!r}"


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(hostile)
def test_md_text_is_inert_in_a_paragraph_and_in_code_font(s):
    assert_inert(f"Trace not read: {md_text(s)}, again {md_text(s, code=True)}.")
    assert "\n" not in md_text(s) and "\n" not in md_text(s, cell=True)


@FAST
@given(hostile, hostile)
def test_markdown_table_keeps_rows_and_cells(a, b):
    from perfkit.report.tables import markdown_table

    df = pd.DataFrame({"what": [a, "x", b], "note": [b, a, "plain"]})
    assert_inert(markdown_table(df), rows=4, cells=2)


@FAST
@given(hostile)
def test_summary_md_of_a_run_with_hostile_errors_names_and_warnings(tmp_path_factory, s):
    from perfkit.report.render import summary_markdown

    d = tmp_path_factory.mktemp("run")
    run = {"name": s, "description": s, "notebooks": [{"name": "cold_warm", "status": "error", "error": s}]}
    (d / "run.json").write_text(json.dumps(run))
    (d / "baseline_gate").mkdir()
    (d / "baseline_gate" / "verdict.json").write_text(
        json.dumps({"status": "pass", "warnings": [s], "rows": []})
    )
    md = summary_markdown(d)
    assert "### Warnings" in md and "### Errors" in md
    assert_inert(md)


@FAST
@given(hostile, hostile, hostile)
def test_history_check_summary_keeps_its_table(case, reason, commit):
    """Found by the breaker: a nightly error text holding an <iframe> went raw into a cell."""
    from perfkit.history.check import CheckResult, CheckRow, summary_markdown

    row = CheckRow(
        hardware=case, case_id=case, metric="latency_s", unit="s", commit=commit, value=2.0, status="regression",
        reason=reason, level=1.0, low=0.9, high=1.1, n=5, before=None,
    )  # fmt: skip
    md = summary_markdown(CheckResult([row, row]), commit_url="https://x/commit/{commit}")
    table = md[md.index("| hardware |") :]
    assert_inert(md)
    assert_inert(table, rows=3, cells=9)


@FAST
@given(hostile, hostile)
def test_verdict_sites_load_and_bisect_texts_are_inert(a, b):
    from perfkit.investigations import load as L
    from perfkit.measuring.profiled import sites_markdown
    from perfkit.report.history_site import bisect_summary_markdown
    from perfkit.report.tables import verdict_markdown

    assert_inert(verdict_markdown([{"case": "c", "metric": a, "status": "fail", "reason": b}]))
    ms = {"status": "ok", "from": 0, "to": 3, "grew": [{"site": a, "grown_mib": 64.0}]}
    assert_inert(sites_markdown({"memory_sites": ms}))
    assert_inert(sites_markdown({"memory_sites": {"status": b}}))
    rows = [{"phase": "closed", "level": 2, "slot": 1, "request_id": a, "status": "error", "error": b}]
    assert_inert("\n".join(L.not_completed({"per_request": rows})))
    d = {
        "outcome": "found", "exit_code": 1, "message": a, "repo": b, "setup": {"build": a, "metric": b},
        "found": {"sha": "abc", "subject": a, "author_date": "2026"}, "good": {"short": "g", "subject": b},
        "bad": {"short": "b", "subject": a},
    }  # fmt: skip
    assert_inert(bisect_summary_markdown(d))


def test_long_text_stays_one_row():
    from perfkit.report.tables import markdown_table

    s = ("<svg onload=x>|`\n" * 5000) + "&" * 10_000
    md = markdown_table(pd.DataFrame({"a": [s], "b": ["x"]}))
    assert md.count("\n") == 2
    assert_inert(md, rows=2, cells=2)


# ------------------------------------------------------------------ end to end: a real trace
HOSTILE_OP = "aten::mm` <svg onload=alert(1)> `x"


@pytest.mark.slow
def test_a_trace_with_a_hostile_op_name_leaves_no_live_svg_in_the_report(tmp_path):
    """Found by the breaker: the trace error shown as Markdown inline code (cells.BELOW_STAGE)
    ended at the op name's backtick and the rest went live into report.html. A real trace of
    the tiny engine (profiled cold and warm request) gets one event with that name and a ts the
    reader refuses, naming the event; the suite replays the bundle through the cold_warm
    notebook and renders the page."""
    import yaml

    from perfkit.investigations.cold_warm import cold_vs_warm
    from perfkit.params import load_params
    from perfkit.suite import run_suite

    params = yaml.safe_load((ROOT / "params/ci-cpu.yaml").read_text())
    params["engine"]["compile"] = False  # a profiler with stacks makes compiling slow
    for name in ("warmup_shapes", "memory_budget", "offload_modes", "load"):
        params[name] = {"enabled": False}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    p = load_params(tmp_path / "params.yaml")
    prof = {"requests": ["cold", "warm"], "steps": 1}
    b = cold_vs_warm(p.engine, p.request.model_dump(), repeats=2, run_dir=tmp_path / "m", profile=prof)
    rec = tmp_path / "recorded" / "cold_warm"
    b.save(rec)
    traces = sorted(rec.rglob("*.trace.json.gz"))
    assert traces, "the profiled requests left no trace"
    doc = json.loads(gzip.decompress(traces[0].read_bytes()))
    doc["traceEvents"].append({"ph": "X", "name": HOSTILE_OP, "ts": "soon", "dur": 1, "cat": "cpu_op"})
    traces[0].write_bytes(gzip.compress(json.dumps(doc).encode()))
    # found by a later breaker: the run directory's path went raw into each notebook's verdict
    # line (the gate's Markdown): a directory name is outside text too
    run_dir = tmp_path / "run <svg onload=alert(2)>`"
    run_suite(
        str(tmp_path / "params.yaml"), run_dir, replay=tmp_path / "recorded", screenshot=False, progress=False
    )
    page = (run_dir / "report.html").read_text()
    assert "verdict: " in page and "svg onload=alert(2)" in page, "the path never reached the page"
    assert "svg onload=alert(1)" in page, "the trace error never reached the page"
    low = page.lower()
    assert "<svg" not in low, low[low.find("<svg") - 300 :][:600]
    assert "&lt;svg onload=alert(1)&gt;" in page


@FAST
@given(hostile, hostile, hostile)
def test_compare_check_table_keeps_its_rows_and_no_markup_live(case, metric, reason):
    """`perfkit compare` printed a performance.log's stage name and a `baseline update --case`
    name raw in its Markdown table (a breaker's `<svg onload=alert(8)>`)."""
    from perfkit.report.tables import markdown_table

    df = pd.DataFrame(
        {
            "case": [case, "x"],
            "metric": [metric, "e2e_ms"],
            "status": ["fail", "pass"],
            "reason": [reason, "<= 1"],
        }
    )
    md = markdown_table(df, checks=True)
    assert_inert(md, rows=3, cells=4)
    assert md.rstrip().endswith("| x | e2e_ms | pass | <= 1 |"), md

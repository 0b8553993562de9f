"""perfkit history on sglang's real nightly data (tests/fixtures/sglang-nightly: 126 runs of
14 cases, March–July 2026): the import, the flux2 step with its commit range, the largest
single-run outliers as outliers, errors as gaps, the history gate on two real runs, the
generated docs table, and the offline site in Chromium."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.history import changepoints as cp
from perfkit.history.store import read_store

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = ROOT / "tests" / "fixtures" / "sglang-nightly"
SGLANG = "https://github.com/sgl-project/sglang/commit/{commit}"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    s = tmp_path_factory.mktemp("history") / "store"
    assert main(["history", "import", str(NIGHTLY), "--hardware", "H100", "--store", str(s)]) == 0
    assert main(["history", "import", str(NIGHTLY), "--hardware", "H100", "--store", str(s)]) == 0
    return s


@pytest.fixture(scope="module")
def analyses(store: Path) -> dict[str, cp.Analysis]:
    return {a.case_id: a for a in cp.analyse_frame(read_store(store))}


def test_the_committed_slice_imports_once(store: Path):
    df = read_store(store)
    files = sorted(NIGHTLY.glob("*.json"))
    assert len(files) == 126 and df["run_key"].nunique() == 126 and len(df) == 1235
    assert df["case_id"].nunique() == 14 and set(df["hardware"]) == {"H100"}
    first = json.loads(files[0].read_text())
    row = df[df["run_id"] == str(first["run_id"])].set_index("case_id")
    for r in first["results"]:  # the exact values, errors as gaps
        if r["error"]:
            assert row.loc[r["case_id"], "value"] != row.loc[r["case_id"], "value"]  # NaN
            assert row.loc[r["case_id"], "error"] == r["error"]
        else:
            assert row.loc[r["case_id"], "value"] == r["latency_s"]


def test_flux2_step_is_found_with_the_commit_range_of_the_change(analyses):
    """flux2_dev_t2i_1024 went from about 24.6 s to about 14.4 s between the run of commit
    05ee93c4 (2026-06-19, 24.86 s) and the run of 2cbe1e64 (2026-06-20, 14.33 s), and
    stayed there; the earlier +7.9 % (22.8 → 24.6 s, ff700aa3 .. c112f762) is found too."""
    a = analyses["flux2_dev_t2i_1024"]
    big = [s for s in a.steps if s.ratio < 0.8]
    assert len(big) == 1
    (s,) = big
    assert s.kind == "improvement"
    assert s.before.commit.startswith("05ee93c4") and s.before.value == 24.856
    assert s.after.commit.startswith("2cbe1e64") and s.after.value == 14.333
    assert 24 < s.mean_before < 25 and 14.2 < s.mean_after < 14.6
    assert s.low < s.ratio < s.high < 0.6
    assert [(x.before.commit[:8], x.after.commit[:8]) for x in a.steps] == [
        ("ff700aa3", "c112f762"),
        ("05ee93c4", "2cbe1e64"),
    ]


def test_the_largest_single_run_outliers_are_outliers_not_steps(analyses):
    """The runs 2–19 × their neighbours (the 2026-06-27 run 528f1707 in most cases)."""
    big = {
        ("zimage_turbo_t2i_1024", "528f1707"),
        ("flux1_dev_t2i_1024", "528f1707"),
        ("flux2_dev_t2i_1024", "528f1707"),
        ("qwen_image_2512_t2i_1024", "528f1707"),
        ("qwen_image_2512_t2i_1024", "75cdaf43"),
        ("qwen_image_edit_2511", "528f1707"),
        ("ideogram4_fp8_t2i_2gpu", "528f1707"),
        ("zimage_turbo_t2i_1024", "9a6f8e59"),
    }
    found = {(c, p.commit[:8]): r for c, a in analyses.items() for p, r in a.outliers}
    assert big <= set(found), big - set(found)
    assert round(found[("zimage_turbo_t2i_1024", "528f1707")]) == 19
    step_runs = {(c, s.after.commit[:8]) for c, a in analyses.items() for s in a.steps}
    assert not big & step_runs
    # and in general: no run that is 1.5x both its neighbours' medians is a step
    for c, a in analyses.items():
        kept = [p for p in a.points if p.value is not None]
        for i in range(1, len(kept) - 1):
            left, right = kept[max(0, i - 3) : i], kept[i + 1 : i + 4]
            ml = sorted(p.value for p in left)[len(left) // 2]
            mr = sorted(p.value for p in right)[len(right) // 2]
            if kept[i].value > 1.5 * max(ml, mr):
                assert kept[i].run_key not in {s.after.run_key for s in a.steps}, (c, kept[i])


def test_errors_and_nulls_are_gaps(analyses, store: Path):
    df = read_store(store)
    errors = df[df["error"].notna()]
    assert len(errors) == 55 and errors["value"].isna().all() and (df["value"].dropna() > 0).all()
    for c, a in analyses.items():
        assert len(a.gaps) == (errors["case_id"] == c).sum()
    flux2 = analyses["flux2_dev_t2i_1024"]
    assert {p.time.strftime("%m-%d") for p in flux2.gaps} >= {"04-25", "06-27"}
    for a in analyses.values():  # a 0 would pull a level below the smallest measured value
        low = min(p.value for p in a.points if p.value is not None)
        assert all(min(s.mean_before, s.mean_after) >= low for s in a.steps)


def test_one_event_moves_flux1_flux2_and_zimage(analyses):
    evs = {(e.before.commit[:8], e.after.commit[:8]): e for e in cp.events(list(analyses.values()))}
    e = evs[("05ee93c4", "2cbe1e64")]
    assert sorted(a.case_id for a, _ in e.members) == [
        "flux1_dev_t2i_1024",
        "flux2_dev_t2i_1024",
        "zimage_turbo_t2i_1024",
    ]


def _nightly_file(commit: str) -> Path:
    return next(
        f for f in NIGHTLY.glob("*.json") if json.loads(f.read_text())["commit_sha"].startswith(commit)
    )


def test_history_check_on_the_run_of_a_regression_step_and_the_run_before(store: Path, tmp_path: Path):
    """c112f762's run (2026-05-23) moved flux1, flux2 and wan22_ti2v up: exit 1, summary.md
    names each series, the step and the commit range; the run before it passes (exit 0)."""
    out = tmp_path / "check"
    run = _nightly_file("c112f762")
    args = [
        "history",
        "check",
        str(run),
        "--hardware",
        "H100",
        "--store",
        str(store),
        "--out",
        str(out),
        "-q",
    ]
    assert main([*args, "--commit-url", SGLANG]) == 1
    text = (out / "summary.md").read_text()
    assert "FAIL: regression step" in text
    line = next(x for x in text.splitlines() if "`flux2_dev_t2i_1024`" in x and x.startswith("- "))
    assert "22.8 → 24.5 s (+7.2 %" in line
    assert "[`ff700aa37a`](https://github.com/sgl-project/sglang/commit/ff700aa3" in line
    assert "`wan22_ti2v_5b_720p`" in text and "`flux1_dev_t2i_1024`" in text
    assert main(["history", "check", str(_nightly_file("ff700aa3")), "--hardware", "H100",
                 "--store", str(store), "--out", str(out), "-q"]) == 0  # fmt: skip
    assert "# History check: PASS" in (out / "summary.md").read_text()


def test_the_docs_table_is_generated_from_the_data():
    from perfkit.report.figures import update_file

    stale = update_file(ROOT / "docs/history-sglang-nightly.md", ROOT, check=True)
    assert not stale, "run: perfkit figures docs/history-sglang-nightly.md"
    text = (ROOT / "docs/history-sglang-nightly.md").read_text()
    assert "| `flux2_dev_t2i_1024` | `05ee93c4` (2026-06-19) .. `2cbe1e64` (2026-06-20) |" in text
    assert text.count("| `") > 14 + 20


@pytest.fixture(scope="module")
def site(store: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    assert main(["history", "site", str(out), "--store", str(store), "--commit-url", SGLANG]) == 0
    return out


def test_the_site_has_each_case_with_its_steps_and_links(site: Path):
    html = (site / "H100.html").read_text()
    assert (site / "index.html").read_text().count('href="H100.html"') == 1
    assert html.count('<img class="trend" src="data:image/png;base64,') == 14
    assert 'href="https://github.com/sgl-project/sglang/commit/2cbe1e64' in html
    assert 'flux1_dev_t2i_1024 latency_s: <span class="st-improvement">improvement -33.8 %</span>' in html
    assert "<script" not in html and "<link" not in html


@pytest.mark.browser
def test_the_site_reads_offline_at_1280_in_chromium(site: Path, tmp_path: Path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_report_browser import CHROMIUM, LOCAL_SCHEMES, read_at

    if CHROMIUM is None:
        pytest.skip("chromium not installed")
    for page in ("index.html", "H100.html"):
        f = read_at(site / page, tmp_path / page)
        assert f["scrollWidth"] <= f["innerWidth"] == 1280, f["wide"]
        assert f["junk"] == [], f["junk"]
        assert f["noAlt"] == 0
        remote = [u for u in f["requests"] if not u.startswith(LOCAL_SCHEMES)]
        assert remote == [], f"network requests: {remote}"
        assert [u for u in f["requests"] if not u.startswith("data:")] == [(site / page).resolve().as_uri()]
    assert f["images"] == 14 and f["tables"] >= 10


def test_the_history_notebook_runs_on_the_nightly_slice(tmp_path: Path):
    """notebooks/history.ipynb (generated) through papermill: it imports the slice into an
    empty store and shows flux2's steps."""
    import nbformat
    import papermill

    out = tmp_path / "history.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "history.ipynb"),
        str(out),
        parameters={"store": str(tmp_path / "store"), "nightly": str(NIGHTLY)},
        cwd=str(ROOT / "notebooks"),
        progress_bar=False,
    )
    nb = nbformat.read(str(out), as_version=4)
    text = "\n".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "126 runs imported" in text
    assert "**flux2_dev_t2i_1024 latency_s on H100**: 125 runs, 2 steps, 2 outliers, 5 gaps" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))

"""Figures in docs come from the data: README blocks regenerated from committed bundles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import inprocess_cli
from perfkit.report.figures import Block, render_block, same_figures

ROOT = Path(__file__).resolve().parents[1]
DOCS = (
    "README.md",
    "examples/h200/README.md",
    "examples/h200/load/README.md",
    "examples/h200/load-trace/README.md",
    "examples/h200x2/README.md",
    "examples/h200x2/scaleout/README.md",
    "docs/commands.md",
    "docs/timings.md",
)


def _figures(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``perfkit figures ARGS`` in ``cwd``, in this process (tests/inprocess_cli.py)."""
    return inprocess_cli.perfkit("figures", *args, cwd=cwd)


def test_committed_figures_match_their_bundles():
    proc = _figures("--check", *DOCS)
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\nrun: perfkit figures " + " ".join(DOCS)


def test_the_warm_iqr_is_the_bundles_linear_quantiles():
    text = render_block(Block("examples/h200/bundles", "full"), ROOT)
    assert "| warm interquartile range (ms) | 929–967 |" in text
    assert "linear interpolation" in text
    assert "944–965" not in (ROOT / "examples/h200/README.md").read_text()


def test_stale_block_is_found_and_rewritten(tmp_path):
    doc = tmp_path / "README.md"
    good = (ROOT / "README.md").read_text()
    doc.write_text(good.replace("| 954 ms |", "| 944 ms |"))
    proc = _figures("--root", str(ROOT), "--check", str(doc))
    assert proc.returncode == 1 and "stale" in proc.stdout
    assert "| 944 ms |" in doc.read_text()  # --check changes nothing
    assert _figures("--root", str(ROOT), str(doc)).returncode == 0
    assert doc.read_text() == good


def test_a_figure_one_unit_off_in_its_last_digit_is_not_stale(tmp_path):
    """A figure recomputed on another CPU may round the other way (numpy's summation order follows
    the SIMD width): one unit of the last shown digit is the tolerance of --check; two is stale."""
    doc = tmp_path / "README.md"
    good = (ROOT / "README.md").read_text()
    assert "| 954 ms |" in good
    doc.write_text(good.replace("| 954 ms |", "| 955 ms |"))
    proc = _figures("--root", str(ROOT), "--check", str(doc))
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stdout + proc.stderr
    doc.write_text(good.replace("| 954 ms |", "| 956 ms |"))
    assert _figures("--root", str(ROOT), "--check", str(doc)).returncode == 1
    assert same_figures("ratio 3.41, 1,200 MiB", "ratio 3.42, 1,201 MiB")
    assert not same_figures("ratio 3.41", "ratio 3.43") and not same_figures("3.41 s", "3.41 ms")


def test_the_command_reference_is_every_commands_click_help(tmp_path):
    good = (ROOT / "docs/commands.md").read_text()
    assert "Usage: perfkit suite [OPTIONS]" in good and "--partition I/N" in good
    assert "    overhead       Instrumentation overhead: " in good  # suite's list of investigations
    for path in ("perfkit history confirm", "perfkit wheelhouse install", "perfkit engine serve"):
        assert f"### {path}\n" in good and f"(#{path.replace(' ', '-')})" in good
    doc = tmp_path / "commands.md"
    doc.write_text(good.replace("--gate-metrics", "--gated-metrics"))  # a renamed option: stale
    proc = _figures("--root", str(ROOT), "--check", str(doc))
    assert proc.returncode == 1 and "stale" in proc.stdout
    assert _figures("--root", str(ROOT), str(doc)).returncode == 0
    assert doc.read_text() == good


def test_bad_blocks_are_errors_naming_the_file(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("<!-- perfkit:figures src=nowhere kind=full -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert proc.returncode == 2 and "no <investigation>/results.json" in proc.stderr
    doc.write_text("<!-- perfkit:figures src=. kind=pie -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert proc.returncode == 2 and "kind='pie'" in proc.stderr and str(doc) in proc.stderr
    doc.write_text("no blocks here\n")
    assert _figures(str(doc)).returncode == 2


def test_compare_block_puts_two_runs_side_by_side_per_rank():
    text = render_block(Block("examples/h200x2/bundles", "compare", "examples/h200x2/bundles-1gpu"), ROOT)
    assert "A: `examples/h200x2/bundles` · B: `examples/h200x2/bundles-1gpu`" in text
    assert "| warm request e2e | 967.8 ms | 833.1 ms | 1.16 |" in text
    assert "| peak VRAM reserved, rank 1 (GPU 1) | 14,638.0 MiB | – | – | – |" in text


def test_compare_block_needs_vs(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("<!-- perfkit:figures src=. kind=compare -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert proc.returncode == 2 and "needs vs=DIR" in proc.stderr


def test_unterminated_or_unknown_blocks_and_corrupt_results_are_named_errors(tmp_path):
    good = (ROOT / "README.md").read_text()
    doc = tmp_path / "README.md"
    # a good block then an unterminated one: an error, and the file is left as it was
    bad = (
        good.replace("| 954 ms |", "| 944 ms |")
        + "\n<!-- perfkit:figures src=examples/h200/bundles -->\nstale\n"
    )
    doc.write_text(bad)
    proc = _figures("--root", str(ROOT), str(doc))
    assert proc.returncode == 2 and "complete block" in proc.stderr and str(doc) in proc.stderr
    assert doc.read_text() == bad
    doc.write_text("<!-- perfkit:figures src=. kind=full foo=bar -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert proc.returncode == 2 and "unknown figures attribute(s) foo" in proc.stderr
    # an attribute its kind does not read is refused, not silently ignored
    doc.write_text("<!-- perfkit:figures src=. kind=full threshold=0.01 -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert proc.returncode == 2 and "kind=full takes no threshold (it takes: src, kind)" in proc.stderr
    # corrupt results.json: the error names the document and the file
    (tmp_path / "b" / "cold_warm").mkdir(parents=True)
    (tmp_path / "b" / "cold_warm" / "results.json").write_text("{not json")
    doc.write_text("<!-- perfkit:figures src=b kind=full -->\n<!-- perfkit:end -->\n")
    proc = _figures("--root", str(tmp_path), str(doc))
    assert (
        proc.returncode == 2 and str(doc) in proc.stderr and "results.json: unreadable results" in proc.stderr
    )
    # several files: one bad file leaves the good ones untouched
    ok = tmp_path / "ok.md"
    ok.write_text(good.replace("| 954 ms |", "| 944 ms |"))
    assert _figures("--root", str(ROOT), str(ok), str(doc)).returncode == 2
    assert "| 944 ms |" in ok.read_text()


def test_report_refuses_a_folder_that_is_not_a_run_and_a_corrupt_verdict_is_an_error(tmp_path):
    import json
    import shutil

    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    run = tmp_path / "run"
    shutil.copytree(ROOT / "examples/h200/report", run)
    (run / "baseline_gate" / "verdict.json").write_text("{")
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "report", str(run)], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    summary = (run / "summary.md").read_text()
    assert "PASS" not in summary.splitlines()[0] and "unreadable verdict file" in summary
    assert json.loads((run / "run.json").read_text())  # the run's own files are intact


def test_pooled_overhead_is_every_launchs_pairs_under_one_estimator():
    import json

    import numpy as np

    from perfkit.investigations.overhead import pooled

    runs = [
        json.loads((ROOT / f"examples/h200/{d}/overhead/results.json").read_text())
        for d in ("bundles-overhead", "bundles-overhead-2")
    ]
    r = pooled(runs)
    st = r["stage_timing"]
    assert r["launches"] == 2 and st["n_pairs"] == 80 and st["n_on"] == 80
    logs = np.log(
        [a / b for a, b in runs[0]["stage_timing"]["pairs_ms"] + runs[1]["stage_timing"]["pairs_ms"]]
    )
    assert st["overhead"] == float(np.expm1(np.median(logs)))
    # 80 pairs give a narrower interval than either launch's 40
    width = st["overhead_ci"][1] - st["overhead_ci"][0]
    assert all(
        width < x["stage_timing"]["overhead_ci"][1] - x["stage_timing"]["overhead_ci"][0] for x in runs
    )
    assert "pooled over 2 launches" in st["estimator"]


def test_pooled_overhead_refuses_bad_launches_naming_launch_and_field(tmp_path):
    import copy
    import json

    import pytest

    from perfkit.investigations.overhead import pooled
    from perfkit.investigations.registry import InvestigationError
    from perfkit.report.figures import FiguresError

    good = json.loads((ROOT / "examples/h200/bundles-overhead-2/overhead/results.json").read_text())

    def with_part(**changes):
        r = copy.deepcopy(good)
        r["stage_timing"].update(changes)
        return r

    st = good["stage_timing"]
    bad = {
        "two or more launches": [good],
        "launch 2 has no stage_timing.pairs_ms": [good, with_part(pairs_ms=None)],
        "pairs_ms.0.0: Input should be a valid number": [good, with_part(pairs_ms=[["806.1", 807.0]] * 2)],
        "greater than 0": [good, with_part(pairs_ms=[[0, 807.0]] + st["pairs_ms"][1:])],
        "finite number": [good, with_part(on_ms=[float("inf")] * 40)],
        "at most 2 items": [good, with_part(pairs_ms=[[1.0, 2.0, 3.0]] * 40)],
        "40 pairs but 39 on_ms": [good, with_part(on_ms=st["on_ms"][1:])],
        "results are a list": [good, []],
    }
    other = copy.deepcopy(good)
    other["stage_timing"]["pairs_ms"] = [[a + 1.0, b] for a, b in st["pairs_ms"]]
    bad["launch 2 repeats the sampler pairs of launch 1"] = [good, {**other, "sampler": good["sampler"]}]
    for msg, runs in bad.items():
        with pytest.raises(InvestigationError, match=msg):
            pooled(runs)
    # figures: a directory given twice (also by another spelling), an empty item, a missing one
    for src, msg in (
        ("examples/h200/bundles-overhead,./examples/h200/bundles-overhead/", "again"),
        ("examples/h200/bundles-overhead,,examples/h200/bundles-overhead-2", "empty item"),
        (f"examples/h200/bundles-overhead,{tmp_path / 'nope'}", "no such directory"),
        (f"examples/h200/bundles-overhead,{tmp_path}", "has no overhead/results.json"),
    ):
        with pytest.raises(FiguresError, match=msg):
            render_block(Block(src, "overhead-pooled"), ROOT)


def test_the_sglang_tier_block_tables_each_run_and_names_what_is_missing(tmp_path):
    from perfkit.report.figures import FiguresError, tier_markdown

    meta = {"date": "2026-12-04", "sglang": "0.5.23", "machine": "2 CPU cores", "commit": "abc1234"}
    doc = {
        "_meta": meta,
        "cold_warm": {
            "verdict": "pass",
            "checks": {"a": "pass", "b": "pass", "c": "skipped"},
            "wall_s": 141.2,
        },
        "ab A/A": {"verdict": "undecided", "exit_code": 1, "wall_s": 222.0},
    }
    p = tmp_path / "verdicts.json"
    p.write_text(json.dumps(doc))
    md = tier_markdown(p, "docs/sglang-tier/verdicts.json")
    assert "| cold_warm | pass | – | 2 min 21 s | 2 pass, 1 skipped |" in md
    assert "| ab A/A | undecided | 1 | 3 min 42 s | – |" in md
    assert "sglang 0.5.23" in md and "2026-12-04" in md
    del doc["ab A/A"]["wall_s"]
    p.write_text(json.dumps(doc))
    with pytest.raises(FiguresError, match="ab A/A: no wall_s"):
        tier_markdown(p, "x")
    p.write_text(json.dumps({"cold_warm": doc["cold_warm"]}))
    with pytest.raises(FiguresError, match="no _meta"):
        tier_markdown(p, "x")

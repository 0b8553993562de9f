"""The notebooks as a root-cause tool (issue 20, items 5 and 6): real papermill executions of the
committed H200 bundles, the invariants merged over the defaults on a replay, the verdict in the
text equal to the gate's, request roles and recompile reasons, progress events, and the
nbstripout filter keeping tracked notebooks clean.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from notebook_checks import html_problems, outputs
from perfkit.bundle import ResultBundle
from perfkit.checks import Check
from perfkit.common.numfmt import number_text
from perfkit.gate import verdicts
from perfkit.gate.run import investigation_checks
from perfkit.investigations import registry
from perfkit.measuring import progress
from perfkit.report import tables as nbk

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "examples" / "h200" / "bundles"
REASON = "size mismatch at index 1. expected 1152, actual 1536"


def perfkit(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfkit.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


# ------------------------------------------------------------------ the H200 run, drift limit 0.05
@pytest.fixture(scope="module")
def h200_tight(tmp_path_factory):
    """The committed H200 run replayed with the params it was measured with, except a latency
    drift limit of 0.05 (its drift is 0.091): a suite run through papermill."""
    tmp = tmp_path_factory.mktemp("h200")
    params = yaml.safe_load((ROOT / "params" / "h200.yaml").read_text())
    params["invariants"]["latency_drift_max"] = 0.05
    pfile = tmp / "h200-tight.yaml"
    pfile.write_text(yaml.safe_dump(params))
    out = tmp / "run"
    proc = perfkit(
        "suite", "--params", str(pfile), "--replay", str(H200), "--out", str(out), "--no-screenshot", "-q"
    )
    return proc, out


@pytest.mark.slow
def test_tight_drift_limit_fails_in_the_gate_and_in_the_text(h200_tight):
    proc, out = h200_tight
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for where in ("cold_warm", verdicts.GATE):
        rows = {r["metric"]: r for r in verdicts.read_verdict(out / where)["rows"]}
        assert rows["latency_drift"]["status"] == "fail", rows
        # merged with the defaults: the other checks are still gated
        assert {
            "warm_cold_ratio",
            "host_anon_slope_mib_per_request",
            "device_reserved_slope_mib_per_request",
        } <= set(rows)
    md = "\n".join(outputs(out / "notebooks" / "cold_warm.ipynb", "text/markdown"))
    assert (
        "**Gate: fail.** 4 checks: 1 failed, 3 passed. Failed: <code>latency_drift</code> (0.091 &gt; 0.05)"
        in md
    )
    assert "**Leak checks: fail.**" in md
    assert "Every measured" not in md and "Passed: <code>" in md  # passes listed as such, never as all
    gate_md = "\n".join(outputs(out / "notebooks" / f"{verdicts.GATE}.ipynb", "text/markdown"))
    assert "**Invariants: fail.**" in gate_md and "<code>latency_drift</code> (0.091 &gt; 0.05)" in gate_md


@pytest.mark.slow
def test_one_failed_check_one_red_box_one_count_no_raw_cell_values(h200_tight):
    """The page of the run with one failed check (latency_drift): one red box (the baseline gate
    judges the check again, but the box is Cold vs warm's), Cold vs warm's count the same in the
    box, the summary table, its section and its notebook's last line; the gate table's columns
    named for what they hold; no notebook ends in a raw cell value ('pass')."""
    import html as html_lib
    import re

    _, out = h200_tight
    page = (out / "report.html").read_text(encoding="utf-8")
    boxes = re.findall(r'<div class="error-box[^"]*"[^>]*>(.*?)</div>', page, flags=re.S)
    assert len(boxes) == 1 and "Cold vs warm: gate failed" in boxes[0], boxes
    count = "4 checks: 1 failed, 3 passed"
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", page))
    assert f"Cold vs warm: gate failed ({count})" in text
    assert f"gate fail: {count} · notebook cold_warm" in " ".join(text.split())
    assert f"cold_warm gate: fail: {count}; failed: latency_drift (0.091 > 0.05)" in text
    cells = re.findall(r"<t[dh](?:\s[^>]*)?>(.*?)</t[dh]>", page, flags=re.S)
    assert f"fail: {count}"[6:] in [html_lib.unescape(c).strip() for c in cells]  # the summary table
    heads = re.findall(
        r"<th(?:\s[^>]*)?>(.*?)</th>", page.split('id="failed-rows"', 1)[1].split("</table>", 1)[0]
    )
    assert heads == ["notebook", "case", "metric", "baseline", "measured", "limit", "status", "reason"], heads
    for nb in sorted((out / "notebooks").glob("*.ipynb")):
        raw = [
            o
            for c in nbformat.read(nb, as_version=4).cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
        ]
        echoed = [o["data"].get("text/plain") for o in raw if o.get("output_type") == "execute_result"]
        assert not [e for e in echoed if e in ("'pass'", "'fail'", "'not gated'", "0", "1")], (
            nb.name,
            echoed,
        )
    assert "'pass'" not in text and "'fail'" not in text


@pytest.mark.slow
def test_executed_notebooks_use_the_table_formatter(h200_tight):
    _, out = h200_tight
    nbs = sorted((out / "notebooks").glob("*.ipynb"))
    assert {p.stem for p in nbs} >= {"cold_warm", "warmup_shapes", "memory_budget", verdicts.GATE}
    for nb in nbs:
        assert outputs(nb, "text/html"), f"{nb.name}: no table"
        assert html_problems(nb) == [], nb.name
        assert not any("Warning" in s for s in outputs(nb, "stream")), nb.name  # no TqdmWarning


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cold_warm", "warmup_shapes"])
def test_recompile_reason_count_and_time_beside_the_penalty(h200_tight, name):
    _, out = h200_tight
    html = "\n".join(outputs(out / "notebooks" / f"{name}.ipynb", "text/html"))
    assert REASON in html
    assert "first of a new shape" in html or "cold, new shape" in html
    assert "25 frames (4 latent), 512x768, 30 steps" in html


@pytest.mark.slow
def test_run_one_notebook_with_invariants_merges_them(tmp_path):
    """``perfkit run -p invariants=...`` on a replay: the given limit replaces its default, the
    other defaults stay (three rows used to vanish)."""
    proc = perfkit(
        "run",
        "notebooks/cold_warm.ipynb",
        "-p",
        f"bundle_dir={H200 / 'cold_warm'}",
        "-p",
        f"run_dir={tmp_path}",
        "-p",
        'invariants={"latency_drift_max": 0.05, "warm_cold_ratio_max": null}',
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["metric"]: r["status"] for r in verdicts.read_verdict(tmp_path / "cold_warm")["rows"]}
    assert rows == {
        "host_anon_slope_mib_per_request": "pass",
        "device_reserved_slope_mib_per_request": "pass",
        "latency_drift": "fail",
    }
    events = tmp_path / "notebooks" / "cold_warm.progress.jsonl"
    assert not events.exists() or events.read_text() == ""  # a replay launches nothing


# ------------------------------------------------------------------ library pieces, no kernel
def test_merged_invariants_overlay_the_defaults():
    defaults = registry.invariant_defaults()
    m = registry.merged_invariants({"latency_drift_max": 0.05, "warm_cold_ratio_max": None})
    assert m["latency_drift_max"] == 0.05 and m["warm_cold_ratio_max"] is None
    assert {k: v for k, v in m.items() if k not in ("latency_drift_max", "warm_cold_ratio_max")} == {
        k: v for k, v in defaults.items() if k not in ("latency_drift_max", "warm_cold_ratio_max")
    }
    assert registry.merged_invariants(None) == defaults
    with pytest.raises(ValueError, match="unknown key 'latency_drift' .*did you mean 'latency_drift_max'"):
        registry.merged_invariants({"latency_drift": 0.1})
    with pytest.raises(ValueError, match="latency_drift_max"):
        registry.merged_invariants({"latency_drift_max": "tight"})


def test_recorded_verdicts_of_a_schema1_bundle_are_not_kept():
    b = ResultBundle.load(H200 / "cold_warm")  # schema 1: recorded "passed"/"threshold"
    assert "thresholds" not in b.results
    assert all(set(c) <= {"name", "value", "measured"} for c in b.results["leak_checks"])
    rows = investigation_checks("cold_warm", b.results, {"latency_drift_max": 0.05})
    assert [r.status for r in rows if r.metric == "latency_drift"] == ["fail"]
    assert len(rows) == 4


def test_request_roles_and_first_request_costs_on_h200_warmup_shapes():
    b = ResultBundle.load(H200 / "warmup_shapes")
    roles = nbk.request_roles(b.requests)
    w17 = roles[roles["launch"] == "warmup17"].sort_values("index")
    assert list(w17["role"]) == [
        "startup warmup",
        "cold",
        "warm",
        "warm",
        "first of a new shape",
        "warm",
        "warm",
    ]
    w25 = roles[roles["launch"] == "warmup25"].sort_values("index")
    assert list(w25["role"])[:4] == ["startup warmup", "cold, new shape", "warm", "warm"]
    costs = nbk.first_request_costs(b.requests, b.stages)
    row = costs[(costs["launch"] == "warmup17") & (costs["request"] == "#3 first of a new shape")].iloc[0]
    assert row["penalty stage"] == "DenoisingStage"
    assert row["compiles"] == 1 and round(row["compiling (ms)"]) == 58685
    assert round(row["penalty (ms)"]) == round(60426.521 - 905.793)
    assert REASON in row["recompile reason"]


def test_the_penalty_stage_compares_per_request_sums_when_a_stage_runs_twice():
    """Two DenoisingStage rows a request (40 ms each, cold and warm alike) and a cold
    DecodingStage 30 ms over the warm one: the penalty is DecodingStage's +30 ms, not
    DenoisingStage's cold sum against the warm median of single rows (+40 ms)."""
    req = pd.DataFrame(
        {
            "launch": ["L"] * 3,
            "index": [0, 1, 2],
            "request_id": ["c", "w1", "w2"],
            "e2e_ms": [130.0, 100.0, 100.0],
            "status": ["completed"] * 3,
            "num_frames": [17] * 3,
            "height": [64] * 3,
            "width": [64] * 3,
            "num_inference_steps": [4] * 3,
        }
    )
    rows = []
    for rid, extra in (("c", 30.0), ("w1", 0.0), ("w2", 0.0)):
        rows += [{"request_id": rid, "stage": "DenoisingStage", "ms": 40.0}] * 2
        rows += [{"request_id": rid, "stage": "DecodingStage", "ms": 20.0 + extra}]
    row = nbk.first_request_costs(req, pd.DataFrame(rows)).iloc[0]
    assert row["penalty stage"] == "DecodingStage"
    assert row["stage penalty (ms)"] == pytest.approx(30.0, abs=1e-9)


def test_verdict_sentences_come_from_the_check_rows():
    rows = [
        Check("x", "a", 1.0, 2.0, 1.0, "fail", "2 > 1"),
        Check("x", "b", 1.0, 0.5, 1.0, "pass", "0.5 <= 1"),
        Check("x", "c", 1.0, None, 1.0, "skipped", "not measured"),
    ]
    text = nbk.verdict_markdown(rows)
    # names in code font and reasons as text, never markup (md_text); the one check count
    assert text.startswith(
        "**Gate: fail.** 3 checks: 1 failed, 1 passed, 1 skipped. Failed: <code>a</code> (2 &gt; 1)."
    )
    assert "Every measured check passed" not in text and "Not measured, so not judged: <code>c</code>" in text
    assert (
        nbk.verdict_markdown(rows[1:2])
        == "**Gate: pass.** 1 check: 1 passed. Every measured check passed: <code>b</code> (0.5 &lt;= 1)."
    )
    assert nbk.verdict_markdown([rows[2]]).startswith("**Gate: skipped.**")


@pytest.mark.parametrize(
    "value,text", [(0.0912293, "0.091"), (-3.9e-13, "0"), (57445.2885, "57,445"), (1.0, "1"), (2.345, "2.35")]
)
def test_number_text_never_exponent_nor_four_decimals(value, text):
    assert number_text(value) == text


# ------------------------------------------------------------------ progress
def test_progress_events_per_launch_and_request(tmp_path, monkeypatch):
    events_file = tmp_path / "p.jsonl"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(events_file))
    got = []
    for x in progress.track_requests(["a", "b", "c"], "session"):
        got.append(x)
        if x == "b":
            break  # a failed request ends the launch early
    assert got == ["a", "b"]
    events, offset = progress.read_events(events_file)
    assert [e["event"] for e in events] == ["launch", "request", "launch_done"]
    assert events[0]["requests"] == 3 and events[1]["i"] == 1 and events[1]["label"] == "session"
    with open(events_file, "a") as fh:
        fh.write('{"event": "req')  # a partial line waits for its end
    assert progress.read_events(events_file, offset) == ([], offset)


def test_suite_bars_estimate_from_the_params():
    from perfkit.measuring.progress import RunBars
    from perfkit.params import load_params
    from perfkit.suite import run_plan

    p = load_params(ROOT / "params" / "h200.yaml")
    # cold_warm 1 x 5, warmup_shapes 2 x (2 shapes x 3), memory_budget 2 caps x 3 (as its bundles)
    assert run_plan(p, p.enabled()) == (5, 23)
    assert run_plan(p, [*p.enabled(), verdicts.GATE]) == (5, 23)  # the gate launches nothing
    with open(os.devnull, "w") as sink:
        bars = RunBars(sink, 5, 27)
        bars.handle({"event": "launch", "label": "session", "requests": 5}, "cold_warm")
        bars.handle({"event": "request", "label": "session", "i": 1, "n": 5})
        assert bars.overall.n == 1 and bars.overall.total == 27 and bars.launch_bar.n == 1
        bars.handle({"event": "launch_done", "label": "session"})
        assert bars.launch_bar is None
        # in process (python -m perfkit.measure): track_requests feeds the bars, draws none itself
        with bars.listen("warmup_shapes", planned=6):
            assert list(progress.track_requests([1, 2, 3], "warmup17")) == [1, 2, 3]
            assert bars.overall.n == 4
        assert bars.overall.n == 7  # the 3 planned requests it did not send count as done
        assert progress._LISTENERS == []
        bars.close()


# ------------------------------------------------------------------ JupyterLab leaves tracked files clean
@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make")
def test_saving_a_notebook_with_outputs_leaves_git_clean(tmp_path):
    repo = tmp_path / "clone"
    repo.mkdir()
    shutil.copy(ROOT / ".gitattributes", repo / ".gitattributes")
    shutil.copy(ROOT / "notebooks" / "cold_warm.ipynb", repo / "cold_warm.ipynb")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
        ).stdout

    git("init", "-q")
    bin_dir = Path(sys.executable).parent
    setup = subprocess.run(
        ["make", "-f", str(ROOT / "Makefile"), "git-filter", f"BIN={bin_dir}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert setup.returncode == 0 and "nbstripout git filter installed" in setup.stdout, (
        setup.stdout + setup.stderr
    )
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "notebook")
    # what JupyterLab writes on save: outputs, counts, full language_info, cell metadata
    nb = nbformat.read(str(repo / "cold_warm.ipynb"), as_version=4)
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.9",
    }
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            c.execution_count = i
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="72.954829\n")]
            c.metadata["execution"] = {"iopub.execute_input": "2026-11-30T13:00:00Z"}
    nbformat.write(nb, str(repo / "cold_warm.ipynb"))
    assert "72.954829" in (repo / "cold_warm.ipynb").read_text()
    # git sees no change: no diff, and staging it stages nothing (`git status` may list the file
    # as modified until then: its size changed, and git compares sizes before running filters)
    assert git("diff") == ""
    git("add", "-A")
    assert git("status", "--porcelain") == ""
    assert "72.954829" in (repo / "cold_warm.ipynb").read_text()  # the outputs stay in the file


def test_replay_names_the_params_it_cannot_apply():
    b = ResultBundle.load(H200 / "memory_budget")  # measured with 12 GiB + 32 GiB host, 3 repeats
    text = nbk.replay_markdown(
        b.meta.get("params"),
        {
            "caps": [
                {"label": "unlimited"},
                {"label": "12GiB dev + 32GiB host", "device_gib": 12.0, "host_gib": 32.0},
            ],
            "repeats": 5,
        },
        "bundles/memory_budget",
    )
    assert "judged again" in text
    assert "<code>repeats</code>: given 5, measured with 3" in text
    assert "<code>caps</code>" not in text  # the same caps, stated with fewer keys, are not a difference
    same = nbk.replay_markdown(b.meta.get("params"), {"repeats": 3}, "x")
    assert "differ" not in same

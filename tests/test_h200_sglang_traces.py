"""Issue 53, replayed on the CPU runner: ``examples/h200/sglang-traces/`` (one H200, 2026-12-04),
params/h200.yaml's investigations on the code that writes sglang-shaped traces. The traces' layout
and per-stage tables, the gate's verdict, and the figures against the committed
``examples/h200/bundles`` (the numbers its README quotes)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfkit.bundle import ResultBundle
from perfkit.gate.run import gate
from perfkit.params import load_params
from perfkit.readings.traces import load_trace, op_diff, op_events, step_ranges
from perfkit.report.belowstage import below_stage, panel

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "examples/h200/sglang-traces/bundles"
COMMITTED = ROOT / "examples/h200/bundles"
STAGES = ["TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage"]


def _traces(investigation: str) -> pd.DataFrame:
    return pd.read_parquet(RUN / investigation / "traces.parquet")


def test_traces_are_sglang_shaped():
    """full_stages: one ``STAGE <registered name>`` range per stage (CPU and GPU rows), no step
    range, every denoising step; 2_steps: N + 1 = 3 ProfilerSteps (sglang's extra warm-up step),
    no STAGE range (the stage opened before the recorded window, as in sglang's own traces)."""
    (full,) = _traces("cold_warm").itertuples()
    assert (full.role, full.mode, full.steps_recorded) == ("profiled warm", "full_stages", 30)
    t = load_trace(RUN / "cold_warm" / full.file)
    ranges = sorted({e["name"] for e in t["traceEvents"] if str(e.get("name", "")).startswith("STAGE ")})
    assert ranges == [
        "STAGE LatentPreparationStage",
        "STAGE TextEncodingStage",
        "STAGE decoding_stage",
        "STAGE denoising_stage",
    ]
    assert step_ranges(t).empty
    steps = _traces("warmup_shapes")
    assert steps["role"].tolist() == ["profiled first of new shape", "profiled warm"]
    assert steps["mode"].tolist() == ["2_steps"] * 2 and steps["steps_asked"].tolist() == [2, 2]
    assert steps["steps_recorded"].tolist() == [3, 3]
    for f in steps["file"]:
        tr = load_trace(RUN / "warmup_shapes" / f)
        assert step_ranges(tr)["name"].tolist() == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
        assert not any(str(e.get("name", "")).startswith("STAGE ") for e in tr["traceEvents"])


@pytest.fixture(scope="module")
def full_stages():
    return below_stage(ResultBundle.load(RUN / "cold_warm"), top=5)


def test_full_stages_tables_name_every_stage_with_its_kernels(full_stages):
    """Per-stage op table and CPU/idle table of the full_stages warm request: the four stages by
    name, none "(none)", GPU kernels in each (counts exact, device time within 0.1 ms)."""
    (top,) = full_stages.stage_top.values()
    assert sorted(set(top["stage"])) == sorted(STAGES)
    ov = full_stages.overhead["profiled warm"].set_index("stage")
    assert list(ov.index) == [*STAGES, "(all stages)"]
    assert ov["kernels"].to_dict() == {
        "TextEncodingStage": 2520,
        "LatentPreparationStage": 5,
        "DenoisingStage": 20518,
        "DecodingStage": 662,
        "(all stages)": 23705,
    }
    busy = {"TextEncodingStage": 13.48, "DenoisingStage": 675.57, "DecodingStage": 17.50}
    for stage, ms in busy.items():
        assert abs(ov.loc[stage, "device_busy_ms"] - ms) < 0.1, stage
    # the denoising stage's device time: 30 steps of the 22.1 ms per step of the 2_steps traces
    assert abs(ov.loc["DenoisingStage", "device_busy_ms"] / 30 - 22.1) < 0.5
    (ev,) = full_stages.events.values()
    assert "(none)" not in set(ev["stage"])
    k = ev[ev["cat"] == "kernel"]
    assert set(k["stage"]) == set(STAGES)


def test_first_of_new_shape_is_compile_and_runs_the_warm_kernels():
    """The measured first 25-frame request after a 17-frame warmup is 97 % compile (the
    engine's compile records); the profiled one's 3 recorded steps run the same 1,797 kernels
    and 66.4 ms of device time as a warm request (the old layout's 2 steps: 1,198 and 44.0 ms)."""
    cov = json.loads((RUN / "warmup_shapes/results.json").read_text())["coverage"]
    row = next(c for c in cov if (c["warmup_frames"], c["request_frames"]) == (17, 25))
    assert not row["covered"] and row["compiles"] == 1
    assert round(row["penalty_ms"]) == 53401
    assert 0.97 < row["compile_ms"] / row["first_ms"] < 0.98
    assert "expected 1152, actual 1536" in row["recompile_reasons"][0]
    events = [op_events(load_trace(RUN / "warmup_shapes" / f)) for f in _traces("warmup_shapes")["file"]]
    assert all("(none)" not in set(e["stage"]) for e in events)
    kd = op_diff(events[0], events[1:], kernels=True)
    assert kd["count_a"].sum() == kd["count_b"].sum() == 1797
    assert abs(kd["ms_a"].sum() - 66.2) < 0.1 and abs(kd["ms_a"].sum() - kd["ms_b"].sum()) < 0.05
    p = panel(ResultBundle.load(RUN / "warmup_shapes"))
    change = [abs(float(r[p["kernel_diff"].header.index("change (ms)")])) for r in p["kernel_diff"].rows]
    assert max(change) < 0.05


def test_gate_does_not_compare_the_memory_budget_cases_measured_without_compile(tmp_path: Path):
    """The gate on these bundles against baselines/h200.json: the memory_budget cases' baseline
    was measured with torch.compile off (their ``perfkit_engine``, read from the committed
    bundle's records) and these launches compiled, so each of their rows is skipped with that
    reason, none passes or fails; the cold_warm and warmup_shapes rows are compared (none fails)
    and every invariant of a measured investigation passes: PASS."""
    for d in RUN.iterdir():
        (tmp_path / d.name).symlink_to(d)
    p = load_params(ROOT / "params/h200-sglang-traces.yaml")
    res = gate(
        tmp_path,
        engine=p.engine.model_dump(),
        request=p.request.model_dump(),
        baseline_file=ROOT / p.baseline.file,
        profile=p.baseline.profile,
        strict=p.baseline.strict,
        hardware=p.baseline.hardware,
        invariants=p.invariants_all(),
    )
    assert [r for r in res.rows if r.status == "fail"] == []
    budget = [r for r in res.baseline_rows if "_cap-" in r.case]
    ref = json.loads((ROOT / p.baseline.file).read_text())["scenarios"]
    assert {r.case for r in budget} == {c for c in ref if "_cap-" in c} and len(budget) == 2 * 18
    assert {(r.status, r.reason) for r in budget} == {
        ("skipped", "baseline measured with compile off, this run compile on: not compared")
    }
    others = Counter(r.status for r in res.baseline_rows if "_cap-" not in r.case)
    assert others == {"pass": 42, "improved": 6, "skipped": 6, "new": 3}
    inv = {(r.case, r.metric): r.status for r in res.invariant_rows}
    assert {k: v for k, v in inv.items() if v != "pass"} == {
        (k[0], k[1]): "skipped" for k in inv if k[0] in ("offload_modes", "load")
    }
    assert sum(v == "pass" for v in inv.values()) >= 12
    # the committed report says the same
    verdict = json.loads((RUN.parent / "report/baseline_gate/verdict.json").read_text())
    assert verdict["status"] == "pass"
    assert Counter(r["status"] for r in verdict["rows"]) == {
        "pass": 64,
        "improved": 6,
        "skipped": 47,
        "new": 3,
    }
    assert (
        (RUN.parent / "report/summary.md")
        .read_text()
        .startswith("## perfkit: h200-sglang-traces — ✅ PASS (exit 0)")
    )


def _figures(d: Path) -> dict[str, float]:
    cw = json.loads((d / "cold_warm/results.json").read_text())
    req = pd.read_parquet(d / "cold_warm/requests.parquet")
    st = pd.read_parquet(d / "cold_warm/stages.parquet")
    warm = st[st["request_id"].isin(req[req["index"] > 0]["request_id"])].groupby("stage")["ms"].median()
    peak = next(c for c in req.columns if c.startswith("peak_reserved"))
    f = {
        "ready_s": cw["cold_start"]["ready_s"],
        "cold_ms": cw["cold_ms"],
        "warm_median_ms": cw["warm_median_ms"],
        "peak_reserved_mib": float(req[peak].max()),
        **{f"warm {s}": float(warm[s]) for s in STAGES},
    }
    for c in json.loads((d / "warmup_shapes/results.json").read_text())["coverage"]:
        f[f"w{c['warmup_frames']}r{c['request_frames']} first_ms"] = c["first_ms"]
        f[f"w{c['warmup_frames']}r{c['request_frames']} warm_ms"] = c["warm_median_ms"]
    return f


#: new / committed, as examples/h200/sglang-traces/README.md quotes them (3 decimals)
RATIOS = {
    "ready_s": 0.967,
    "cold_ms": 0.811,
    "warm_median_ms": 0.838,
    "peak_reserved_mib": 1.000,
    "warm TextEncodingStage": 0.428,
    "warm LatentPreparationStage": 0.699,
    "warm DenoisingStage": 0.888,
    "warm DecodingStage": 0.784,
    "w17r17 first_ms": 1.275,
    "w17r17 warm_ms": 0.889,
    "w17r25 first_ms": 0.897,
    "w17r25 warm_ms": 0.907,
    "w25r17 first_ms": 0.715,
    "w25r17 warm_ms": 0.871,
    "w25r25 first_ms": 0.953,
    "w25r25 warm_ms": 0.955,
}


def test_figures_against_the_committed_bundles():
    new, old = _figures(RUN), _figures(COMMITTED)
    ratios = {k: new[k] / old[k] for k in RATIOS}
    assert ratios == pytest.approx(RATIOS, abs=5e-4)
    # the occasion's launch spread: CV of the 25-frame warm medians of its three measured
    # launches (cold_warm's, and warmup_shapes' two), 1.5 % here against 6.3 % committed
    for d, cv in ((RUN, 0.015), (COMMITTED, 0.063)):
        f = _figures(d)
        v = np.array([f["warm_median_ms"], f["w17r25 warm_ms"], f["w25r25 warm_ms"]])
        assert math.isclose(v.std(ddof=1) / v.mean(), cv, abs_tol=5e-4), d

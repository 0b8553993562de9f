"""Issue 42, run 2, replayed on the CPU runner: what the H200's first 25-frame request after a
17-frame warmup is made of, from the committed bundle and traces of ``examples/h200/evidence/``
(the numbers its README quotes)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from perfkit.readings.traces import load_trace, op_diff, op_events

BUNDLE = Path(__file__).resolve().parents[1] / "examples/h200/evidence/traces/warmup_shapes"


def test_the_first_request_penalty_is_compilation_not_kernels():
    cov = json.loads((BUNDLE / "results.json").read_text())["coverage"]
    (row,) = cov
    assert (row["warmup_frames"], row["request_frames"], row["covered"]) == (17, 25, False)
    assert round(row["penalty_ms"]) == 85522 and row["penalty_stage"] == "DenoisingStage"
    assert row["compiles"] == 1 and 0.99 < row["compile_ms"] / row["penalty_ms"] < 1.0
    assert "expected 1152, actual 1536" in row["recompile_reasons"][0]
    traces = pd.read_parquet(BUNDLE / "traces.parquet")
    assert traces["role"].tolist() == ["profiled first of new shape", "profiled warm", "profiled warm 2"]
    events = [op_events(load_trace(BUNDLE / f)) for f in traces["file"]]
    kernels = op_diff(events[0], events[1:], kernels=True)
    # the recorded window (2 steps after one warm-up step): the same kernels, the same device time
    assert kernels["count_a"].sum() == kernels["count_b"].sum() == 1198
    assert abs(kernels["ms_a"].sum() - kernels["ms_b"].sum()) < 0.05
    assert kernels["delta_ms"].abs().max() < 0.05

"""'warm <= cold' with a noise margin from the data (issue 17, item 3).

On recorded H200 data (the 1-GPU two-stage session of examples/h200x2, an identical build: same
engine, same shape, one session): its warm median is 2.8 % above the cold request, which the old
margin-free rule failed; judged with its lower bound it is inconclusive (noise could flip it,
not a regression), and the same session with its warm requests
made 30 % slower fails. Live, on the tiny engine: a slowdown injected into the warm requests only
(``debug_stage_delay``, from request 1 on) fails. The live slowdown is 100 %: this 2-core VM's
speed drifts by 15-30 % within a session (docs/choosing-n-m.md), so a live 30 % is not
reliably separable from drift with one cold request — which is the bound doing its job.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.engine.spec import ReferenceEngine
from perfkit.investigations.cold_warm import checks, cold_vs_warm

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage")
SHAPE = {"num_frames": 33, "height": 256, "width": 384, "num_inference_steps": 8}
LIMIT = {"warm_cold_ratio_max": 1.0}


def test_lower_bound_is_below_the_ratio_and_tracks_the_spread():
    rng = np.random.default_rng(1)
    warm = 100 * (1 + 0.05 * rng.standard_normal(8))
    tight = stats.ratio_lower_bound_single_reference(warm, 100.0)
    loose = stats.ratio_lower_bound_single_reference(100 * (1 + 0.20 * rng.standard_normal(8)), 100.0)
    assert 0.85 < tight < np.median(warm) / 100.0
    assert loose < tight
    # warm 30 % slower with 5 % noise: the bound itself says slower
    assert stats.ratio_lower_bound_single_reference(warm * 1.3, 100.0) > 1.1
    assert np.isnan(stats.ratio_lower_bound_single_reference([], 100.0))
    assert np.isnan(stats.ratio_lower_bound_single_reference(warm, 0.0))
    assert stats.ratio_lower_bound_single_reference([120.0], 100.0) == pytest.approx(1.2)


def test_check_without_recorded_bound_is_judged_on_the_value():
    (row,) = checks({"warm_cold_ratio": 1.05, "cold_ms": 100, "warm_median_ms": 105}, LIMIT)
    assert row.status == "fail" and row.lower is None and "no lower bound recorded" in row.reason


def _session(scale_warm: float = 1.0) -> dict:
    """The recorded H200 session's ratio and bound, its warm requests scaled by ``scale_warm``."""
    b = ResultBundle.load(ROOT / "examples/h200x2/bundles-1gpu/cold_warm")
    req = b.requests[b.requests["index"] >= 0].sort_values("index")
    cold = float(req["e2e_ms"].iloc[0])
    warm = req["e2e_ms"].iloc[1:].to_numpy(float) * scale_warm
    return {
        "warm_cold_ratio": float(np.median(warm)) / cold,
        "warm_cold_ratio_lower95": stats.ratio_lower_bound_single_reference(warm, cold),
    }


def test_identical_build_on_an_h200_is_inconclusive_with_its_bound_and_failed_without():
    r = _session()
    assert r["warm_cold_ratio"] == pytest.approx(1.028, abs=0.001)  # warm 2.8 % above cold
    (row,) = checks(r, LIMIT)
    # over the limit, its lower bound under it: noise could flip it, neither pass nor regression
    assert row.status == "inconclusive" and "lower bound 0.93" in row.reason, row.reason
    assert row.lower == pytest.approx(0.935, abs=0.01)
    (old,) = checks({"warm_cold_ratio": r["warm_cold_ratio"]}, LIMIT)  # the margin-free rule
    assert old.status == "fail"


def test_thirty_percent_warm_slowdown_on_the_same_session_fails():
    r = _session(scale_warm=1.3)
    (row,) = checks(r, LIMIT)
    assert row.status == "fail", row.reason
    assert r["warm_cold_ratio_lower95"] > 1.15


@pytest.mark.slow
@pytest.mark.timing
def test_live_warm_only_slowdown_fails(tmp_path):
    spec = ReferenceEngine(
        preset="tiny",
        device="cpu",
        dtype="float32",
        warmup_frames=33,
        height=256,
        width=384,
        debug_stage_delay={s: 100 for s in STAGES},
        debug_stage_delay_from=1,
    )
    b = cold_vs_warm(spec, SHAPE, repeats=6, run_dir=tmp_path)
    (row,) = checks(b.results, LIMIT)
    # the engine's records say the warm requests did twice the work, the cold one none extra
    recs = {r.request_id: r for lines in b.records.values() for r in _records(lines)}
    ok = b.requests[b.requests["index"] >= 0].sort_values("index")
    applied = [recs[i].perfkit.get("debug_stage_delay_applied") for i in ok["request_id"]]
    assert applied[0] is False and all(applied[1:]), applied
    assert row.status == "fail", row.reason
    assert b.results["warm_cold_ratio_lower95"] > 1.0 and "lower bound" in row.reason


def _records(lines):
    from perfkit.readings.records import parse_lines

    return parse_lines(lines).records

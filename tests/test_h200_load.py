"""Issue 42, run 3, replayed on the CPU runner: the H200 load bundle of ``examples/h200/load/``
recomputed from its per-request rows gives the recorded levels and the same checks (the
numbers its README quotes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from floats import close as _close
from perfkit.bundle import ResultBundle
from perfkit.investigations import load as L
from perfkit.investigations.registry import merged_invariants

BUNDLE = Path(__file__).resolve().parents[1] / "examples/h200/load/bundles/load"
#: the keys the open loop's row gained or changed after the H200 run (three-way queue verdict,
#: drawn rate; capacity from delivered throughput since issue 51: 1.197/s, recorded 1.2195/s from
#: the median service time)
NEW_OPEN_LOOP_KEYS = {"queue_verdict", "arrival_rate_rps", "host_rss_peak_mib", "capacity_rps"}
#: the keys a level's row gained after it: the RSS series of the growth (b8ef2cc), the noise of
#: throughput and service time against the first level (issue 51)
NEW_LEVEL_KEYS = {"host_rss_peak_mib", "service_ratio", "service_ratio_ci", "throughput_ratio_ci"}


def test_h200_load_replays_to_its_levels_and_checks():
    b = ResultBundle.load(BUNDLE)
    again = L.summarise(b.results, b.memory)
    levels = json.loads(json.dumps(again["levels"]))
    # host_rss_peak_mib is newer than the recording (the growth's RSS series, b8ef2cc)
    # recomputed floats against recorded ones: 1e-9 relative (numpy's summation order follows the
    # CPU's SIMD width: 173.2212655194156 vs 173.22126551941557 on another x86-64 CPU)
    recorded = json.loads(json.dumps(b.results["levels"]))
    assert len(levels) == len(recorded)
    for lv, rec in zip(levels, recorded):
        assert _close({k: v for k, v in lv.items() if k not in NEW_LEVEL_KEYS}, rec)
    assert all(lv["host_rss_peak_mib"] >= lv["host_peak_mib"] for lv in levels)
    assert again["memory_growth_host_source"] == "pss"
    ol = json.loads(json.dumps(again["open_loop"]))
    kept = {k: v for k, v in ol.items() if k not in NEW_OPEN_LOOP_KEYS}
    assert _close(kept, {k: v for k, v in b.results["open_loop"].items() if k not in NEW_OPEN_LOOP_KEYS})
    assert ol["queue_verdict"] == "not shown" and round(ol["arrival_rate_rps"], 2) == 1.6
    inv = merged_invariants(
        {
            "load_queue_model_max_rel_err": 0.25,
            "load_throughput_min_ratio": 0.85,
            "load_memory_growth_max_mib": 256,
        }
    )
    checks = L.checks(b.results, inv)
    for c, c2 in zip(checks, L.checks(again, inv), strict=True):
        assert _close(dataclasses.astuple(c), dataclasses.astuple(c2))
    assert checks and all(c.status == "pass" for c in checks)
    by_k = {lv["concurrency"]: lv for lv in b.results["levels"]}
    # one request at a time: queue wait at k in flight is (k - 1) service times, throughput flat
    assert abs(by_k[4]["queue_wait_steady_ms"] / (3 * by_k[4]["service_ms"]) - 1) < 0.01
    assert 0.99 < by_k[4]["throughput_vpm"] / by_k[1]["throughput_vpm"] < 1.01
    assert round(b.results["memory_growth_mib"], 1) == 0.0

"""The investigations on the real tiny reference engine (CPU, torch.compile with aot_eager)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from perfkit.bundle import WARMUP_INDEX, ResultBundle
from perfkit.checks import check_table, overall_status
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.gate.run import investigation_checks
from perfkit.investigations import registry
from perfkit.investigations.cold_warm import cold_vs_warm
from perfkit.investigations.cold_warm import reading as cold_warm_reading
from perfkit.investigations.memory_budget import find_min_budget, memory_budget
from perfkit.investigations.shape_coverage import ENGINE_LOG, RECORD, coverage_entry, warmed_shapes
from perfkit.investigations.warmup_shapes import warmup_shapes
from perfkit.measuring.launch_rows import LaunchData, record_rows
from perfkit.readings.records import read_perf_log

REQ = {"num_frames": 25, "height": 64, "width": 64, "num_inference_steps": 4}
SPEC = EngineSpec(
    kind="reference", preset="tiny", compile=True, compile_backend="aot_eager", warmup_frames=17
)

# merged over the defaults (registry.merged_invariants); the noise limits of params/ci-cpu.yaml:
# tiny requests on a shared 2-core runner move latency drift and first-request ratios
INVARIANTS = {
    "warm_cold_ratio_max": 1.0,
    "covered_compiles_max": 0,
    "host_anon_slope_mib_per_request_max": 16.0,
    "caps_held": True,
    "latency_drift_max": 3.0,
    "covered_first_request_max_ratio": 3.0,
}


@pytest.fixture(scope="module")
def cold_warm(tmp_path_factory):
    return cold_vs_warm(SPEC, REQ, repeats=5, run_dir=tmp_path_factory.mktemp("cw"))


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    spec = SPEC.replace(compile=False, debug_leak_mib=64)
    # snapshot asked for: on this CPU engine the records and the report say "not available on cpu"
    return cold_vs_warm(spec, REQ, repeats=4, run_dir=tmp_path_factory.mktemp("leak"), snapshot={})


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return warmup_shapes(
        SPEC,
        warmup_frames=[17, 25],
        request_frames=[25],
        repeats=3,
        request=REQ,
        run_dir=tmp_path_factory.mktemp("ws"),
    )


def test_cold_request_is_slower_and_denoising_absorbs_the_penalty(cold_warm):
    r = cold_warm.results
    assert r["completed"] == 5
    assert r["cold_ms"] > r["warm_median_ms"]
    lo, hi = r["cold_warm_ratio_ci"]
    assert lo > 1.0, r
    assert r["penalty_stage"] == "DenoisingStage"
    assert r["penalty_ms"]["DenoisingStage"] > 0
    assert r["cold_compiles"] >= 1 and r["warm_compiles"] == 0
    cs = r["cold_start"]
    assert cs["ready_s"] > 0 and cs["models_loaded_s"] > 0 and cs["warmup_s"] > 0
    assert cs["ready_s"] >= cs["models_loaded_s"]
    # each part from what sglang writes too: the reference engine's [server-load] line, /health
    assert "models_loaded: engine log: [server-load] workers_ready_monotonic_ns" in cs["sources"]
    assert "warmup: /health 503 until 200 (perfkit's poll)" in cs["sources"]
    # the tidy tables: one row per request and warmup; 4 stages each; 4 steps each
    req = cold_warm.requests
    assert sorted(req["index"]) == [-1, 0, 1, 2, 3, 4]
    assert (cold_warm.stages.groupby("request_id").size() == 4).all()
    assert (cold_warm.steps.groupby("request_id").size() >= 2).all()


def test_sampler_timeline_covers_requests_and_records_match(cold_warm):
    mem, req = cold_warm.memory, cold_warm.requests
    measured = req[req["index"] >= 0]
    assert mem["t_s"].min() <= measured["t_start_s"].min()
    assert mem["t_s"].max() >= measured["t_end_s"].max() - 0.2
    assert mem["host_rss_mib"].notna().all()
    # every measured request found its performance.log line by id (no NaN e2e)
    assert measured["e2e_ms"].notna().all()
    assert measured["request_id"].is_unique


def test_normal_engine_passes_leak_checks_and_invariants(cold_warm):
    rows = investigation_checks("cold_warm", cold_warm.results, INVARIANTS)
    table = check_table(rows)
    slope = table[table["metric"] == "host_anon_slope_mib_per_request"].iloc[0]
    assert slope["status"] == "pass" and abs(slope["actual"]) < 16, table
    # a loaded runner may leave a latency ratio inside its noise: inconclusive, never a failure
    assert overall_status(table) in ("pass", "inconclusive"), table
    unsure = table[table["status"] == "inconclusive"]
    assert unsure["reason"].str.contains("noise").all(), unsure.to_dict("records")
    status = dict(zip(table["metric"], table["status"]))
    # the warm request is far faster than the cold one: no load makes that ratio doubtful
    assert status["warm_cold_ratio"] == "pass", table.to_dict("records")
    assert status["latency_drift"] in ("pass", "inconclusive"), table.to_dict("records")
    assert status["device_reserved_slope_mib_per_request"] == "skipped"  # no device memory on CPU


def test_leaking_engine_is_caught(leaky):
    table = check_table(investigation_checks("cold_warm", leaky.results, INVARIANTS))
    slope = table[table["metric"] == "host_anon_slope_mib_per_request"].iloc[0]
    assert slope["status"] == "fail"
    assert 48 <= slope["actual"] <= 80, slope  # 64 MiB kept per request
    assert overall_status(table) == "fail"
    # snapshots were asked for: on CPU the reading says why there are no sites; the host slope's
    # verdict names none (an allocator snapshot covers device memory only)
    assert "allocation sites" not in slope["reason"], slope
    dev = table[table["metric"] == "device_reserved_slope_mib_per_request"].iloc[0]
    assert dev["status"] == "skipped", dev  # no device memory readings on CPU
    assert leaky.results["memory_sites"]["status"] == "not available on cpu"
    assert "**Allocation sites** (allocator snapshots): not available on cpu." in cold_warm_reading(
        leaky.results
    )
    assert leaky.tables["memory_sites"].empty and list(leaky.tables["memory_sites"].columns)[:2] == [
        "launch",
        "kind",
    ]
    recs = [json.loads(ln) for lines in leaky.records.values() for ln in lines]
    snaps = {r["perfkit"].get("request_index"): r["perfkit"].get("memory_snapshot") for r in recs}
    assert snaps[0] == {"request_index": 0, "error": "not available on cpu"}
    assert snaps[3] == {"request_index": 3, "error": "not available on cpu"} and snaps[1] is None


def test_warmup_coverage_matrix(shapes):
    cov = {(c["warmup_frames"], c["request_frames"]): c for c in shapes.results["coverage"]}
    miss, hit = cov[(17, 25)], cov[(25, 25)]
    assert miss["covered"] is False and miss["penalty_ms"] > 0 and miss["compiles"] >= 1
    assert any("size mismatch" in r for r in miss["recompile_reasons"])
    assert miss["penalty_stage"] == "DenoisingStage"
    assert hit["covered"] is True and hit["compiles"] == 0
    # the reference engine writes a performance.log record for its warmup: its latent shape
    assert miss["warmup_source"] == hit["warmup_source"] == "record"
    assert hit["warmup_latent_shape"] == hit["request_latent_shape"]
    assert miss["penalty_ms"] > hit["penalty_ms"]
    # covered shapes gate green; a loaded runner may leave a ratio inside its noise: inconclusive
    table = check_table(investigation_checks("warmup_shapes", shapes.results, INVARIANTS))
    assert overall_status(table) in ("pass", "inconclusive"), table.to_dict("records")
    unsure = table[table["status"] == "inconclusive"]
    assert unsure["reason"].str.contains("noise").all(), unsure.to_dict("records")
    assert (table["status"] == "pass").any() and (table["status"] != "skipped").all(), table


SGLANG = Path(__file__).resolve().parent / "fixtures" / "sglang" / "0.5.23"


def _sglang_launch() -> LaunchData:
    """A launch as measure_launch builds it against real sglang 0.5.23: two request rows from
    real performance.log lines (no warmup record: sglang writes none), the server log with its
    ``server warmup req (96x64x9f, 2/50 steps)`` line as the launch's stdout."""
    recs = read_perf_log(SGLANG / "sana-video" / "performance.log").records
    data = LaunchData(label="L", logs={"L.stdout.log": (SGLANG / "sana-video" / "server.log").read_text()})
    req = VideoRequestSpec(num_frames=9, height=64, width=96)
    for i, rec in enumerate(recs):
        row, st, _ = record_rows("L", rec, i, None, req)
        data.requests.append(row)
        data.stages += st
    return data


def test_warmup_coverage_from_sglangs_log_without_a_warmup_record():
    """No warmup record: the warmed shape is the engine log's (96x64, 9 frames -> 2 latent
    frames); a 9-frame 96x64 request is covered, a 17-frame one (3 latent) and another
    resolution are not; an engine-default resolution is not known (None)."""
    data = _sglang_launch()
    df = pd.DataFrame(data.requests)
    assert df["latent_shape"].isna().all() and not (df["index"] == WARMUP_INDEX).any()
    warmed = warmed_shapes(df, data.logs)
    assert warmed.source == ENGINE_LOG and warmed.latent_shape is None
    ok, stages = df.sort_values("index"), pd.DataFrame(data.stages)
    hit = coverage_entry(data, ok, stages, warmed, 9, 9, 0, 96, 64)
    assert hit["covered"] is True and hit["warmup_source"] == "engine log"
    assert hit["warmed_shapes"] == [{"width": 96, "height": 64, "num_frames": 9, "latent_frames": 2}]
    assert hit["first_ms"] == pytest.approx(2773.4474539993244, abs=1e-9)
    assert coverage_entry(data, ok, stages, warmed, 9, 17, 0, 96, 64)["covered"] is False
    assert coverage_entry(data, ok, stages, warmed, 9, 9, 0, 64, 96)["covered"] is False
    assert coverage_entry(data, ok, stages, warmed, 9, 9, 0, None, None)["covered"] is None
    text = registry.get("warmup_shapes").reading({"coverage": [hit]})
    assert "covered (warmup shape from its engine log)" in text
    # a warmup record, when there is one, decides (the reference engine's), even with the line
    rec = df.iloc[[0]].assign(index=WARMUP_INDEX, latent_shape="128x2x2x3")
    by_rec = warmed_shapes(pd.concat([rec, df]), data.logs)
    assert by_rec.source == RECORD and by_rec.latent_shape == "128x2x2x3"
    assert coverage_entry(data, ok, stages, by_rec, 9, 9, 0, 96, 64)["covered"] is False
    # neither: nothing is covered, and the entry says so
    none = warmed_shapes(df, {"L.stdout.log": ""})
    entry = coverage_entry(data, ok, stages, none, 9, 9, 0, 96, 64)
    assert entry["covered"] is False and entry["warmup_source"] is None


def test_memory_budget_under_host_cap_completes(tmp_path):
    spec = SPEC.replace(compile=False, warmup_frames=0)
    b = memory_budget(
        spec,
        caps=[MemoryCaps(), MemoryCaps(host_gib=6.0)],
        request=REQ,
        repeats=2,
        run_dir=tmp_path,
        snapshot={"max_entries": 1000},
    )
    capped = b.results["caps"][1]
    assert capped["completed"] and capped["cap_held"], capped
    assert capped["enforcement"] in ("cgroup", "watchdog")
    assert capped["host_anon_peak_mib"] > 50
    assert capped["placement"] == "cpu"
    assert b.results["caps"][0]["enforcement"] == "none"
    # snapshots asked for on a CPU engine: each budget says why there are none; the declared
    # table is empty and survives a save and load
    assert [c["memory_sites"]["status"] for c in b.results["caps"]] == ["not available on cpu"] * 2
    text = registry.get("memory_budget").reading(b.results)
    assert text.count("**Allocation sites** (allocator snapshots): not available on cpu.") == 2, text
    back = ResultBundle.load(b.save(tmp_path / "bundle"))
    assert back.tables["memory_sites"].empty and "site" in back.tables["memory_sites"].columns


def test_find_min_budget_says_gpu_only_on_cpu(tmp_path):
    out = find_min_budget(SPEC, REQ, 1, 8, run_dir=tmp_path)
    assert out["min_gib"] is None and "GPU" in out["note"]
    # caps are rounded to 0.01 GiB: a finer resolution would bisect forever (lo 1.0, hi 1.01 -> mid 1.0)
    with pytest.raises(ValueError, match="resolution_gib must be >= 0.01"):
        find_min_budget(SPEC, REQ, 1, 1.01, run_dir=tmp_path, resolution_gib=0.001)
    from perfkit.investigations.memory_budget import MinBudgetParams

    with pytest.raises(ValidationError, match="resolution_gib"):
        MinBudgetParams(lo_gib=1, hi_gib=2, resolution_gib=0.001)


def test_bundles_round_trip(cold_warm, shapes, tmp_path):
    p1 = cold_warm.save(tmp_path / "cw")
    p2 = shapes.save(tmp_path / "ws")
    back = ResultBundle.load(p1)
    assert back.results == json.loads(json.dumps(cold_warm.results, default=str))
    pd.testing.assert_frame_equal(back.requests, cold_warm.requests, check_dtype=False)
    assert back.meta["perfkit_version"] and back.meta["cpu_count"]
    assert "command" in back.launches.columns
    assert ResultBundle.load(p2).investigation == "warmup_shapes"


def test_a_cold_warm_session_serves_warmup_shapes_and_memory_budget(cold_warm, tmp_path):
    """One engine launch serves several investigations when their parameters allow (seed 001)."""

    def shapes(run_dir):
        return warmup_shapes(
            SPEC,
            warmup_frames=[17],
            request_frames=[25],
            repeats=3,
            request=REQ,
            run_dir=run_dir,
            reuse=cold_warm,
        )

    ws = shapes(tmp_path / "ws")
    assert ws.results["reused_launches"] == ["warmup17"]
    assert not (tmp_path / "ws").exists()  # nothing launched
    c = ws.results["coverage"][0]
    assert c["covered"] is False and c["compiles"] >= 1
    assert sorted(ws.requests["index"]) == [-1, 0, 1, 2]
    assert set(ws.requests["launch"]) == {"warmup17"}
    assert ws.launches["reused_from"].iloc[0] == "cold_warm/session"
    # the GPUs a reused launch ran on come with it (as a GPU host records them)
    gpu = [{"index": 1, "uuid": "GPU-16a29f6b-5412-7158-14a5-922c67e47101", "name": "NVIDIA H200"}]
    saved = cold_warm.meta.get("launch_gpus")
    cold_warm.meta["launch_gpus"] = {"session": gpu}
    try:
        again = shapes(tmp_path / "ws2")
    finally:
        cold_warm.meta["launch_gpus"] = saved
    assert again.meta["launch_gpus"] == {"warmup17": gpu}
    mb = memory_budget(
        SPEC, caps=[MemoryCaps()], request=REQ, repeats=2, run_dir=tmp_path / "mb", reuse=cold_warm
    )
    assert mb.results["reused_launches"] == ["cap0"] and mb.results["caps"][0]["completed"]
    # a different request shape cannot reuse it
    other = dict(REQ, num_frames=17)
    assert (
        warmup_shapes(
            SPEC,
            warmup_frames=[17],
            request_frames=[17],
            repeats=2,
            request=other,
            run_dir=tmp_path / "ws2",
            reuse=cold_warm,
        ).results["reused_launches"]
        == []
    )


def test_warmup_shapes_refuses_a_warmup_setting_given_twice():
    """Two launches of one warmup setting got one label (``warmup17``) in the unsplit run."""
    from pydantic import ValidationError

    from perfkit.investigations.warmup_shapes import WarmupShapesParams

    with pytest.raises(ValidationError, match=r"warmup_frames\n.*\[17\] given twice"):
        WarmupShapesParams(warmup_frames=[17, 25, 17])
    assert WarmupShapesParams(warmup_frames=[17, 25]).warmup_frames == [17, 25]

"""Tests for perfkit.gate.baseline against sglang's real RTX 5090 baseline and synthetic bundles."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from perfkit.bundle import ResultBundle
from perfkit.checks import CHECK_COLUMNS, STATUSES, check_table, overall_status
from perfkit.gate import baseline as bl
from perfkit.investigations import registry
from perfkit.report.tables import markdown_table

FIXTURE = Path(__file__).parent / "fixtures" / "perf_baselines_5090.json"


@pytest.fixture
def doc():
    return bl.load_baseline(FIXTURE)


def run_from(doc, *cases):
    """A run identical to the baseline (case entries + top-level VRAM maps)."""
    run = {}
    for case in cases or doc["scenarios"]:
        entry = copy.deepcopy(doc["scenarios"][case])
        for key in bl.TOP_LEVEL_CASE_MAPS:
            if case in doc.get(key, {}):
                entry[key] = doc[key][case]
        run[case] = entry
    return run


def rows_by_metric(rows, case):
    return {r.metric: r for r in rows if r.case == case}


# ---------------------------------------------------------------------------- load / save


def test_fixture_round_trip_equal(doc, tmp_path):
    out = tmp_path / "b.json"
    bl.save_baseline(doc, out)
    assert bl.load_baseline(out) == doc
    assert out.read_bytes() == FIXTURE.read_bytes()  # same layout byte for byte
    assert list(doc["tolerances"]) == ["long_term", "pr_test"]


def test_unknown_keys_survive(doc, tmp_path):
    doc["future_section"] = {"x": [1, 2]}
    doc["scenarios"]["wan2_1_t2v_1.3b"]["notes"] = "flaky decode"
    doc["scenarios"]["wan2_1_t2v_1.3b"]["some_new_metric"] = {"a": 1}
    doc["tolerances"]["nightly"] = {"e2e": 0.5, "brand_new_key": 0.3}
    out = tmp_path / "b.json"
    bl.save_baseline(doc, out)
    assert bl.load_baseline(out) == doc


def test_empty_stage_maps_and_zero_denoise_are_valid():
    text = json.dumps(
        {
            "tolerances": bl.DEFAULT_TOLERANCES,
            "scenarios": {
                "img": {
                    "stages_ms": {},
                    "denoise_step_ms": {},
                    "expected_e2e_ms": 100.0,
                    "expected_avg_denoise_ms": 0.0,
                    "expected_median_denoise_ms": 0.0,
                }
            },
        }
    )
    d = bl.loads_baseline(text)
    rows = bl.compare({"img": d["scenarios"]["img"]}, d)
    assert overall_status(check_table(rows)) == "pass"


def test_an_empty_stage_map_with_nothing_else_compared_is_never_a_pass(tmp_path, capsys):
    """A case whose baseline entry is an empty stages map (and no step, E2E or memory value),
    or whose every value is null, compares nothing: one failing row says so, the verdict is
    fail; ``perfkit compare`` refuses such a baseline file as bad input (exit 2, naming the file
    and the case's key), as it does an all-null one."""
    from perfkit.cli import main

    doc = bl.new_baseline("cpu")
    doc["scenarios"]["performance"] = {"stages_ms": {}, "denoise_step_ms": {}}
    run = {"performance": {"stages_ms": {}, "denoise_step_ms": {}}}
    rows = bl.compare(run, doc)
    why = "nothing compared for this case: its baseline entry holds no metric"
    assert [(r.case, r.metric, r.status, r.reason) for r in rows] == [
        ("performance", "metrics compared", "fail", why)
    ]
    assert overall_status(check_table(rows)) == "fail"
    doc["scenarios"]["performance"] = {"stages_ms": {"DenoisingStage": None}, "expected_e2e_ms": None}
    rows = bl.compare({"performance": {"stages_ms": {}, "expected_e2e_ms": 25.0}}, doc)
    assert [r.status for r in rows] == ["skipped", "skipped", "fail"]
    assert rows[-1].reason == "nothing compared for this case: every metric was skipped"
    # the CLI: a performance.log record with no stage against the empty entry
    doc["scenarios"]["performance"] = {"stages_ms": {}, "denoise_step_ms": {}}
    bpath = tmp_path / "b.json"
    bpath.write_text(json.dumps(doc))  # save_baseline refuses it too
    log = tmp_path / "performance.log"
    record = {"request_id": "r1", "tag": "pipeline_stage_metrics", "stages": [], "steps": []}
    log.write_text(json.dumps({**record, "total_duration_ms": 25.0, "memory_snapshots": {}}) + "\n")
    assert main(["compare", "--run", str(log), "--baseline", str(bpath)]) == 2
    err = capsys.readouterr().err
    assert f"{bpath}: scenarios.performance: no metric (keys: stages_ms, denoise_step_ms)" in err, err


def test_corrupt_json_names_file_and_line(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{\n    "metadata": {},\n    "scenarios": {,}\n}\n')
    with pytest.raises(bl.BaselineError) as ei:
        bl.load_baseline(p)
    msg = str(ei.value)
    assert str(p) in msg and "line 3" in msg and "column" in msg


def test_wrong_shape_names_file_and_key(tmp_path):
    p = tmp_path / "shape.json"
    p.write_text(json.dumps({"scenarios": {"c": {"stages_ms": {"DenoisingStage": "fast"}}}}))
    with pytest.raises(bl.BaselineError, match=r"shape\.json.*scenarios\.c\.stages_ms\.DenoisingStage"):
        bl.load_baseline(p)


# ---------------------------------------------------------------------------- bounds


def test_hand_computed_bounds_pr_test(doc):
    rows = rows_by_metric(bl.compare(run_from(doc), doc, "pr_test"), "wan2_1_t2v_1.3b")
    # DenoisingStage 21452.59: max(21452.59 * 1.25, 21452.59 + 20)
    assert rows["stages_ms.DenoisingStage"].bound == pytest.approx(26815.7375)
    # DecodingStage 495.01: tol max(0.8, 0.9) = 0.9 -> 940.519 < 495.01 + 450
    assert rows["stages_ms.DecodingStage"].bound == pytest.approx(945.01)
    # TextEncodingStage 1025.11: max(1025.11 * 1.8, 1025.11 + 120)
    assert rows["stages_ms.TextEncodingStage"].bound == pytest.approx(1845.198)
    # InputValidationStage 0.09: the 120 ms pad wins
    assert rows["stages_ms.InputValidationStage"].bound == pytest.approx(120.09)
    # step 0 169.02: max(169.02 * 5, 169.02 + 80)
    assert rows["denoise_step_ms.0"].bound == pytest.approx(845.1)
    # step 10 426.11: max(426.11 * 1.3 = 553.943, 426.11 + 160)
    assert rows["denoise_step_ms.10"].bound == pytest.approx(586.11)
    assert rows["expected_e2e_ms"].bound == pytest.approx(23418.73 * 1.25)
    assert rows["expected_median_denoise_ms"].bound == pytest.approx(427.94 * 1.2)
    # VRAM from the top-level maps: 18246 * 1.02, 4934 * 1.01
    assert rows["runtime_peak_vram_mb"].bound == pytest.approx(18610.92)
    assert rows["load_peak_vram_mb"].bound == pytest.approx(4983.34)
    assert all(r.status == "pass" for r in rows.values())


def test_long_term_profile_and_image_step_pad(doc):
    rows = rows_by_metric(bl.compare(run_from(doc), doc, "long_term", video=False), "zimage_image_t2i")
    assert rows["stages_ms.DenoisingStage"].bound == pytest.approx(2178.8 * 1.1)
    # step 2 270.3: max(270.3 * 1.25 = 337.875, 270.3 + 20)
    assert rows["denoise_step_ms.2"].bound == pytest.approx(337.875)


#: The oldest versions of sglang's perf_baselines.json carry one flat tolerance set.
FLAT_TOLERANCES = {"e2e": 0.25, "stage": 0.3, "denoise_step": 0.1, "denoise_agg": 0.1}


@pytest.mark.parametrize("profile", ["pr_test", "long_term"])
def test_flat_legacy_tolerances_are_read_as_sglang_reads_them(doc, profile):
    """A flat set serves every profile (sglang 0.5.23 ``ToleranceConfig.load_profile``); its one
    ``stage`` key bounds denoising and other stages alike (the sglang of those files); VRAM
    tolerances it lacks are sglang's defaults 0.01 / 0.02."""
    doc["tolerances"] = dict(FLAT_TOLERANCES)
    doc = bl.loads_baseline(json.dumps(doc), "flat.json")
    name, tols = bl.tolerance_profile(doc["tolerances"], profile)
    assert name == "legacy/flat" and tols["denoise_stage"] == tols["non_denoise_stage"] == 0.3
    rows = rows_by_metric(bl.compare(run_from(doc), doc, profile), "wan2_1_t2v_1.3b")
    # DenoisingStage 21452.59 * 1.3; TextEncodingStage 1025.11: max(* 1.3 = 1332.643, + 120)
    assert rows["stages_ms.DenoisingStage"].bound == pytest.approx(21452.59 * 1.3)
    assert rows["stages_ms.TextEncodingStage"].bound == pytest.approx(1332.643)
    assert "non_denoise_stage: tol 0.3" in rows["stages_ms.TextEncodingStage"].reason
    # DecodingStage 495.01: tol max(0.3, 0.9) with the 450 ms pad -> 945.01
    assert rows["stages_ms.DecodingStage"].bound == pytest.approx(945.01)
    # step 10 426.11: max(426.11 * 1.1 = 468.721, 426.11 + 160)
    assert rows["denoise_step_ms.10"].bound == pytest.approx(586.11)
    assert rows["expected_e2e_ms"].bound == pytest.approx(23418.73 * 1.25)
    assert rows["expected_median_denoise_ms"].bound == pytest.approx(427.94 * 1.1)
    assert rows["runtime_peak_vram_mb"].bound == pytest.approx(18246 * 1.02)
    assert {r.status for r in rows.values()} == {"pass"}


def test_flat_tolerances_with_both_stage_keys_and_a_bad_flat_value(doc):
    """The later flat form names both stage keys (sglang 0.5.23 reads it as is); a flat value
    that is not a number is refused naming the file and key."""
    flat = {
        "e2e": 0.2,
        "denoise_stage": 0.1,
        "non_denoise_stage": 0.5,
        "denoise_step": 0.2,
        "denoise_agg": 0.1,
    }
    name, tols = bl.tolerance_profile(flat, "nightly")
    assert (name, tols["denoise_stage"], tols["non_denoise_stage"]) == ("legacy/flat", 0.1, 0.5)
    doc["tolerances"] = {**FLAT_TOLERANCES, "stage": "0.3"}
    with pytest.raises(
        bl.BaselineError, match=r"flat\.json: tolerances\.stage: '0\.3' \(str\) is not a number"
    ):
        bl.loads_baseline(json.dumps(doc), "flat.json")
    doc["tolerances"] = {**FLAT_TOLERANCES, "pr_test": {"e2e": 0.25}}
    with pytest.raises(bl.BaselineError, match=r"tolerances\.pr_test: an object among flat tolerances"):
        bl.loads_baseline(json.dumps(doc), "flat.json")


def test_unknown_profile_raises(doc):
    with pytest.raises(KeyError, match="nightly"):
        bl.compare(run_from(doc), doc, "nightly")


def test_identical_run_passes_all(doc):
    df = check_table(bl.compare(run_from(doc), doc))
    assert set(df["status"]) == {"pass"}
    assert overall_status(df) == "pass"


# ---------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("factor,status", [(1.30, "fail"), (1.05, "pass")])
def test_denoising_stage_slower(doc, factor, status):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["stages_ms"]["DenoisingStage"] *= factor
    rows = bl.compare(run, doc, "pr_test")
    r = rows_by_metric(rows, "wan2_1_t2v_1.3b")["stages_ms.DenoisingStage"]
    assert r.status == status
    assert overall_status(check_table(rows)) == status


def test_vram_three_percent_over_fails(doc):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["runtime_peak_vram_mb"] = 18246.0 * 1.03
    r = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")["runtime_peak_vram_mb"]
    assert r.status == "fail" and "bound" in r.reason


def test_missing_metric_fails_with_reason(doc):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    del run["wan2_1_t2v_1.3b"]["stages_ms"]["DecodingStage"]
    del run["wan2_1_t2v_1.3b"]["expected_e2e_ms"]
    rows = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")
    for m in ("stages_ms.DecodingStage", "expected_e2e_ms"):
        assert rows[m].status == "fail"
        assert rows[m].actual is None
        assert "missing" in rows[m].reason


def test_new_case_and_strict(doc):
    run = {"ltx_video_t2v": {"stages_ms": {"DenoisingStage": 1.0}, "expected_e2e_ms": 2.0}}
    df = check_table(bl.compare(run, doc))
    assert list(df["status"]) == ["new"]
    assert overall_status(df) == "pass"
    df = check_table(bl.compare(run, doc, strict=True))
    assert list(df["status"]) == ["fail"]
    assert overall_status(df) == "fail"


def test_new_metric_in_known_case(doc):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["stages_ms"]["UpsampleStage"] = 10.0
    rows = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")
    assert rows["stages_ms.UpsampleStage"].status == "new"


def test_improvement_hint_with_snippet(doc):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["stages_ms"]["DenoisingStage"] = 15000.0
    run["wan2_1_t2v_1.3b"]["denoise_step_ms"]["10"] = 300.0
    rows = bl.compare(run, doc)
    by = rows_by_metric(rows, "wan2_1_t2v_1.3b")
    r = by["stages_ms.DenoisingStage"]
    assert r.status == "improved"
    assert r.snippet == {"stages_ms": {"DenoisingStage": 15000.0}}
    assert '{"stages_ms": {"DenoisingStage": 15000.0}}' in r.reason
    assert by["denoise_step_ms.10"].status == "improved"
    assert overall_status(check_table(rows)) == "pass"
    # the threshold's source is on the row: the baseline's, or sglang's 0.2 when it gives none
    assert (
        f"(improvement threshold {doc['improvement_reporting']['threshold']:g}, the baseline's)" in r.reason
    )
    doc.pop("improvement_reporting")
    r = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")["stages_ms.DenoisingStage"]
    assert (
        r.status == "improved"
        and "(improvement threshold 0.2, sglang's default: the baseline gives none)" in r.reason
    )


def test_optional_load_tolerance(doc):
    doc["scenarios"]["wan2_1_t2v_1.3b"]["expected_load_ms"] = 60000.0
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["expected_load_ms"] = 90000.0
    r = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")["expected_load_ms"]
    assert r.status == "skipped"
    doc["tolerances"]["pr_test"]["load"] = 0.3
    r = rows_by_metric(bl.compare(run, doc), "wan2_1_t2v_1.3b")["expected_load_ms"]
    assert r.status == "fail" and r.bound == pytest.approx(78000.0)


def test_stage_class_hook():
    assert bl.classify_stage("LTX2AVDenoisingStage") == "denoise"
    assert bl.classify_stage("LTX2AVDecodingStage") == "decoding"
    assert bl.classify_stage("LingBotVideoTextEncodingStage") == "non_denoise"
    d = bl.new_baseline("x")
    d["scenarios"]["c"] = {"stages_ms": {"LTX2AVDenoisingStage": 1000.0, "MyVAE": 100.0}}
    run = {"c": {"stages_ms": {"LTX2AVDenoisingStage": 1000.0, "MyVAE": 100.0}}}
    rows = rows_by_metric(bl.compare(run, d), "c")
    assert rows["stages_ms.LTX2AVDenoisingStage"].bound == pytest.approx(1250.0)
    assert rows["stages_ms.MyVAE"].bound == pytest.approx(220.0)  # non-denoise: +120 ms
    rows = rows_by_metric(bl.compare(run, d, stage_classes={"MyVAE": "decoding"}), "c")
    assert rows["stages_ms.MyVAE"].bound == pytest.approx(550.0)  # decoding: +450 ms


# ---------------------------------------------------------------------------- tables


def test_verdict_table_and_markdown(doc):
    run = run_from(doc, "wan2_1_t2v_1.3b")
    run["wan2_1_t2v_1.3b"]["stages_ms"]["DenoisingStage"] *= 1.3
    df = check_table(bl.compare(run, doc))
    assert list(df.columns) == CHECK_COLUMNS
    assert set(df["status"]) <= set(STATUSES)
    md = markdown_table(df, checks=True)
    lines = md.strip().splitlines()
    assert lines[0].startswith("| case") and "status" in lines[0]
    assert set(lines[1].replace("|", "").replace(":", "")) <= {"-", " "}
    assert len(lines) == len(df) + 2
    assert any("stages_ms.DenoisingStage" in ln and "fail" in ln for ln in lines)
    assert overall_status(check_table([])) == "pass"


# ---------------------------------------------------------------------------- from_bundle


def synthetic_bundle(commit="abc1234"):
    """One launch, a startup warmup, 3 measured requests (the 2nd is the slowest) and a failed one."""
    reqs, stages, steps = [], [], []
    specs = [  # (index, kind, status, e2e, denoise ms per step, decode ms, reserved, allocated)
        (-1, "warmup", "completed", 9000.0, [500.0] * 4, 900.0, 9000.0, 8000.0),
        (0, "cold", "completed", 1500.0, [300.0, 100.0, 100.0, 100.0], 200.0, 5000.0, 4000.0),
        (1, "warm", "completed", 1700.0, [200.0, 150.0, 140.0, 130.0], 250.0, 5100.0, 4100.0),
        (2, "warm", "completed", 1400.0, [180.0, 90.0, 95.0, 100.0], 210.0, 5050.0, 4200.0),
        (3, "warm", "failed", 99999.0, [999.0] * 4, 999.0, 99999.0, 99999.0),
    ]
    for i, (idx, _kind, status, e2e, st, dec, res, alloc) in enumerate(specs):
        rid = f"r{i}"
        t0 = 1000.0 + 10 * i
        reqs.append(
            dict(
                launch="L0",
                request_id=rid,
                index=idx,
                status=status,
                e2e_ms=e2e,
                client_ms=e2e + 5,
                peak_reserved_mib=res,
                peak_allocated_mib=alloc,
                t_start_s=t0,
                t_end_s=t0 + e2e / 1000,
            )
        )
        stages.append(dict(launch="L0", request_id=rid, index=idx, stage="TextEncodingStage", ms=50.0 + i))
        stages.append(dict(launch="L0", request_id=rid, index=idx, stage="DenoisingStage", ms=sum(st)))
        stages.append(dict(launch="L0", request_id=rid, index=idx, stage="DecodingStage", ms=dec))
        for s, ms in enumerate(st):
            steps.append(dict(launch="L0", request_id=rid, index=idx, stage="DenoisingStage", step=s, ms=ms))
    launches = pd.DataFrame(
        [dict(launch="L0", label="cold", ready_s=42.5, load_peak_mib=3000.0, warmup_peak_mib=6000.0)]
    )
    return ResultBundle(
        investigation="cold_warm",
        meta={"git_commit": commit},
        tables={
            "requests": pd.DataFrame(reqs),
            "stages": pd.DataFrame(stages),
            "steps": pd.DataFrame(steps),
            "launches": launches,
        },
    )


def test_from_bundle_keeps_worst():
    e = bl.from_bundle(synthetic_bundle(), "ltx_t2v")
    # stage worst over the 3 measured requests (warmup r0 and failed r4 excluded)
    assert e["stages_ms"] == {"TextEncodingStage": 53.0, "DenoisingStage": 620.0, "DecodingStage": 250.0}
    # 4 steps, fractions 0..1 by 0.2 -> indices round(f * 3) = 0, 1, 2, 3
    assert e["denoise_step_ms"] == {"0": 300.0, "1": 150.0, "2": 140.0, "3": 130.0}
    assert e["expected_e2e_ms"] == 1700.0
    assert e["expected_avg_denoise_ms"] == 155.0  # r2: mean(200, 150, 140, 130)
    assert e["expected_median_denoise_ms"] == 145.0  # r2: median
    assert e["expected_load_ms"] == 42500.0
    assert e["load_peak_vram_mb"] == 3000.0
    assert e["warmup_peak_vram_mb"] == 6000.0
    assert e["runtime_peak_vram_mb"] == 5100.0
    assert e["runtime_peak_allocated_mb"] == 4200.0
    # ready 42.5 s + first measured start (1010) to last end (1030 + 1.4)
    assert e["estimated_full_test_time_s"] == pytest.approx(63.9)


def test_from_bundle_without_e2e_takes_the_clients_time_and_says_so(caplog):
    """Found by the breaker: with requests.e2e_ms null the entry's expected_e2e_ms came from
    client_ms with no word. The value is the client's worst, and a warning names the column."""
    b = synthetic_bundle()
    b.tables["requests"]["e2e_ms"] = float("nan")
    with caplog.at_level("WARNING", logger="perfkit.gate.baseline.derive"):
        e = bl.from_bundle(b, "c")
    client = b.measured_requests()["client_ms"].max()
    assert e["expected_e2e_ms"] == pytest.approx(client, abs=0.01)
    assert "requests.e2e_ms not reported for case 'c'" in caplog.text and "client_ms" in caplog.text


def test_from_bundle_step_fractions_and_launch_filter():
    b = synthetic_bundle()
    e = bl.from_bundle(b, "c", step_fractions=[0.0, 1.0])
    assert list(e["denoise_step_ms"]) == ["0", "3"]
    with pytest.raises(ValueError, match="no completed"):
        bl.from_bundle(b, "c", launch="L9")
    assert bl.from_bundle(b, "c", launch="L0") == bl.from_bundle(b, "c")


def test_from_bundle_without_steps_gives_zero_denoise():
    b = synthetic_bundle()
    b.tables["steps"] = pd.DataFrame()
    e = bl.from_bundle(b, "c")
    assert e["denoise_step_ms"] == {}
    assert e["expected_avg_denoise_ms"] == 0.0 and e["expected_median_denoise_ms"] == 0.0


def test_baseline_from_bundles_compares_clean():
    b = synthetic_bundle()
    d = bl.baseline_from_bundles({"ltx_t2v": b}, hardware="H200")
    assert d["tolerances"] == bl.DEFAULT_TOLERANCES
    assert d["metadata"]["hardware"] == "H200" and "abc1234" in d["metadata"]["description"]
    run = {"ltx_t2v": bl.from_bundle(b, "ltx_t2v")}
    df = check_table(bl.compare(run, d))
    assert overall_status(df) == "pass"
    # tolerances copied from sglang's file
    assert bl.DEFAULT_TOLERANCES == bl.load_baseline(FIXTURE)["tolerances"]


# ---------------------------------------------------------------------------- update


def test_update_creates_and_keeps_other_cases(tmp_path):
    bdir = synthetic_bundle().save(tmp_path / "bundle")
    target = tmp_path / "baselines" / "h200.json"
    d = bl.update_baseline(bdir, target, "ltx_t2v", hardware="H200")
    assert target.exists()
    loaded = bl.load_baseline(target)
    assert loaded == d
    assert loaded["tolerances"] == bl.DEFAULT_TOLERANCES
    assert loaded["metadata"]["hardware"] == "H200"
    assert loaded["metadata"]["last_updated"] == dt.date.today().isoformat()
    assert "abc1234" in loaded["metadata"]["description"]
    assert loaded["scenarios"]["ltx_t2v"]["expected_e2e_ms"] == 1700.0

    # update into the real sglang file: other cases, unknown keys and notes survive
    real = tmp_path / "5090.json"
    real.write_bytes(FIXTURE.read_bytes())
    doc = bl.load_baseline(real)
    doc["scenarios"]["wan2_1_t2v_1.3b"]["notes"] = "keep me"
    bl.save_baseline(doc, real)
    bl.update_baseline(bdir, real, "wan2_1_t2v_1.3b")
    after = bl.load_baseline(real)
    assert after["scenarios"]["zimage_image_t2i"] == doc["scenarios"]["zimage_image_t2i"]
    assert after["scenarios"]["wan2_1_t2v_1.3b"]["notes"] == "keep me"
    assert after["scenarios"]["wan2_1_t2v_1.3b"]["expected_e2e_ms"] == 1700.0
    assert after["runtime_peak_vram_mb"]["wan2_1_t2v_1.3b"] == 5100.0  # top-level map kept in step
    assert after["metadata"]["hardware"] == "CI RTX 5090 pool"
    assert after["metadata"]["model"] == "Diffusion Server"


def test_interrupted_update_leaves_old_file(tmp_path, monkeypatch):
    bdir = synthetic_bundle().save(tmp_path / "bundle")
    target = tmp_path / "base" / "5090.json"
    target.parent.mkdir()
    target.write_bytes(FIXTURE.read_bytes())
    before = target.read_bytes()

    def boom(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="power cut"):
        bl.update_baseline(bdir, target, "wan2_1_t2v_1.3b")
    assert target.read_bytes() == before
    assert os.listdir(target.parent) == ["5090.json"]


# ---------------------------------------------------------------------------- invariants

GOOD = {
    "cold_warm": {
        "cold_ms": 2000.0,
        "warm_median_ms": 1500.0,
        "warm_cold_ratio": 0.75,
        "warm_cold_ratio_ci": [0.7, 0.8],
        "penalty_ms": {"DenoisingStage": 400.0},
        "penalty_stage": "DenoisingStage",
        "leak_checks": [
            {"name": "host_anon_slope_mib_per_request", "value": 2.0, "threshold": 16.0, "passed": True},
            {
                "name": "device_reserved_slope_mib_per_request",
                "value": 0.0,
                "threshold": 16.0,
                "passed": True,
            },
            {"name": "latency_drift", "value": 0.02, "threshold": 0.25, "passed": True},
        ],
    },
    "warmup_shapes": {
        "coverage": [
            {
                "warmup_frames": 17,
                "request_frames": 17,
                "covered": True,
                "first_ms": 1600.0,
                "warm_median_ms": 1500.0,
                "penalty_ms": 100.0,
                "ratio": 1.07,
                "ratio_ci": [1.0, 1.1],
                "compiles": 0,
                "penalty_stage": None,
            },
            {
                "warmup_frames": 17,
                "request_frames": 25,
                "covered": False,
                "first_ms": 9000.0,
                "warm_median_ms": 1800.0,
                "penalty_ms": 7200.0,
                "ratio": 5.0,
                "ratio_ci": [4.5, 5.5],
                "compiles": 3,
                "penalty_stage": "DenoisingStage",
            },
        ]
    },
    "memory_budget": {
        "caps": [
            {
                "label": "12g+32g",
                "device_cap_gib": 12.0,
                "host_cap_gib": 32.0,
                "completed": True,
                "cap_held": True,
                "enforcement": "torch_fraction",
                "peak_reserved_mib": 11000.0,
                "host_anon_peak_mib": 20000.0,
                "placement": "cpu_offload",
                "warm_degrades": False,
            }
        ]
    },
}


def test_invariants_pass():
    rows = registry.checks_for(GOOD, registry.invariant_defaults())
    df = check_table(rows)
    assert overall_status(df) == "pass", df.to_string()
    assert set(df[df["case"].isin(GOOD)]["status"]) == {"pass"}
    # investigations without results are skipped (not measured), never passed
    assert set(df[~df["case"].isin(GOOD)]["status"]) <= {"skipped"}
    # the uncovered 17->25 shape is not gated; the covered one is, twice (ratio, compiles)
    assert len(df[df["case"] == "warmup_shapes"]) == 2
    assert len(df[df["case"] == "cold_warm"]) == 4


def test_invariants_fail():
    bad = copy.deepcopy(GOOD)
    bad["cold_warm"]["warm_cold_ratio"] = 1.3
    bad["cold_warm"]["leak_checks"][0]["value"] = 40.0
    bad["warmup_shapes"]["coverage"][0].update(first_ms=4500.0, ratio=3.0, compiles=2)
    bad["memory_budget"]["caps"][0]["cap_held"] = False
    df = check_table(registry.checks_for(bad, {**registry.invariant_defaults(), "warm_cold_ratio_min": 0.5}))
    failed = set(df.loc[df["status"] == "fail", "metric"])
    assert failed == {
        "warm_cold_ratio",
        "host_anon_slope_mib_per_request",
        "covered_first_request_ratio[warmup=17f,request=17f]",
        "covered_compiles[warmup=17f,request=17f]",
        "cap_held[12g+32g]",
    }
    assert overall_status(df) == "fail"
    mn = df[df["metric"] == "warm_cold_ratio_min"].iloc[0]
    assert mn["status"] == "pass"


def test_invariants_absent_are_skipped():
    df = check_table(
        registry.checks_for({"cold_warm": {"cold_ms": 1.0}}, {**registry.invariant_defaults(), "bogus": 1})
    )
    assert set(df["status"]) == {"skipped"}
    assert overall_status(df) == "skipped"  # nothing measured is never a pass
    assert (df["reason"].str.contains("not measured") | (df["metric"] == "bogus")).all()


def test_invariant_ratio_computed_when_absent():
    res = {"cold_warm": {"cold_ms": 1000.0, "warm_median_ms": 1200.0}}
    df = check_table(registry.checks_for(res, {"warm_cold_ratio_max": 1.0}))
    assert df.iloc[0]["status"] == "fail" and df.iloc[0]["actual"] == pytest.approx(1.2)


def test_notes_only_baseline_case_is_not_a_hollow_pass(doc):
    """A case present in the run and in the baseline must compare something: a baseline entry
    holding only notes fails, naming the case (issue 17: no hollow pass)."""
    case = "wan2_1_t2v_1.3b"
    run = run_from(doc, case)
    notes_only = copy.deepcopy(doc)
    notes_only["scenarios"][case] = {"notes": "to be measured"}
    for key in bl.TOP_LEVEL_CASE_MAPS:  # the 5090 file also keys VRAM peaks by case at top level
        (notes_only.get(key) or {}).pop(case, None)
    df = check_table(bl.compare(run, notes_only))
    fails = df[df["status"] == "fail"]
    assert list(fails["case"]) == [case] and list(fails["metric"]) == ["metrics compared"]
    assert "holds no metric" in fails["reason"].iloc[0]
    assert overall_status(df) == "fail"

"""Not reported is not 0: an sglang-like engine (the stand-in engine, tests/fake_engine.py, whose
records carry no ``perfkit`` block, as sglang's do not) run through cold_warm gives NA compile
columns, None compile counts in the results, skipped compile checks and "not reported" in the
notebook tables, the summary and the report section; the reference engine's block is read
exactly, 0 included, and a bad value in it is refused naming file, line and key."""

from __future__ import annotations

import importlib
import json
import sys

import pandas as pd
import pytest

import fake_engine
from perfkit.bundle import WARMUP_INDEX
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.gate.run import engine_checks
from perfkit.investigations.shape_coverage import RECORD, Warmed, coverage_entry
from perfkit.measuring.launch_rows import record_rows
from perfkit.readings.records import PerfRecord, RecordError, parse_lines
from perfkit.report.render import render_section
from perfkit.report.tables import first_request_costs, request_frame

# the modules (the package's names of these are their entry functions)
cold_warm = importlib.import_module("perfkit.investigations.cold_warm")
warmup_shapes = importlib.import_module("perfkit.investigations.warmup_shapes")

REQ = VideoRequestSpec(num_frames=9, height=64, width=64, num_inference_steps=2)


@pytest.fixture(scope="module")
def sglang_like(tmp_path_factory):
    """cold_warm (3 requests) against the stand-in engine logging sglang's ServerArgs line
    (compile on) and writing sglang's records: (run dir, bundle)."""
    run = tmp_path_factory.mktemp("notreported")
    spec = EngineSpec(
        kind="command",
        command_template=fake_engine.command("--mode", "serve", "--sglang-server-args"),
        startup_timeout_s=30,
    )
    b = cold_warm.cold_vs_warm(spec, REQ, repeats=3, run_dir=run / "work", sample_interval_s=0.5)
    b.save(run / "cold_warm")
    return run, b


def test_requests_table_holds_na_not_zero(sglang_like):
    _, b = sglang_like
    req = b.requests
    assert len(req) == 4 and (req["index"] == WARMUP_INDEX).sum() == 1  # sglang-like warmup line kept
    assert (req["status"][req["index"] >= 0] == "completed").all()
    for col in ("compiles", "compile_ms", "recompile_reasons", "recompile_limit_hit", "host_rss_mib"):
        assert req[col].isna().all(), (col, list(req[col]))
    assert str(req["compiles"].dtype) == "Int64" and str(req["recompile_limit_hit"].dtype) == "boolean"
    assert (req["e2e_ms"][req["index"] >= 0] > 0).all()  # what sglang does report is there


def test_cold_warm_results_and_text_say_not_reported(sglang_like):
    _, b = sglang_like
    r = b.results
    assert "cold_compiles" in r and r["cold_compiles"] is None and r["warm_compiles"] is None
    assert r["cold_ms"] > 0 and r["warm_median_ms"] > 0
    rows = dict(cold_warm.summary_table(r).itertuples(index=False))
    assert rows["compiles: cold request"] == rows["compiles: warm requests"] == "not reported"
    text = cold_warm.reading(r)
    assert "**Compiles**: not reported" in text and "0 compiles" not in text
    # notebook tables: "not reported" in every compile cell, never 0
    frame = request_frame(b.requests)
    assert list(frame["compiles"]) == ["not reported"] * 4
    assert list(frame["compiling (ms)"]) == ["not reported"] * 4
    first = first_request_costs(b.requests, b.stages)
    assert len(first) == 1 and first["compiles"].iloc[0] == "not reported"


def test_compile_checks_are_skipped_not_passed(sglang_like):
    _, b = sglang_like
    ln = b.launches.iloc[0]
    assert ln["compile_active"] and ln["config_source"] == "engine log (server_args JSON)"
    rows = {c.metric: c for c in engine_checks({"cold_warm": b}, {})}
    lim = rows["recompile_limit[session]"]
    assert lim.status == "skipped" and lim.actual is None and "reported no recompile-limit flag" in lim.reason


def test_report_section_says_not_reported(sglang_like):
    run, _ = sglang_like
    html = render_section(run, {"name": "cold_warm", "status": "ok"})
    panel = html[html.index('class="rootcause"') :]
    assert "Compile counts not reported: the engine&#39;s records carry none (sglang&#39;s do not)" in panel
    assert "No request compiled" not in panel


def test_covered_shape_without_counts_is_not_measured(tmp_path):
    """warmup_shapes' coverage entry from a real launch of the sglang-like engine: compiles None,
    and the covered-compiles check is skipped with the reason, never "0 <= 0"."""
    from perfkit.measuring.launch_rows import measure_launch

    spec = EngineSpec(
        kind="command", command_template=fake_engine.command("--mode", "serve"), startup_timeout_s=30
    )
    data = measure_launch(spec, [REQ] * 2, tmp_path, "L", sample_interval_s=0.5)
    ok = data.sent_rows()
    entry = coverage_entry(data, ok, pd.DataFrame(data.stages), Warmed(RECORD, "1x4x2x8x8"), 9, 9, 0)
    assert entry["first_ms"] > 0
    assert entry["compiles"] is None and entry["first_compiles"] is None and entry["compile_ms"] is None
    assert entry["recompile_limit_hit"] is None and entry["recompile_reasons"] is None
    entry["covered"] = True  # as if the warmup's latent shape had matched
    (chk,) = warmup_shapes.checks({"coverage": [entry]}, {"covered_compiles_max": 0})
    assert chk.status == "skipped" and "reported no compile counts" in chk.reason
    assert "compiles not reported" in warmup_shapes.reading({"coverage": [entry]})


def _ref_record(**pk) -> dict:
    return {
        "request_id": "r1",
        "stages": [{"name": "DenoisingStage", "execution_time_ms": 5.0}],
        "steps": [2.5, 2.5],
        "total_duration_ms": 6.0,
        "perfkit": pk,
    }


def test_reference_block_read_exactly_zero_included():
    rec = PerfRecord.from_dict(
        _ref_record(
            compiles=0,
            compile_ms=0.0,
            recompile_reasons=[],
            recompile_limit_hit=False,
            host_rss_mib=0.0,
            host_anon_mib=812.5,
        )
    )
    row, _, _ = record_rows("L", rec, 0, None)
    assert row["compiles"] == 0 and row["compile_ms"] == 0.0 and row["recompile_limit_hit"] is False
    assert row["recompile_reasons"] == "" and row["host_rss_mib"] == 0.0 and row["host_anon_mib"] == 812.5
    rec = PerfRecord.from_dict(_ref_record(compiles=2, compile_ms=1234.5, recompile_reasons=["a", "b"]))
    row, _, _ = record_rows("L", rec, 0, None)
    assert (row["compiles"], row["compile_ms"], row["recompile_reasons"]) == (2, 1234.5, "a; b")
    assert row["recompile_limit_hit"] is None  # a key the block leaves out: not reported


@pytest.mark.parametrize(
    "key, value",
    [
        ("compiles", "2"),
        ("compiles", 1.5),
        ("compiles", True),
        ("compile_ms", -1.0),
        ("host_rss_mib", "12"),
        ("recompile_limit_hit", 0),
        ("recompile_reasons", "size mismatch"),
    ],
)
def test_bad_reference_value_is_refused_naming_file_line_and_key(key, value):
    line = json.dumps(_ref_record(**{key: value})) + "\n"
    with pytest.raises(RecordError) as exc:
        parse_lines([line], source="perf/performance.log", strict=True)
    assert exc.value.key == f"perfkit.{key}" and exc.value.line == 1
    assert "perf/performance.log" in str(exc.value) and f"perfkit.{key}" in str(exc.value)


@pytest.mark.parametrize(
    "value, key",
    [
        ([1500.0], "perfkit.compile_phases_ms"),
        ("bytecode_tracing", "perfkit.compile_phases_ms"),
        (0, "perfkit.compile_phases_ms"),
        ({"bytecode_tracing": "1500"}, "perfkit.compile_phases_ms.bytecode_tracing"),
        ({"bytecode_tracing": -1500.0}, "perfkit.compile_phases_ms.bytecode_tracing"),
        ({"bytecode_tracing": float("nan")}, "perfkit.compile_phases_ms.bytecode_tracing"),
        ({"bytecode_tracing": float("inf")}, "perfkit.compile_phases_ms.bytecode_tracing"),
        ({"bytecode_tracing": True}, "perfkit.compile_phases_ms.bytecode_tracing"),
        ({"bytecode_tracing": None}, "perfkit.compile_phases_ms.bytecode_tracing"),
    ],
)
def test_bad_compile_phase_times_are_refused_naming_the_phase(value, key):
    """Found probing: compile_phases_ms went into the requests table unchecked, so the
    recompilations table read "1500" as 1.50 s, true as 0.00 s, and showed -1.50 s, nan s, inf s."""
    line = json.dumps(_ref_record(compiles=1, compile_ms=2000.0, compile_phases_ms=value)) + "\n"
    with pytest.raises(RecordError) as exc:
        parse_lines([line], source="perf/performance.log", strict=True)
    assert exc.value.key == key and exc.value.line == 1 and "perf/performance.log" in str(exc.value)


def test_compile_phase_times_read_exactly_a_renamed_phase_kept():
    phases = {"bytecode_tracing": 1500.0, "async_compile.wait_v2": 0}
    rec = PerfRecord.from_dict(_ref_record(compiles=1, compile_ms=2000.0, compile_phases_ms=phases))
    row, _, _ = record_rows("L", rec, 0, None)
    assert json.loads(row["compile_phases"]) == phases
    rec = PerfRecord.from_dict(_ref_record(compiles=1, compile_ms=2000.0, compile_phases_ms=None))
    assert record_rows("L", rec, 0, None)[0]["compile_phases"] is None  # not reported


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

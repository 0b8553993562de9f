"""Several traces read at once (perfkit.readings.traces.read_many): the process pool gives what
reading them one by one gives, in order, with unreadable files as named errors."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pandas as pd
import pytest

from perfkit.readings import traces as tr
from perfkit.readings.traces import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "examples/h200/evidence/ab-2pct-profiled/a/traces").glob("*.trace.json.gz"))[:2]


def test_the_pool_reads_what_one_by_one_reads_in_order_with_bad_files_named(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad-rank0.trace.json.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    paths = [TRACES[0], tmp_path / "missing.trace.json.gz", bad, TRACES[1]]
    alone = [tr.read_one(p) for p in paths]
    monkeypatch.setattr(tr, "PARALLEL_MIN_BYTES", 1)
    with caplog.at_level(logging.DEBUG, logger=tr.__name__):
        pooled = tr.read_many(paths)
    if tr._cores() > 1:
        assert "reading 4 traces" in caplog.text and "in 2 processes" in caplog.text, caplog.text
    assert [x.error is None for x in pooled] == [True, False, False, True]
    assert "missing.trace.json.gz" in pooled[1].error and str(bad) in pooled[2].error
    for x, y in zip(pooled, alone):
        assert x.error == y.error
        if x.error is None:
            assert len(x.events) > 1000 and (x.events["cat"] == "kernel").any()  # an H200 trace
            pd.testing.assert_frame_equal(x.events, y.events)
            pd.testing.assert_frame_equal(x.overhead, y.overhead)


def _events(**second) -> str:
    ok = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10, "pid": 1, "tid": 1}
    return json.dumps({"traceEvents": [ok, {**ok, "ts": 20, **second}]})


@pytest.mark.parametrize(
    "text,why",
    [
        # found by a breaker: a RecursionError naming no file; dur 1e308 read as 1e305 ms; a
        # null name read as the op "None" (an absent one as "")
        (
            '{"traceEvents": ' + "[" * 200_000 + "]" * 200_000 + "}",
            r"not a readable Chrome trace: .*recursion",
        ),
        (_events(dur=1e308), r"traceEvents\[1\] \('aten::mm'\): dur 1e\+308 is not a number from 0 to 1 day"),
        (_events(dur=-1), r"traceEvents\[1\] \('aten::mm'\): dur -1 is not a number from 0 to 1 day"),
        (_events(name=None), r"traceEvents\[1\] \('None'\): name None is not a string"),
        (_events(name=7), r"traceEvents\[1\] \('7'\): name 7 is not a string"),
    ],
)
def test_a_hostile_trace_is_refused_naming_the_file_and_event(tmp_path, text, why):
    p = tmp_path / "x-global-rank0.trace.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=rf"^{re.escape(str(p))}: {why}"):
        load_trace(p)
    assert "x-global-rank0.trace.json" in tr.read_one(p).error


def test_a_gzip_that_expands_past_the_bound_is_refused_before_parsing(tmp_path, monkeypatch):
    """Found by the breaker: valid JSON padded with 2 GB of spaces (8.7 MB of gzip) was read
    whole (4 GB of memory). Reading stops at the bound; the refusal names the file."""
    import gzip

    monkeypatch.setattr(tr, "MAX_TRACE_BYTES", 2**20)
    p = tmp_path / "x-global-rank0.trace.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (2 * 2**20) + b"]}"))
    with pytest.raises(TraceError, match=rf"^{re.escape(str(p))}: over 1 MiB of JSON \(uncompressed\)"):
        load_trace(p)
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (2**19) + b"]}"))  # below it: read
    assert load_trace(p)["traceEvents"] == []


# -- real sglang 0.5.23 traces (tests/fixtures/sglang/0.5.23/sana-video/README.md) ----------------
SANA = ROOT / "tests/fixtures/sglang/0.5.23/sana-video"
FULL = SANA / "b06968f7-ad51-4834-8bb7-b28dad06c9b8-full_stages-global-rank0.trace.json.gz"
TWO = SANA / "5b66f84e-7660-43c7-93ad-b5c181d9a95a-2_steps-global-rank0.trace.json.gz"


def _perf_stages(request_id: str) -> tuple[list[str], list[float]]:
    from perfkit.readings.records import parse_lines

    rec = next(
        r
        for r in parse_lines((SANA / "performance.log").read_text().splitlines()).records
        if r.request_id == request_id
    )
    return [n for n, _ in rec.stages], [float(s) for s in rec.steps]


def test_a_real_full_stages_trace_names_every_stage_and_no_range_is_an_op():
    from perfkit.readings import traces as tr

    doc = tr.load_trace(FULL)
    ev = tr.op_events(doc)
    # registered names mapped from composed_pipeline_base.py; prompt_encoding_stage_primary is
    # pipeline-specific (SanaVideoTextEncodingStage here): as written without performance.log
    assert set(ev["stage"]) == {
        "prompt_encoding_stage_primary",
        "TimestepPreparationStage",
        "LatentPreparationStage",
        "DenoisingStage",
        "DecodingStage",
    }
    assert (ev["step"] == -1).all() and not ev["warmup_step"].any() and len(ev) == 15621  # every cpu_op
    assert not ev["op"].str.startswith(("STAGE ", "ProfilerStep#")).any()
    stages, _ = _perf_stages("b06968f7-ad51-4834-8bb7-b28dad06c9b8")
    named = tr.op_events(doc, stages)
    top = tr.stage_top_ops(named, 3)
    assert "(none)" not in set(named["stage"]) and "SanaVideoTextEncodingStage" in set(top["stage"])
    assert not top["op"].str.startswith("STAGE ").any()
    # overhead windows are the STAGE ranges: DenoisingStage 384.457 ms in the trace, 383.9 in
    # performance.log (sglang's own timer around the same stage; 1 ms apart)
    o = tr.overhead_table(doc, tr.rank_of(FULL.name), stages).set_index("stage")
    assert list(o.index) == [*stages, "(all stages)"]
    assert o.loc["DenoisingStage", "window_ms"] == pytest.approx(384.457355, abs=1e-6)
    assert o.loc["DecodingStage", "window_ms"] == pytest.approx(785.615059, abs=1e-6)
    assert (o.loc["DenoisingStage", "op_ms"] > 0) and o["device_idle_share"].isna().all()


def test_a_real_2_steps_trace_has_n_plus_1_steps_the_first_flagged_warm_up():
    from perfkit.readings import traces as tr

    doc = tr.load_trace(TWO)
    steps = tr.step_ranges(doc)
    # 2 asked, 3 recorded: ProfilerStep#k is denoising step k (step 0 is torch's warm-up)
    assert list(steps["name"]) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert list(steps["step"]) == [1, 2, 3] and list(steps["warmup_step"]) == [True, False, False]
    assert not steps["tail"].any()
    _, perf_steps = _perf_stages("5b66f84e-7660-43c7-93ad-b5c181d9a95a")
    # ProfilerStep#1 is performance.log's steps[1] (42.17 ms; sglang's timer sits inside it)
    assert steps["dur_ms"].iloc[0] == pytest.approx(perf_steps[1], abs=0.1)
    ev = tr.op_events(doc)
    assert set(ev["stage"]) == {"DenoisingStage"} and set(ev["step"]) == {1, 2, 3} and len(ev) == 9030
    assert set(ev.loc[ev["warmup_step"], "step"]) == {1}
    assert not ev["op"].str.startswith(("STAGE ", "ProfilerStep#")).any()
    t = tr.op_table(ev[~ev["warmup_step"]], by_stage=True)
    assert set(t["stage"]) == {"DenoisingStage"} and t["share"].sum() == pytest.approx(1.0)
    o = tr.overhead_table(doc).set_index("stage")
    assert o.loc["DenoisingStage", "window_ms"] == pytest.approx(steps["dur_ms"].sum(), rel=1e-9)


def test_the_trace_list_says_why_one_more_step_was_recorded():
    from perfkit.report.belowstage import steps_text

    assert steps_text(2, 3, "2_steps").startswith("3 (2 asked + 1: sglang adds its warm-up step")
    assert steps_text(6, 6, "6_steps").startswith("6 of 6 asked + 1 (the request ran out of steps")
    assert steps_text(pd.NA, 6, "full_stages") == "6 (every denoising step; no step ranges)"
    assert steps_text(pd.NA, 2, "2_steps") == "2"  # an older bundle: asked not recorded


def test_a_real_sglang_trace_without_a_perfkit_record_gets_mode_and_steps_from_its_file():
    from perfkit.measuring.profiled import _steps_of

    # a real sglang server writes no perfkit record: mode from the name, steps from the file
    assert _steps_of(TWO, None, None) == {"mode": "2_steps", "steps_asked": 2, "steps_recorded": 3}
    assert _steps_of(FULL, None, None) == {"mode": "full_stages", "steps_asked": None, "steps_recorded": None}
    assert _steps_of(TWO, "2_steps", 3)["steps_recorded"] == 3  # the engine's record wins


LTX2 = Path(__file__).parent / "fixtures" / "sglang" / "0.5.23" / "ltx-2"


def test_real_ltx2_traces_name_class_stages_and_one_asked_step_plus_sglangs_warm_up():
    from perfkit.readings import traces as tr
    from perfkit.readings.records import parse_lines

    recs = {r.request_id: r for r in parse_lines((LTX2 / "performance.log").read_text().splitlines()).records}
    full = next(LTX2.glob("*-full_stages-*.trace.json.gz"))
    one = next(LTX2.glob("*-1_steps-*.trace.json.gz"))
    # LTX-2 names its ranges STAGE <class name>: as written even without performance.log
    stages = [n for n, _ in recs[full.name.split("-full_stages")[0]].stages]
    ev = tr.op_events(tr.load_trace(full))
    assert "(none)" not in set(ev["stage"]) and {"LTX2AVDenoisingStage", "LTX2AVDecodingStage"} <= set(
        ev["stage"]
    )
    o = tr.overhead_table(tr.load_trace(full), 0, stages)
    assert list(o["stage"]) == [*stages, "(all stages)"] and len(stages) == 9
    # 1 asked, 2 recorded; with the record's stages the steps belong to LTX2AVDenoisingStage
    doc = tr.load_trace(one)
    steps = tr.step_ranges(doc)
    assert list(steps["step"]) == [1, 2] and list(steps["warmup_step"]) == [True, False]
    named = tr.op_events(doc, [n for n, _ in recs[one.name.split("-1_steps")[0]].stages])
    assert set(named["stage"]) == {"LTX2AVDenoisingStage"} and set(named["step"]) == {1, 2}

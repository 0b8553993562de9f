"""perfkit's readers on files real sglang 0.5.23 wrote on a CPU (tests/fixtures/sglang/0.5.23/).

Recorded by deploy/sglang/record.py (each folder's README.md gives the command, date and CPU):
LTX-2 on sglang's native LTX2Pipeline, and LTX-Video 0.9 on ``--backend diffusers``. The
expected values are the recorded ones, read by eye from the files; times compare exactly (the
readers copy the JSON floats) or, across files, within 1e-9 relative.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from perfkit.readings.perfdump import read_perf_dump
from perfkit.readings.records import read_perf_log

FIX = Path(__file__).parent / "fixtures" / "sglang" / "0.5.23"
LTX2 = FIX / "ltx-2"
LTXV = FIX / "ltx-video-diffusers"

#: LTX2Pipeline's stages, in the order performance.log lists them (class names, not registered ones)
LTX2_STAGES = [
    "InputValidationStage",
    "TextEncodingStage",
    "LTX2TextConnectorStage",
    "LTX2SigmaPreparationStage",
    "TimestepPreparationStage",
    "LTX2AVLatentPreparationStage",
    "LTX2ImageEncodingStage",
    "LTX2AVDenoisingStage",
    "LTX2AVDecodingStage",
]


def _jobs(folder: Path) -> list[dict]:
    return json.loads((folder / "jobs.json").read_text())


def test_ltx2_performance_log_reads_every_request_with_its_stages_and_steps():
    rep = read_perf_log(LTX2 / "performance.log", strict=True)
    assert rep.skipped == [] and rep.rejected == {}
    jobs = _jobs(LTX2)
    # one line per request, none for the server warmup; the ids are the job ids, in order
    assert [r.request_id for r in rep.records] == [j["post"]["id"] for j in jobs]
    assert [len(r.steps) for r in rep.records] == [3, 3, 3, 2]
    first = rep.records[0]
    assert first.request_id == "06d3f025-fc63-4e52-99c0-c0ffec645190"
    assert first.tag == "pipeline_stage_metrics"
    assert first.commit_hash == "177036886756942ed5e632fa50a65fb4fc59ddd1"
    assert [n for n, _ in first.stages] == LTX2_STAGES
    assert first.total_duration_ms == 704.5045829991068
    assert first.stage_ms()["TextEncodingStage"] == 384.28206000025966
    assert first.stage_ms()["LTX2AVDenoisingStage"] == 179.55249799979356
    assert first.steps[0] == 44.45775099975435
    assert first.memory_snapshots == {}  # no CUDA: sglang writes an empty map
    assert not first.is_warmup
    # the steps lie inside the denoising stage; the stages inside the request
    for r in rep.records:
        assert sum(r.steps) <= r.stage_ms()["LTX2AVDenoisingStage"]
        assert sum(ms for _, ms in r.stages) <= r.total_duration_ms
    # the job's inference_time_s is the record's total, in seconds
    for r, j in zip(rep.records, jobs, strict=True):
        assert math.isclose(j["final"]["inference_time_s"] * 1e3, r.total_duration_ms, rel_tol=1e-9)


def test_ltx2_perf_dump_is_the_first_requests_record():
    dump = read_perf_dump(LTX2 / "perf_dump.json")
    rec = read_perf_log(LTX2 / "performance.log", strict=True).records[0]
    assert dump.tag == "server_perf_dump" and dump.layout == "with_denoise_steps"
    assert dump.request_id == rec.request_id == _jobs(LTX2)[0]["post"]["id"]
    assert dump.stages == rec.stages
    assert dump.denoise_steps == rec.steps
    assert dump.total_duration_ms == 704.5045829991068
    assert dump.memory_checkpoints == {}
    assert dump.meta["model"].endswith("/tiny-ltx-2")


def test_ltx2_profiler_traces_are_named_by_request_and_hold_what_was_asked():
    jobs = _jobs(LTX2)
    steps_rid, stages_rid = jobs[2]["post"]["id"], jobs[3]["post"]["id"]
    n_steps = json.loads(gzip.open(LTX2 / f"{steps_rid}-1_steps-global-rank0.trace.json.gz").read())
    names = {e.get("name") for e in n_steps["traceEvents"]}
    # num_profiled_timesteps=1 records 2 profiler steps (active + warm-up), no stage ranges
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= names and "ProfilerStep#3" not in names
    assert not any(str(n).startswith("STAGE ") for n in names)
    full = json.loads(gzip.open(LTX2 / f"{stages_rid}-full_stages-global-rank0.trace.json.gz").read())
    stage_ranges = [e["name"] for e in full["traceEvents"] if str(e.get("name", "")).startswith("STAGE ")]
    assert stage_ranges == [f"STAGE {s}" for s in LTX2_STAGES]


def test_ltx_video_diffusers_backend_is_one_stage_without_steps():
    rep = read_perf_log(LTXV / "performance.log", strict=True)
    jobs = _jobs(LTXV)
    assert [r.request_id for r in rep.records] == [j["post"]["id"] for j in jobs]
    assert [r.stages for r in rep.records] == [
        [("DiffusersExecutionStage", 358.0000990004919)],
        [("DiffusersExecutionStage", 30.679546000101254)],
    ]
    assert [r.steps for r in rep.records] == [[], []]
    assert [r.total_duration_ms for r in rep.records] == [359.2061980007202, 31.426352000380575]
    dump = read_perf_dump(LTXV / "perf_dump.json")
    assert dump.request_id == rep.records[0].request_id
    assert dump.stages == rep.records[0].stages and dump.denoise_steps == []
    assert dump.meta["model"].endswith("/tiny-ltx-video")

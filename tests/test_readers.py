"""Readers never invent a number: performance.log records, sglang perf dumps, baseline files.

Property tests (hypothesis): valid random records read back exactly; corrupted ones give the exact
value or an error naming the key, never a default. Plus the real sglang files in
tests/fixtures/sglang/ (see its README.md).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inprocess_cli
from perfkit.gate import baseline as bl
from perfkit.readings import perfdump
from perfkit.readings.records import PerfRecord, RecordError, parse_lines, read_perf_log

FIX = Path(__file__).parent / "fixtures" / "sglang"
H100 = FIX / "perf_baselines_h100_excerpt.json"
B5090 = Path(__file__).parent / "fixtures" / "perf_baselines_5090.json"
DUMP_V1 = FIX / "perf_dump_stages_only.json"
DUMP_V2 = FIX / "perf_dump_with_denoise_steps.json"
REPO = Path(__file__).resolve().parents[1]

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------

ms = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False) | st.integers(
    min_value=0, max_value=10**7
)
ms_or_null = ms | st.none()
names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20)
snapshot = st.fixed_dictionaries(
    {"allocated_mb": ms, "reserved_mb": ms, "peak_allocated_mb": ms, "peak_reserved_mb": ms}
)


@st.composite
def log_records(draw):
    """A performance.log object as sglang's log_request_summary writes it (plus nulls)."""
    key = draw(st.sampled_from(["execution_time_ms", "duration_ms"]))
    stages = [{"name": n, key: v} for n, v in draw(st.lists(st.tuples(names, ms_or_null), max_size=8))]
    as_objects = draw(st.booleans())
    raw_steps = draw(st.lists(ms_or_null, max_size=12))
    steps = [{"step": i, "duration_ms": v} for i, v in enumerate(raw_steps)] if as_objects else raw_steps
    obj = {
        "request_id": draw(st.uuids()).hex,
        "timestamp": "2026-01-01T00:00:00+00:00",
        "commit_hash": draw(st.sampled_from(["N/A", "abc123", None])),
        "tag": "pipeline_stage_metrics",
        "stages": stages,
        "steps": steps,
        "total_duration_ms": draw(ms_or_null),
    }
    if draw(st.booleans()):
        obj["memory_snapshots"] = draw(
            st.dictionaries(st.sampled_from(["load_peak", "warmup_peak", "runtime_peak"]), snapshot)
        )
    return obj, key, raw_steps


@st.composite
def dumps(draw):
    """A perf dump as dump_benchmark_report writes it, either layout."""
    stages = draw(st.lists(st.tuples(names, ms_or_null), max_size=8))
    obj = {
        "timestamp": "2026-01-01T00:00:00+00:00",
        "request_id": draw(st.uuids()).hex,
        "commit_hash": "N/A",
        "tag": "benchmark_dump",
        "total_duration_ms": draw(ms_or_null),
        "steps": [{"name": n, "duration_ms": v} for n, v in stages],
    }
    raw_steps = None
    if draw(st.booleans()):
        raw_steps = draw(st.lists(ms_or_null, max_size=12))
        obj["denoise_steps_ms"] = [{"step": i, "duration_ms": v} for i, v in enumerate(raw_steps)]
        obj["memory_checkpoints"] = {f"after_{n}": draw(snapshot) for n, _ in stages[:3]}
    obj["meta"] = {}
    return obj, stages, raw_steps


def _f(v):
    return None if v is None else float(v)


BAD_VALUES = [
    ("number as string", "12.5"),
    ("NaN", float("nan")),
    ("infinity", float("inf")),
    ("negative", -1.0),
    ("bool", True),
    ("list", [1.0]),
    ("object", {"ms": 1.0}),
]

# ---------------------------------------------------------------------------------------------
# performance.log
# ---------------------------------------------------------------------------------------------


@PROPS
@given(log_records())
def test_log_line_reads_back_exactly(case):
    obj, key, raw_steps = case
    line = json.dumps(obj) + "\n"
    rep = parse_lines([line], strict=True)
    (rec,) = rep.records
    assert rec.request_id == obj["request_id"]
    assert rec.stages == [(s["name"], _f(s[key])) for s in obj["stages"]]
    assert rec.steps == [_f(v) for v in raw_steps]
    assert rec.total_duration_ms == _f(obj["total_duration_ms"])
    assert rec.memory_snapshots == {
        cp: {k: float(v) for k, v in snap.items()} for cp, snap in (obj.get("memory_snapshots") or {}).items()
    }


def _corrupt(obj, draw):
    """(corrupted object, key path the error must name, or None when the value stays readable)."""
    obj = copy.deepcopy(obj)
    choices = ["drop_top", "bad_total"]
    if obj["stages"]:
        choices += ["rename_stage_key", "drop_stage_key", "bad_stage"]
    if obj["steps"]:
        choices += ["bad_step"]
    what = draw(st.sampled_from(choices))
    if what == "drop_top":
        k = draw(st.sampled_from(["request_id", "stages", "steps", "total_duration_ms"]))
        del obj[k]
        return obj, k
    if what == "bad_total":
        _, v = draw(st.sampled_from(BAD_VALUES))
        obj["total_duration_ms"] = v
        return obj, "total_duration_ms"
    i = draw(st.integers(0, len(obj["stages"]) - 1)) if obj["stages"] else 0
    if what == "rename_stage_key":
        st_ = obj["stages"][i]
        k = "execution_time_ms" if "execution_time_ms" in st_ else "duration_ms"
        st_["time_ms"] = st_.pop(k)
        return obj, "time_ms"  # the message names the key that was found instead
    if what == "drop_stage_key":
        st_ = obj["stages"][i]
        st_.pop("execution_time_ms", None)
        st_.pop("duration_ms", None)
        return obj, f"stages[{i}].execution_time_ms"
    if what == "bad_stage":
        st_ = obj["stages"][i]
        k = "execution_time_ms" if "execution_time_ms" in st_ else "duration_ms"
        _, st_[k] = draw(st.sampled_from(BAD_VALUES))
        return obj, f"stages[{i}].{k}"
    j = draw(st.integers(0, len(obj["steps"]) - 1))
    _, bad = draw(st.sampled_from(BAD_VALUES))
    if isinstance(obj["steps"][j], dict):
        obj["steps"][j]["duration_ms"] = bad
        return obj, f"steps[{j}].duration_ms"
    obj["steps"][j] = bad
    return obj, f"steps[{j}]"


@PROPS
@given(log_records(), st.data())
def test_log_line_corrupted_names_the_key(case, data):
    obj, _, _ = case
    bad, key = _corrupt(obj, data.draw)
    with pytest.raises(RecordError) as ei:
        parse_lines([json.dumps(bad) + "\n"], source="perf/performance.log", strict=True)
    msg = str(ei.value)
    assert key in msg and "perf/performance.log:1" in msg
    # not strict: the line is skipped with the same reason, never read with a default
    rep = parse_lines(["\n", json.dumps(bad) + "\n"], source="performance.log")
    assert rep.records == [] and rep.skipped and rep.skipped[0][0] == 2 and key in rep.skipped[0][1]


@PROPS
@given(log_records(), st.data())
def test_log_truncated_line(case, data):
    obj, _, _ = case
    text = json.dumps(obj)
    cut = data.draw(st.integers(1, len(text) - 1))
    lines = [text[:cut] + "\n", json.dumps(obj) + "\n"]
    with pytest.raises(RecordError, match="performance.log:1"):
        parse_lines(lines, source="performance.log", strict=True)
    # an unterminated last line is still being written: skipped silently, nothing invented
    rep = parse_lines([json.dumps(obj) + "\n", text[:cut]])
    assert len(rep.records) == 1 and rep.skipped == []


def test_log_duration_ms_stage_keys_read_right_values(tmp_path):
    """Stage entries named as in sglang's perf dump (duration_ms) were read as 0.0 before."""
    line = {
        "request_id": "r1",
        "timestamp": None,
        "commit_hash": "N/A",
        "tag": "pipeline_stage_metrics",
        "stages": [
            {"name": "TextEncodingStage", "duration_ms": 252.98},
            {"name": "DenoisingStage", "duration_ms": 5229.75},
        ],
        "steps": [{"step": 0, "duration_ms": 286.89}, {"step": 1, "duration_ms": 167.02}],
        "total_duration_ms": 5600.5,
    }
    (tmp_path / "performance.log").write_text(json.dumps(line) + "\n")
    rep = read_perf_log(tmp_path, strict=True)
    (rec,) = rep.records
    assert rec.stage_ms() == {"TextEncodingStage": 252.98, "DenoisingStage": 5229.75}
    assert rec.steps == [286.89, 167.02] and rec.total_duration_ms == 5600.5


def test_log_unknown_time_key_and_ambiguous_keys():
    base = {"request_id": "r", "steps": [], "total_duration_ms": 1.0}
    with pytest.raises(RecordError, match=r"elapsed_ms"):
        PerfRecord.from_dict({**base, "stages": [{"name": "S", "elapsed_ms": 3.0}]})
    with pytest.raises(RecordError, match="both"):
        PerfRecord.from_dict(
            {**base, "stages": [{"name": "S", "duration_ms": 3.0, "execution_time_ms": 3.0}]}
        )
    with pytest.raises(RecordError, match=r"steps\[1\]\.step"):
        PerfRecord.from_dict(
            {**base, "stages": [], "steps": [{"step": 0, "duration_ms": 1}, {"step": 5, "duration_ms": 1}]}
        )


# ---------------------------------------------------------------------------------------------
# perf dumps
# ---------------------------------------------------------------------------------------------


@PROPS
@given(dumps())
def test_dump_reads_back_exactly(case):
    obj, stages, raw_steps = case
    d = perfdump.loads_perf_dump(json.dumps(obj, indent=2), "x.json")
    assert d.stages == [(n, _f(v)) for n, v in stages]
    assert d.total_duration_ms == _f(obj["total_duration_ms"])
    if raw_steps is None:
        assert d.denoise_steps is None and d.memory_checkpoints is None and d.layout == "stages_only"
    else:
        assert d.denoise_steps == [_f(v) for v in raw_steps]
        assert d.memory_checkpoints == {
            k: {kk: float(vv) for kk, vv in v.items()} for k, v in obj["memory_checkpoints"].items()
        }
    assert d.steps == (d.denoise_steps or [])  # the dump read as a record (PerfDump is one)


@PROPS
@given(dumps(), st.data())
def test_dump_corrupted_names_the_key(case, data):
    obj, stages, raw_steps = case
    bad = copy.deepcopy(obj)
    choices = ["drop", "total"] + (["stage", "rename"] if stages else []) + (["step"] if raw_steps else [])
    what = data.draw(st.sampled_from(choices))
    if what == "drop":
        key = data.draw(st.sampled_from(list(perfdump.REQUIRED_KEYS)))
        del bad[key]
    elif what == "total":
        _, bad["total_duration_ms"] = data.draw(st.sampled_from(BAD_VALUES))
        key = "total_duration_ms"
    elif what == "stage":
        i = data.draw(st.integers(0, len(stages) - 1))
        _, bad["steps"][i]["duration_ms"] = data.draw(st.sampled_from(BAD_VALUES))
        key = f"steps[{i}].duration_ms"
    elif what == "rename":
        i = data.draw(st.integers(0, len(stages) - 1))
        bad["steps"][i]["ms"] = bad["steps"][i].pop("duration_ms")
        key = "ms"
    else:
        j = data.draw(st.integers(0, len(raw_steps) - 1))
        _, bad["denoise_steps_ms"][j]["duration_ms"] = data.draw(st.sampled_from(BAD_VALUES))
        key = f"denoise_steps_ms[{j}].duration_ms"
    with pytest.raises(RecordError) as ei:
        perfdump.loads_perf_dump(json.dumps(bad), "dumps/after.json")
    assert key in str(ei.value) and "dumps/after.json" in str(ei.value)


def test_dump_truncated_file_names_the_file():
    text = DUMP_V2.read_text()
    with pytest.raises(RecordError, match=r"half\.json.*invalid JSON"):
        perfdump.loads_perf_dump(text[: len(text) // 2], "half.json")


def test_real_layout_dumps_load():
    v1, v2 = perfdump.read_perf_dump(DUMP_V1), perfdump.read_perf_dump(DUMP_V2)
    assert v1.layout == "stages_only" and v1.denoise_steps is None and v1.commit_hash == "N/A"
    assert v2.layout == "with_denoise_steps" and len(v2.denoise_steps) == 6
    assert v1.stage_ms()["DenoisingStage"] == 5229.75 == v2.stage_ms()["DenoisingStage"]
    assert v2.denoise_steps[2] == 1010.47
    assert v2.memory_checkpoints["after_DenoisingStage"]["peak_reserved_mb"] == 35926.0
    assert v2.total_duration_ms == 8400.19


def test_dump_comparison_rules():
    d = perfdump.read_perf_dump(DUMP_V2)
    c = perfdump.compare_dumps(d, d)
    assert c.verdict == "pass" and c.e2e.status == "similar"
    loop = [r for r in c.stages if r.name == perfdump.DENOISING_LOOP]
    assert loop and loop[0].before == pytest.approx(sum(d.denoise_steps)) and loop[0].steps == (6, 6)
    md = perfdump.dump_comparison_markdown(c)
    assert "Denoising Loop (6 steps)" in md and "E2E Latency" in md
    nulls = copy.deepcopy(d)
    nulls.total_duration_ms = None
    nulls.stages = [(n, None) for n, _ in d.stages]
    nulls.denoise_steps = None
    c = perfdump.compare_dumps(nulls, nulls)
    assert c.verdict == "error" and "–" in perfdump.dump_comparison_markdown(c)
    # a breaker's dump: a stage name and a commit hash with markup; a `|` split the table row and
    # a backtick closed the code span, making an <img onerror> live
    evil = copy.deepcopy(d)
    evil.stages = [("<script>alert(1)</script>`x`|y", ms) for _, ms in d.stages[:1]] + d.stages[1:]
    evil.commit_hash = "`</details><img src=x onerror=alert(1)>"
    md = perfdump.dump_comparison_markdown(perfdump.compare_dumps(d, evil))
    assert "<script" not in md and "<img" not in md and "&lt;script&gt;" in md
    row = next(ln for ln in md.splitlines() if "script" in ln)
    assert row.count("|") == 7 and "&#124;" in row, row  # six cells, the name's | escaped


# ---------------------------------------------------------------------------------------------
# baseline files
# ---------------------------------------------------------------------------------------------


@st.composite
def baselines(draw):
    doc = bl.new_baseline("H100")
    doc["metadata"]["last_updated"] = "2026-01-01"
    for _ in range(draw(st.integers(0, 4))):
        case = draw(names)
        entry = {
            "stages_ms": draw(st.dictionaries(names, ms_or_null, max_size=6)),
            "denoise_step_ms": {str(i): v for i, v in enumerate(draw(st.lists(ms, max_size=6)))},
            "expected_e2e_ms": draw(ms),
            "expected_avg_denoise_ms": draw(ms_or_null),
            "expected_median_denoise_ms": draw(ms),
        }
        if draw(st.booleans()):
            entry["runtime_peak_vram_mb"] = draw(ms_or_null)
        doc["scenarios"][case] = entry
    return doc


@PROPS
@given(baselines())
def test_baseline_reads_back_exactly(doc):
    text = bl.dumps_baseline(doc)
    back = bl.loads_baseline(text, "b.json")
    assert back == doc and bl.dumps_baseline(back) == text
    rows = bl.compare(back["scenarios"], back)
    assert all(r.status in ("pass", "skipped") for r in rows)
    for r in rows:
        if r.status == "skipped" and r.expected is None and r.metric != "*":
            assert "not measured in the baseline" in r.reason


@PROPS
@given(baselines().filter(lambda d: any(e["stages_ms"] for e in d["scenarios"].values())), st.data())
def test_baseline_corrupted_names_case_and_key(doc, data):
    case = data.draw(st.sampled_from([c for c, e in doc["scenarios"].items() if e["stages_ms"]]))
    stage = data.draw(st.sampled_from(sorted(doc["scenarios"][case]["stages_ms"])))
    _, v = data.draw(st.sampled_from(BAD_VALUES))
    doc["scenarios"][case]["stages_ms"][stage] = v
    with pytest.raises(bl.BaselineError) as ei:
        bl.loads_baseline(json.dumps(doc), "perf_baselines/h100.json")
    assert f"scenarios.{case}.stages_ms.{stage}" in str(ei.value)
    assert "perf_baselines/h100.json" in str(ei.value)
    # and as a run entry: named, never read as 0
    with pytest.raises(bl.BaselineError, match=f"run {case}.stages_ms"):
        bl.compare({case: doc["scenarios"][case]}, bl.new_baseline("x") | {"scenarios": {case: {}}})


@pytest.mark.parametrize("path", [H100, B5090], ids=["h100", "5090"])
def test_real_baselines_load_round_trip_and_compare_with_themselves(path):
    doc = bl.load_baseline(path)
    assert bl.dumps_baseline(doc) == path.read_text(encoding="utf-8")  # same bytes
    # the run as sglang measures it: each case's entry plus its values in top-level maps (5090)
    run = {
        c: {**e, **{k: doc[k][c] for k in bl.TOP_LEVEL_CASE_MAPS if c in (doc.get(k) or {})}}
        for c, e in doc["scenarios"].items()
    }
    for video in (True, False):
        rows = bl.compare(run, doc, video=video)
        assert rows and {r.status for r in rows} <= {"pass", "skipped"}
    nulls = [r for r in bl.compare(run, doc) if r.metric.endswith("per_frame_generation")]
    if path == H100:
        assert len(nulls) == 5 and all(
            r.status == "skipped" and r.expected is None and "not measured in the baseline" in r.reason
            for r in nulls
        )


def test_per_frame_generation_rule():
    doc = bl.load_baseline(H100)
    doc["scenarios"]["fast_hunyuan_video"]["stages_ms"]["per_frame_generation"] = 100.0
    run = {"fast_hunyuan_video": copy.deepcopy(doc["scenarios"]["fast_hunyuan_video"])}
    run["fast_hunyuan_video"]["stages_ms"]["per_frame_generation"] = 900.0
    pf = "stages_ms.per_frame_generation"
    video = [r for r in bl.compare(run, doc, video=True) if r.metric == pf]
    assert video[0].status == "skipped" and "video" in video[0].reason
    image = [r for r in bl.compare(run, doc, video=False) if r.metric == pf]
    assert image[0].status == "fail"  # 900 > max(100 * 1.8, 100 + 120)
    run["fast_hunyuan_video"]["stages_ms"]["per_frame_generation"] = None
    image = [r for r in bl.compare(run, doc, video=False) if r.metric == pf]
    assert image[0].status == "fail" and "not measured in the run" in image[0].reason


# ---------------------------------------------------------------------------------------------
# perfkit compare (the real command line, in this process: tests/inprocess_cli.py)
# ---------------------------------------------------------------------------------------------


def perfkit(*args):
    return inprocess_cli.perfkit(*args, cwd=REPO)


def test_cli_compare_dumps(tmp_path):
    same = perfkit("compare", "--before", str(DUMP_V2), "--after", str(DUMP_V2))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "E2E Latency" in same.stdout and "Denoising Loop" in same.stdout
    assert "compare: PASS" in same.stdout
    after = json.loads(DUMP_V2.read_text())
    for s in after["steps"]:
        if s["name"] == "DenoisingStage":
            s["duration_ms"] = round(s["duration_ms"] * 1.5, 2)
    slow = tmp_path / "after.json"
    slow.write_text(json.dumps(after, indent=2))
    reg = perfkit("compare", "--before", str(DUMP_V2), "--after", str(slow))
    assert reg.returncode == 1, reg.stdout + reg.stderr
    assert "🔴" in reg.stdout and "compare: FAIL" in reg.stdout and "DenoisingStage" in reg.stderr
    old = perfkit("compare", "--before", str(DUMP_V1), "--after", str(DUMP_V1))
    assert old.returncode == 0, old.stdout + old.stderr


def test_cli_compare_bad_or_empty_dumps(tmp_path):
    bad = json.loads(DUMP_V2.read_text())
    bad["steps"][0]["duration_ms"] = "0.04"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = perfkit("compare", "--before", str(DUMP_V2), "--after", str(tmp_path / "bad.json"))
    assert proc.returncode == 2 and "steps[0].duration_ms" in proc.stderr
    empty = {"request_id": "x", "total_duration_ms": None, "steps": [], "meta": {}}
    (tmp_path / "empty.json").write_text(json.dumps(empty))
    proc = perfkit(
        "compare", "--before", str(tmp_path / "empty.json"), "--after", str(tmp_path / "empty.json")
    )
    assert proc.returncode == 2 and "nothing comparable" in proc.stderr
    proc = perfkit("compare", "--before", str(DUMP_V2))
    assert proc.returncode == 2
    # found by a breaker: a 5000-digit integer was Python's int-limit error naming neither
    huge = json.loads(DUMP_V2.read_text())
    huge["steps"][0]["duration_ms"] = 424242
    (tmp_path / "huge.json").write_text(json.dumps(huge).replace("424242", "9" * 5000))
    proc = perfkit("compare", "--before", str(DUMP_V2), "--after", str(tmp_path / "huge.json"))
    assert proc.returncode == 2, proc.stderr
    assert "huge.json: key 'steps[0].duration_ms': inf is not a finite number" in proc.stderr, proc.stderr
    log = FIX / "0.5.23/ltx-2/performance.log"
    line = log.read_text().splitlines()[0].replace("0.04924400036543375", "9" * 5000)
    rep = parse_lines([line], source="performance.log")
    assert rep.skipped == [
        (1, "performance.log:1: key 'stages[0].execution_time_ms': inf is not a finite number")
    ]


def test_cli_compare_run_as_dump_or_log(tmp_path):
    base = tmp_path / "b.json"
    doc = bl.new_baseline("H100")
    d = perfdump.read_perf_dump(DUMP_V2)
    doc["scenarios"]["fast_hunyuan_video"] = bl.entry_from_records([d])
    bl.save_baseline(doc, base)
    proc = perfkit("compare", "--run", str(DUMP_V2), "--baseline", str(base), "--case", "fast_hunyuan_video")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = dict(d.raw)
    line = {
        "request_id": "r1",
        "timestamp": None,
        "commit_hash": "N/A",
        "tag": "pipeline_stage_metrics",
        "stages": [{"name": n, "execution_time_ms": v} for n, v in d.stages],
        "steps": d.denoise_steps,
        "total_duration_ms": rec["total_duration_ms"],
    }
    log = tmp_path / "performance.log"
    log.write_text(json.dumps(line) + "\n")
    proc = perfkit("compare", "--run", str(log), "--baseline", str(base), "--case", "fast_hunyuan_video")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line["stages"][0]["execution_time_ms"] = math.nan
    log.write_text(json.dumps(line) + "\n")
    proc = perfkit("compare", "--run", str(log), "--baseline", str(base), "--case", "fast_hunyuan_video")
    assert proc.returncode == 2 and "stages[0].execution_time_ms" in proc.stderr


@pytest.mark.parametrize(
    "e2e, says",
    [
        (1e308, "expected_e2e_ms: 1e+308 is above 1e+09"),
        (0, "scenarios.fast_hunyuan_video.expected_e2e_ms: 0 is no reference"),
    ],
)
def test_cli_compare_refuses_an_absurd_or_zero_expected_duration(tmp_path, e2e, says):
    """Issue 54: ``expected_e2e_ms: 1e308`` passed (a 300-digit bound), ``0`` failed "+inf%"; both
    are exit 2 naming the baseline file and key."""
    base = tmp_path / "b.json"
    doc = bl.new_baseline("H100")
    doc["scenarios"]["fast_hunyuan_video"] = bl.entry_from_records([perfdump.read_perf_dump(DUMP_V2)])
    doc["scenarios"]["fast_hunyuan_video"]["expected_e2e_ms"] = e2e
    base.write_text(json.dumps(doc))
    proc = perfkit("compare", "--run", str(DUMP_V2), "--baseline", str(base), "--case", "fast_hunyuan_video")
    assert proc.returncode == 2 and str(base) in proc.stderr and says in proc.stderr, (
        proc.stdout + proc.stderr
    )


def test_cli_compare_dumps_refuses_an_absurd_duration(tmp_path):
    """Issue 54: a dump's ``duration_ms: 1e308`` was a "regression … -> 1000000…"; now exit 2 naming
    the file and key."""
    after = json.loads(DUMP_V2.read_text())
    after["steps"][0]["duration_ms"] = 1e308
    huge = tmp_path / "after.json"
    huge.write_text(json.dumps(after))
    proc = perfkit("compare", "--before", str(DUMP_V2), "--after", str(huge))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "after.json: key 'steps[0].duration_ms': 1e+308 is above 1e+09" in proc.stderr, proc.stderr

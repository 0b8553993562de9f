"""Serving under load (perfkit.investigations.load) on the tiny reference engine: one module-scoped
launch measures a 17/25-frame trace against a 17-frame warmup, the closed-loop levels 1, 2 and 4
(8 measured requests each) and an open loop at 3x capacity; a second launch with a 25-frame
warmup replays the trace's 25-frame requests. The engine runs with one torch thread so that a
shared 2-core runner moves its service time less; requests take about 0.2 s here (96 steps: at
32 steps they took ~80 ms once the memory sampler stopped reading PSS ten times a second, and
the client's few ms a request put the queue wait at 4 in flight 30 % off (k - 1) x service:
306 vs 235 ms in CI; at 96 steps 660 vs 660 ms, 205 vs 214 ms at 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
import yaml

from perfkit.bundle import ResultBundle
from perfkit.engine.client import RequestOutcome, VideoRequestSpec
from perfkit.investigations import load as L
from perfkit.investigations import load_measure as M
from perfkit.investigations.load_stats import open_loop_stats, trace_summary
from perfkit.investigations.registry import InvestigationError, RunContext, merged_invariants
from perfkit.params import load_params
from perfkit.stats import quantile_ci

# queue wait against (k - 1) x service and throughput across levels are speed comparisons on a
# live engine: run alone on the machine (`make test`'s second phase), one launch for the module
pytestmark = pytest.mark.timing

REPO = Path(__file__).resolve().parents[1]
#: a request of about 0.2 s on the tiny engine with one thread (128x128, 17 frames, 96 steps)
REQUEST = VideoRequestSpec(num_frames=17, height=128, width=128, num_inference_steps=96)
#: trace requests: the smallest shapes (64x64, 4 steps), 17 and 25 frames alternating
MIX = [
    {"num_frames": f, "width": 64, "height": 64, "num_inference_steps": 4, "seed": i}
    for i, f in enumerate([17, 25] * 3)
]


def _engine(warmup_frames: int):
    spec = load_params(REPO / "params/ci-cpu.yaml").engine
    return spec.model_copy(
        update={"warmup_frames": warmup_frames, "env": {**spec.env, "OMP_NUM_THREADS": "1"}}
    )


def _trace(path: Path, lines: list[dict]) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return str(path)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> ResultBundle:
    d = tmp_path_factory.mktemp("load")
    mix = [dict(x) for x in MIX]
    mix[1]["slo_ms"] = 60_000.0
    p = L.LoadParams(
        enabled=True,
        warmup_requests=2,
        concurrency=[1, 2, 4],
        requests_per_level=8,
        rate_over_capacity=3.0,
        open_loop_requests=10,
        trace=_trace(d / "trace.jsonl", mix),
        poll_s=0.005,
    )
    bundle = L.run(RunContext(engine=_engine(17), request=REQUEST, work_dir=d), p)
    bundle.save(d / "recorded" / L.NAME)
    # the params file it was measured with, for perfkit suite --replay
    doc = yaml.safe_load((REPO / "params/ci-cpu.yaml").read_text())
    for name in ("cold_warm", "warmup_shapes", "memory_budget", "offload_modes"):
        doc[name] = {"enabled": False}
    doc["engine"]["env"] = {"OMP_NUM_THREADS": "1"}
    doc["request"] = {k: v for k, v in REQUEST.payload().items() if k != "prompt"}
    doc[L.NAME] = p.model_dump()
    doc["invariants"] = {"load_queue_model_max_rel_err": 0.25}
    (d / "params.yaml").write_text(yaml.safe_dump(doc))
    return bundle


@pytest.fixture(scope="module")
def warm25(tmp_path_factory) -> ResultBundle:
    d = tmp_path_factory.mktemp("load25")
    p = L.LoadParams(
        enabled=True,
        warmup_requests=1,
        concurrency=[],
        trace=_trace(d / "trace.jsonl", [x for x in MIX if x["num_frames"] == 25]),
        poll_s=0.005,
    )
    return L.run(RunContext(engine=_engine(25), request=REQUEST, work_dir=d), p)


def _levels(b: ResultBundle) -> dict[int, dict]:
    return {lv["concurrency"]: lv for lv in b.results["levels"]}


def test_engine_records_and_job_json_say_when_each_request_started(measured):
    rows = pd.DataFrame(measured.results["per_request"])
    assert (rows["status"] == "completed").all(), rows[rows["status"] != "completed"]
    assert set(rows["start_source"]) == {"engine"}
    req = measured.requests.set_index("request_id")
    mine = req.loc[rows["request_id"]]
    assert (mine["submitted_s"] <= mine["started_s"]).all() and (
        mine["started_s"] < mine["completed_s"]
    ).all()
    # the same start over HTTP (GET /v1/videos/{id}: perfkit_times.started) as in the record
    assert rows["job_json_started_s"].tolist() == pytest.approx(mine["started_s"].tolist(), abs=1e-6)


def test_closed_loop_queue_wait_is_k_minus_1_service_times(measured):
    lv = _levels(measured)
    assert sorted(lv) == [1, 2, 4] and all(lv[k]["completed"] >= 8 for k in lv)
    assert lv[1]["queue_wait_ms"] < 0.1 * lv[1]["service_ms"]
    for k in (2, 4):
        expect = (k - 1) * lv[k]["service_ms"]
        assert lv[k]["queue_wait_steady_ms"] == pytest.approx(expect, rel=0.25), lv[k]
        assert lv[k]["queue_model_rel_err"] <= 0.25
    rows = L.checks(measured.results, merged_invariants({"load_queue_model_max_rel_err": 0.25}))
    model = [c for c in rows if c.metric.startswith("queue_model_rel_err")]
    assert [c.status for c in model] == ["pass", "pass"], model


def test_throughput_stays_flat_with_concurrency(measured):
    """No batching: at every level throughput is what one request at a time at that level's own
    median service time gives (60,000 / service ms), within 15 %. Raw throughput against level 1's
    is the issue's figure; on a shared 2-core runner the tiny engine's service time itself moves
    between levels (measured 302 -> 274 -> 230 ms at 1, 2, 4 in flight: back-to-back requests
    run faster than requests with the client's turnaround between them), so beyond 15 % it is a
    warning naming the service times, and the reading says so (test below)."""
    lv = _levels(measured)
    for k in (2, 4):  # at 1 the engine also waits for the client's turnaround (idle share)
        one_at_a_time = 60_000.0 / lv[k]["service_ms"]
        assert lv[k]["throughput_vpm"] == pytest.approx(one_at_a_time, rel=0.15), (k, lv[k])
    for k in (2, 4):
        ratio = lv[k]["throughput_vpm"] / lv[1]["throughput_vpm"]
        if not 0.85 <= ratio <= 1.15:
            warnings.warn(
                f"throughput at {k} in flight {ratio:.2f} x level 1's, service "
                f"{lv[1]['service_ms']:.0f} -> {lv[k]['service_ms']:.0f} ms",
                stacklevel=1,
            )
    # with requests queued the engine never idles; at concurrency 1 it waits for the client
    assert lv[4]["engine_idle_share"] < 0.05


def test_p99_slo_attainment_and_goodput_are_shown(measured):
    r = measured.results
    table = L.summary_table(r)
    assert list(table["level"][:3]) == ["c1", "c2", "c4"]
    assert table[["p50_ms", "p90_ms", "p99_ms", "slo_attainment", "goodput_vpm"]].iloc[:3].notna().all().all()
    assert (table["p50_ms"] <= table["p99_ms"]).all()
    # the SLO base: the warm-up requests that compiled nothing (tests/test_load_figures.py)
    warm = [x["e2e_ms"] for x in r["per_request"] if x["phase"] == "warmup" and x["compiles"] == 0]
    assert r["slo_ms"] == pytest.approx(3.0 * pd.Series(warm).median())
    text = L.reading(r)
    assert "p99 e2e at concurrency 4" in text and "x median e2e" in text and "order-statistic" in text
    labels = [k.label for k in L.key_numbers(r)]
    assert "throughput at concurrency 1" in labels and "SLO" in labels


def test_memory_stays_flat_under_concurrency(measured):
    r = measured.results
    assert r["memory_growth_mib"] is not None
    rows = L.checks(r, merged_invariants())
    mem = [c for c in rows if c.metric == "memory_growth_mib"]
    assert [c.status for c in mem] == ["pass"] and mem[0].expected == 256.0
    # PSS is read within its time budget: a short level may have none, then the growth reads RSS
    src = r["memory_growth_host_source"]
    assert src in ("pss", "rss")
    pss_everywhere = all(lv["host_peak_mib"] is not None for lv in r["levels"])
    assert (src == "pss") == pss_everywhere
    assert ("host memory as RSS" in L.reading(r)) == (src == "rss")


def test_open_loop_above_capacity_shows_the_queue_growing(measured):
    ol = measured.results["open_loop"]
    assert ol["above_capacity"] and ol["rate_rps"] == pytest.approx(3.0 * ol["capacity_rps"], rel=1e-6)
    assert ol["queue_grows"] and ol["queue_wait_last_third_ms"] > ol["queue_wait_first_third_ms"]
    assert "the queue grows" in L.reading(measured.results)


def test_trace_against_a_17_frame_warmup_names_the_uncovered_share_and_its_penalty(measured):
    tr = measured.results["trace"]
    shapes = {s["shape"]: s for s in tr["shapes"]}
    s17, s25 = shapes["64x64 17f 4 steps"], shapes["64x64 25f 4 steps"]
    assert s17["covered"] is True and s25["covered"] is False
    assert s25["first_hit_compiles"] >= 1 and s25["first_hit_penalty_ms"] > 5 * s25["later_median_ms"]
    assert tr["uncovered_share"] == 0.5 and tr["uncovered_shapes"] == ["64x64 25f 4 steps"]
    assert 0 < tr["uncovered_p99_share"] <= 1
    assert tr["slo_requests"] == 1 and tr["slo_attainment"] == 1.0
    assert "50% of the requests" in tr["sentence"]


def test_trace_against_a_25_frame_warmup_has_nothing_uncovered(warm25):
    tr = warm25.results["trace"]
    assert tr["uncovered_share"] == 0.0 and tr["uncovered_shapes"] == []
    (s25,) = tr["shapes"]
    assert s25["covered"] is True and s25["first_hit_compiles"] == 0


def test_replay_from_the_bundle_gives_the_same_tables_and_verdict(measured):
    again = ResultBundle.load(measured.path)
    inv = merged_invariants({"load_queue_model_max_rel_err": 0.25, "load_slo_attainment_min": 0.5})
    recomputed = L.summarise(again.results, again.memory)
    for key, value in recomputed.items():
        assert json.loads(json.dumps(value)) == json.loads(json.dumps(measured.results[key])), key
    pd.testing.assert_frame_equal(L.summary_table(again.results), L.summary_table(measured.results))
    assert [dataclasses.astuple(c) for c in L.checks(again.results, inv)] == [
        dataclasses.astuple(c) for c in L.checks(measured.results, inv)
    ]
    assert L.reading(again.results) == L.reading(measured.results)
    L.check_bundle(again)


def test_a_failed_requests_count_that_is_no_count_is_named_not_shown(measured):
    """Found by the breaker: ``failed_requests: 1e308`` in results.json showed "-1000…297 of 39"
    under "requests completed". A value that is no count of 0..requests is not shown and the
    bundle check names the key."""
    n = measured.results["requests"]
    for bad in (1e308, 10**400, -1, "3", n + 1, True):
        b = ResultBundle.load(measured.path)
        b.results["failed_requests"] = bad
        shown = {k.label: k.value for k in L.key_numbers(b.results)}
        assert shown["requests completed"] is None, (bad, shown["requests completed"])
        with pytest.raises(InvestigationError, match=r"results\.failed_requests: .* is not a count of 0\.\."):
            L.check_bundle(b)
    good = {k.label: k.value for k in L.key_numbers(measured.results)}
    assert good["requests completed"] == f"{n - measured.results['failed_requests']} of {n}"


# ------------------------------------------------------------------------------ no engine needed
def test_a_mixed_trace_against_a_25_frame_warmup_leaves_the_17_frame_shape_uncovered():
    def row(f, ms, latent):
        return {"shape": f"64x64 {f}f 4 steps", "status": "completed", "e2e_ms": ms, "latent_shape": latent}

    rows = [
        row(17, 900.0, "8x3x2x2"),
        row(25, 100.0, "8x4x2x2"),
        row(17, 100.0, "8x3x2x2"),
        row(25, 100.0, "8x4x2x2"),
    ]
    tr = trace_summary(rows, "8x4x2x2", [None] * 4)
    assert tr["uncovered_shapes"] == ["64x64 17f 4 steps"] and tr["uncovered_share"] == 0.5
    assert tr["shapes"][0]["first_hit_penalty_ms"] == 800.0
    assert tr["p99_without_uncovered_first_hits_ms"] == pytest.approx(100.0)


def test_an_engine_without_start_times_is_derived_or_not_reported_never_0():
    # sglang's performance.log line: total_duration_ms, no perfkit block, no start time
    line = json.dumps(
        {
            "request_id": "r1",
            "timestamp": "t",
            "tag": "x",
            "stages": [],
            "steps": [],
            "total_duration_ms": 300.0,
        }
    )
    sent = [
        ("closed", 1, RequestOutcome("r1", "completed", 100.0, 100.5, slot=0), REQUEST),
        ("closed", 1, RequestOutcome("r2", "completed", 101.0, 101.4, slot=1), REQUEST),
    ]
    rows, _, _ = M.per_request_rows(sent, [line], "session")
    assert rows[0]["start_source"] == "derived (start not reported)"
    assert rows[0]["service_ms"] == 300.0 and rows[0]["queue_wait_ms"] == pytest.approx(200.0)
    assert rows[1]["start_source"] == "not reported" and rows[1]["queue_wait_ms"] is None
    assert rows[0]["job_json_started_s"] is None
    assert rows[0]["job_completed_at_s"] is None and rows[0]["job_inference_ms"] is None  # no job JSON


def test_sglangs_job_json_fields_land_in_the_rows_as_written():
    """sglang 0.5.23's final job JSON (tests/test_sglang_adapter.py SGLANG_JOB): completed_at in
    whole seconds and inference_time_s go to the row; no start: not reported, never 0."""
    from test_sglang_adapter import SGLANG_JOB

    o = RequestOutcome(SGLANG_JOB["id"], "completed", 1796384052.1, 1796384053.2, body=SGLANG_JOB)
    [row], _, _ = M.per_request_rows([("closed", 1, o, REQUEST)], [], "session")
    assert row["job_completed_at_s"] == 1796384053 and isinstance(row["job_completed_at_s"], int)
    assert row["job_inference_ms"] == pytest.approx(814.8129280007197, abs=1e-9)
    assert row["job_json_started_s"] is None and row["start_source"] == "not reported"


def test_a_bad_trace_line_is_refused_naming_file_line_and_key(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"num_frames": 17}\n{"num_frame": 25}\n')
    with pytest.raises(InvestigationError, match=r"t\.jsonl:2: key 'num_frame'"):
        L.read_trace(p, REQUEST)
    p.write_text('{"num_frames": "25"}\n')
    with pytest.raises(InvestigationError, match=r"t\.jsonl:1: key 'num_frames'"):
        L.read_trace(p, REQUEST)


def test_quantile_interval_of_a_small_sample_is_unbounded_above_not_the_maximum():
    lo, hi = quantile_ci(list(range(8)), 0.99)
    assert lo == 6.0 and hi != hi  # NaN: 8 requests cannot bound a p99
    assert quantile_ci(list(range(100)), 0.5) == (39.0, 60.0)


def test_suite_replay_gives_the_same_verdict_and_the_page_reads_in_chromium(measured, tmp_path):
    """perfkit suite --replay of the recorded bundle: the notebook (papermill) and the gate
    give the bundle's own checks, and the page passes the browser checks (no horizontal scroll
    at 1280 px, no NaN/None words, alt text, no network request)."""
    from perfkit import report
    from perfkit.suite import run_suite

    d = measured.path.parent.parent
    res = run_suite(
        str(d / "params.yaml"), tmp_path / "run", replay=d / "recorded", screenshot=False, progress=False
    )
    assert res.exit_code == 0, (tmp_path / "run" / "summary.md").read_text()
    verdict = json.loads((tmp_path / "run" / L.NAME / "verdict.json").read_text())
    inv = merged_invariants({"load_queue_model_max_rel_err": 0.25})
    want = {(c.metric, c.status) for c in L.checks(measured.results, inv)}
    assert {(r["metric"], r["status"]) for r in verdict["rows"] if r["case"] == L.NAME} == want
    if report.chromium_binary() is None:
        pytest.skip("chromium not installed: the page was rendered, not read")
    import test_report_browser as browser

    f = browser.read_at(tmp_path / "run" / "report.html", tmp_path)
    assert f["scrollWidth"] <= f["innerWidth"] == 1280, f["wide"]
    assert f["junk"] == [] and f["noAlt"] == 0 and f["images"] >= 3, f
    assert [u for u in f["requests"] if not u.startswith(browser.LOCAL_SCHEMES)] == []


# ------------------------------------------------------------------ breaking it (no engine either)
def _row(phase: str, level, slot: int, t: float, status: str = "completed", qw: float | None = 0.0, **kw):
    """A per_request row as per_request_rows writes it (ms, epoch s): 100 ms of service."""
    row = {
        "phase": phase,
        "level": level,
        "slot": slot,
        "request_id": f"r{slot}",
        "status": status,
        "error": None if status == "completed" else f"request r{slot} not finished after 3 s",
        "shape": "64x64 17f 4 steps",
        "e2e_ms": 100.0 + (qw or 0.0),
        "t_arrival_s": None,
        "t_submit_s": t,
        "t_end_s": t + 0.1 + (qw or 0.0) / 1000,
        "in_flight_at_submit": 0,
        "queue_wait_ms": qw,
        "service_ms": 100.0 if qw is not None else None,
        "start_source": "engine" if qw is not None else "not reported",
        "engine_started_s": None,
        "engine_completed_s": None,
        "latent_shape": None,
        "compiles": None,
    }
    return {**row, **kw}


def test_the_load_phases_run_inside_a_running_event_loop_as_in_a_jupyter_kernel():
    # the suite's notebooks run cells inside ipykernel's event loop, where asyncio.run raises
    # "cannot be called from a running event loop": `perfkit suite` with load enabled failed so
    p = L.LoadParams(warmup_requests=1, concurrency=[])

    async def in_a_kernel():
        return M.run_phases("http://127.0.0.1:1", p, REQUEST, [], 2.0)[0]  # nothing listens on port 1

    sent = asyncio.run(in_a_kernel())
    assert [(ph, o.status) for ph, _, o, _ in sent] == [("warmup", "error")]
    assert "submit failed" in sent[0][2].error


def test_the_sync_client_runs_inside_a_running_event_loop_and_names_a_refused_connection():
    # VideoClient runs the async client on a loop of its own thread: a notebook cell may call it
    from perfkit.engine.client import VideoClient

    async def in_a_kernel():
        with VideoClient("http://127.0.0.1:1", timeout_s=2.0) as c:  # nothing listens on port 1
            return c.health(), c.generate(REQUEST)

    healthy, out = asyncio.run(in_a_kernel())
    assert healthy is False and out.status == "error" and out.request_id == "" and out.http_status == 0
    assert out.error.startswith("submit failed: ConnectError"), out.error
    assert 0 <= out.client_ms < 2000.0, out.client_ms


def test_a_trace_line_with_a_null_a_repeated_key_or_a_value_the_params_refuse_is_refused(tmp_path):
    p = tmp_path / "t.jsonl"
    for line, key in [
        ('{"num_frames": 17, "width": null}', "width"),  # not "left out": never the params' value
        ('{"num_frames": 17, "num_frames": 25}', "num_frames"),  # json keeps the last silently
        ('{"num_inference_steps": 1000000}', "num_inference_steps"),  # the params' bound: 1000
        ('{"width": 4}', "width"),  # the params' bound: 8 pixels
        ('{"seed": 99999999999999999999999}', "seed"),  # torch seeds are 64 bits
    ]:
        p.write_text('{"num_frames": 17}\n' + line + "\n")
        with pytest.raises(InvestigationError, match=rf"t\.jsonl:2: .*{key}"):
            L.read_trace(p, REQUEST)


@pytest.mark.parametrize(
    "section",
    [
        {"rate_rps": float("inf")},
        {"rate_over_capacity": float("inf")},
        {"slo_ms": float("inf")},  # json_float would write it as null: a replay's SLO would differ
        {"slo_scale": float("inf")},
        {"seed": -1},  # numpy's default_rng refuses it, after every closed-loop level had run
        {"concurrency": [1, 4], "requests_per_level": 3},  # c4 never has 4 in flight
        {"trace": ""},
        {"rate_rps": 2.0, "rate_over_capacity": 2.0},  # rate_rps won silently
    ],
)
def test_load_params_refuse_infinite_rates_a_negative_seed_and_levels_above_their_requests(section):
    with pytest.raises(ValueError, match=next(iter(section))):
        L.LoadParams(**section)


def test_an_slo_attainment_limit_above_1_is_refused():
    with pytest.raises(ValueError, match="load_slo_attainment_min"):
        L.LoadInvariants(load_slo_attainment_min=2)


def test_an_edited_per_request_row_is_refused_naming_row_and_key_and_a_missing_start_is_not_reported():
    rows = [_row("closed", 1, i, t=100.0 + i) for i in range(3)]
    for edit, key in [
        ({"e2e_ms": None}, "e2e_ms"),
        ({"e2e_ms": "120.5"}, "e2e_ms"),
        ({"queue_wait_ms": "3"}, "queue_wait_ms"),
        ({"t_submit_s": None}, "t_submit_s"),
    ]:
        bad = [dict(r) for r in rows]
        bad[1].update(edit)
        with pytest.raises(InvestigationError, match=rf"per_request\[1\]: key '{key}'"):
            L.summarise({"per_request": bad, "slo_ms_given": 500.0}, None)
    bad = [dict(r) for r in rows]
    del bad[2]["in_flight_at_submit"]
    with pytest.raises(InvestigationError, match=r"per_request\[2\]: key 'in_flight_at_submit'.*missing"):
        L.summarise({"per_request": bad}, None)
    # the engine's start left out: "not reported" (None), never 0
    lv = L.summarise({"per_request": rows, "slo_ms_given": 500.0}, None)["levels"][0]
    assert lv["engine_idle_share"] is None and lv["service_ms"] == 100.0


def test_a_request_that_did_not_complete_fails_the_check_and_the_reading_names_its_level_and_id():
    rows = [_row("warmup", 1, 0, t=10.0), _row("closed", 1, 0, t=11.0), _row("closed", 1, 1, t=12.0)]
    rows += [_row("closed", 2, 0, t=13.0), _row("closed", 2, 1, t=13.0, status="timeout", qw=None)]
    r = {"per_request": rows, "slo_ms_given": 500.0}
    r.update(L.summarise(r, None))
    assert r["failed_requests"] == 1 and [lv["concurrency"] for lv in r["levels"]] == [1, 2]
    assert L.summary_table(r)["level"].tolist() == ["c1", "c2"]  # ints stay ints: c2, not c2.0
    [check] = [c for c in L.checks(r, merged_invariants({})) if c.metric == "failed_requests"]
    assert check.status == "fail" and check.actual == 1
    text = L.reading(r)
    assert (
        "At concurrency 2, 1 of 2 requests did not complete (the first: request 1 of the level, id r1, timeout"
        in text
    )
    assert "**requests completed**: 4 of 5" in text


def test_an_open_loop_of_four_requests_shows_neither_a_growing_nor_a_bounded_queue():
    def opened(n: int) -> list[dict]:
        return [
            _row("open", 5.0, i, t=100.0 + 0.1 * i, qw=10.0 * i, t_arrival_s=100.0 + 0.1 * i)
            for i in range(n)
        ]

    assert open_loop_stats(opened(4), None, None, 2.0)["queue_verdict"] == "not shown"
    assert open_loop_stats(opened(6), None, None, 2.0)["queue_verdict"] == "grows"
    falling = opened(6)
    for i, x in enumerate(falling):
        x["queue_wait_ms"] = 50.0 - 10.0 * i
    assert open_loop_stats(falling, None, None, 2.0)["queue_verdict"] == "does not grow"


def test_an_answer_that_is_not_a_json_object_is_an_error_outcome_not_an_exception():
    # AsyncVideoClient.generate promises never to raise for server-side failures; resp.json() on
    # a non-JSON answer raised out of closed_loop and lost every outcome of the run
    import http.server
    import threading

    from perfkit.engine.client import AsyncVideoClient

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            bad_submit = self.server.bad_submit  # type: ignore[attr-defined]
            self._send(b"<html>proxy error</html>" if bad_submit else b'{"id": "j1", "status": "queued"}')

        def do_GET(self):
            self._send(b"[1, 2]")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    async def one():
        async with AsyncVideoClient(url, 1, timeout_s=5, poll_s=0.01) as c:
            return await c.generate(REQUEST)

    try:
        srv.bad_submit = True  # type: ignore[attr-defined]
        o = asyncio.run(one())
        assert (
            o.status == "error"
            and "submit answer is not a JSON object" in o.error
            and "proxy error" in o.error
        )
        srv.bad_submit = False  # type: ignore[attr-defined]
        o = asyncio.run(one())
        assert (
            o.status == "error" and o.request_id == "j1" and "job j1: answer is not a JSON object" in o.error
        )
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_job_with_no_duration_says_inference_time_none_not_0():
    from perfkit.refengine.jobs import Job, job_body
    from perfkit.refengine.pipeline import GenRequest

    job = Job("j1", GenRequest("a cat", 17, 64, 64, 4), status="failed", error="boom")
    job.started, job.completed = job.created + 0.5, job.created + 0.6
    job.result = {"total_duration_ms": None}  # the record of a request that failed before its stages
    body = job_body(job)
    assert body["inference_time_s"] is None
    assert body["perfkit_times"] == {
        "submitted": job.created,
        "started": job.started,
        "completed": job.completed,
    }
    job.result = {"total_duration_ms": 250.0}
    assert job_body(job)["inference_time_s"] == 0.25


def test_a_derived_queue_wait_is_never_a_clamped_0_and_a_bad_slo_in_results_is_named():
    line = json.dumps(
        {
            "request_id": "r1",
            "timestamp": "t",
            "tag": "x",
            "stages": [],
            "steps": [],
            "total_duration_ms": 900.0,
        }
    )
    # the engine's duration (900 ms) above the client's e2e (500 ms): no queue wait can be derived
    sent = [("closed", 1, RequestOutcome("r1", "completed", 100.0, 100.5, slot=0), REQUEST)]
    [row], _, _ = M.per_request_rows(sent, [line], "session")
    assert row["queue_wait_ms"] is None and row["service_ms"] == 900.0
    assert row["start_source"].startswith("not reported")
    rows = [_row("warmup", 1, 0, t=10.0), _row("closed", 1, 0, t=11.0), _row("closed", 1, 1, t=12.0)]
    with pytest.raises(InvestigationError, match=r"results\.slo_ms_given: .*'500'"):
        L.summarise({"per_request": rows, "slo_ms_given": "500"}, None)
    # no slo_ms and no scale recorded: the SLO is not set, never 0 x the warm-up median
    s = L.summarise({"per_request": rows}, None)
    assert s["slo_ms"] is None and s["levels"][0]["slo_attainment"] is None

"""Scale-out planning without an engine: units of work, estimates, partitions, --partition
values, tiers, the in-process executor's retries and events, executor lookup, concurrency."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from perfkit.cli import cli
from perfkit.gate import baseline as bl
from perfkit.gate.run import case_namer
from perfkit.investigations import registry
from perfkit.investigations.cold_warm import NAME as COLD_WARM
from perfkit.investigations.memory_budget import NAME as MEMORY_BUDGET
from perfkit.investigations.offload_modes import NAME as OFFLOAD_MODES
from perfkit.investigations.warmup_shapes import NAME as WARMUP_SHAPES
from perfkit.params import load_params, parse_params
from perfkit.scaleout import shards
from perfkit.scaleout.units import (
    DEFAULT_ESTIMATE_S,
    E2E_OVERHEAD_S,
    UNIT_FILE,
    PartitionError,
    WorkUnit,
    parse_partition,
    partition,
    plan_units,
)

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "params" / "ci-cpu.yaml"


def ci_params():
    return load_params(CI)


def test_units_of_ci_cpu_keep_shared_launches_together():
    p = ci_params()
    units = plan_units(p, p.enabled())
    ids = [u.id for u in units]
    # warmup_shapes, memory_budget and offload_modes split into one part per launch; the parts
    # that reuse cold_warm's launch (same spec, request, no caps, enough requests: warmup17,
    # the unlimited budget, mode none) run in cold_warm's unit, right after it
    assert ids == [
        COLD_WARM,
        f"{WARMUP_SHAPES}.warmup25",
        f"{MEMORY_BUDGET}.cap1",
        f"{OFFLOAD_MODES}.model",
        f"{OFFLOAD_MODES}.group-block",
        f"{OFFLOAD_MODES}.group-leaf",
    ]
    first = units[0]
    assert [x.id for x in first.parts] == [
        COLD_WARM,
        f"{WARMUP_SHAPES}.warmup17",
        f"{MEMORY_BUDGET}.cap0",
        f"{OFFLOAD_MODES}.none",
    ]
    # the parts that reuse cold_warm's launch make no launch and cost nothing of their own
    assert [(x.launches, x.requests, x.reuses) for x in first.parts[1:]] == [(0, 0, (COLD_WARM,))] * 3
    assert first.launches == 1 and first.requests == 5
    assert first.estimate_s == DEFAULT_ESTIMATE_S and first.estimate_source == "default+shared launch"
    for u in units:
        assert u.gpus == 0  # CPU engine
        assert u.estimate_s == DEFAULT_ESTIMATE_S
        assert u.launches == 1 and u.requests > 0
        assert WorkUnit.from_dict(json.loads(json.dumps(u.to_dict()))).to_dict() == u.to_dict()
    # every launch the plan makes is counted once: cold_warm's (shared by three parts),
    # warmup 25, the 8 GiB cap and three offload modes
    assert sum(u.launches for u in units) == 6


def test_min_budget_search_keeps_memory_budget_whole():
    p = ci_params().model_copy(deep=True)
    sec = p.section(MEMORY_BUDGET)
    p2 = parse_params(
        {**p.model_dump(), MEMORY_BUDGET: {**sec.model_dump(), "min_budget": {"lo_gib": 1, "hi_gib": 4}}}
    )
    units = plan_units(p2, [MEMORY_BUDGET])
    assert [u.id for u in units] == [MEMORY_BUDGET] and units[0].parts[0].key is None


def test_a_unit_that_cannot_reuse_is_its_own_unit():
    p = ci_params().model_copy(deep=True)
    p.section(COLD_WARM).repeats = 2  # warmup_shapes wants 3 requests: no reuse
    units = plan_units(p, [COLD_WARM, WARMUP_SHAPES])
    assert [u.id for u in units] == [COLD_WARM, f"{WARMUP_SHAPES}.warmup17", f"{WARMUP_SHAPES}.warmup25"]


def test_estimates_follow_sglang_fallbacks():
    p = ci_params()
    namer = case_namer(p.engine_dict(), p.request.model_dump())
    cw = registry.get(COLD_WARM).case_ids(p.section(COLD_WARM), namer)[0]
    ws25 = namer(warmup_frames=25, num_frames=25, suffix="_shapes")
    doc = {"scenarios": {cw: {"estimated_full_test_time_s": 42.0}, ws25: {"expected_e2e_ms": 5000.0}}}
    units = {u.id: u for u in plan_units(p, [COLD_WARM, WARMUP_SHAPES], baseline=doc)}
    # cold_warm: baseline; warmup17 reuses its launch and costs nothing of its own
    assert units[COLD_WARM].estimate_s == 42.0
    assert units[COLD_WARM].estimate_source == "baseline+shared launch"
    w25 = units[f"{WARMUP_SHAPES}.warmup25"]
    assert w25.estimate_s == 5.0 + E2E_OVERHEAD_S and w25.estimate_source == "e2e"
    # recorded durations replace a default
    units = {u.id: u for u in plan_units(p, [COLD_WARM, WARMUP_SHAPES], recorded={COLD_WARM: 77.0})}
    assert units[COLD_WARM].estimate_s == 77.0 and units[COLD_WARM].estimate_source == "recorded"


@pytest.mark.parametrize("bad", ["0/2", "3/2", "x/2", "2", "1/0", "-1/2", ""])
def test_bad_partition_values(bad):
    with pytest.raises(PartitionError, match="--partition"):
        parse_partition(bad)


def test_partition_values():
    assert parse_partition("1/2") == (1, 2)
    assert parse_partition(" 3 / 3 ") == (3, 3)


@pytest.mark.parametrize("bad", ["0/2", "3/2", "x/2"])
def test_cli_bad_partition_exits_2(bad, tmp_path):
    res = CliRunner().invoke(
        cli, ["suite", "--params", str(CI), "--partition", bad, "--out", str(tmp_path / "s")]
    )
    assert res.exit_code == 2, res.output
    assert "--partition" in res.output and bad in res.output
    assert not (tmp_path / "s").exists()


def test_cli_ray_executor_without_module_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "perfkit.scaleout.ray_executor", None)  # import fails
    res = CliRunner().invoke(
        cli,
        [
            "suite",
            "--params",
            str(CI),
            "--partition",
            "1/2",
            "--executor",
            "ray",
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert res.exit_code == 2, res.output
    assert "perfkit[ray]" in res.output


def _units(estimates: list[float]) -> list[WorkUnit]:
    return [WorkUnit(id=f"u{i:03d}", parts=[], estimate_s=e) for i, e in enumerate(estimates)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=1, max_value=5000, allow_nan=False), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=8),
    st.randoms(use_true_random=False),
)
def test_partition_is_deterministic_and_balanced(estimates, n, rnd):
    a = _units(estimates)
    shards_a = partition(a, n)
    b = list(_units(estimates))
    rnd.shuffle(b)
    partition(b, n)
    # the same unit lands on the same shard whatever the input order
    assert {u.id: u.shard for u in a} == {u.id: u.shard for u in b}
    # every unit on exactly one shard, shards keep run order
    assert sorted(u.id for s in shards_a for u in s) == sorted(u.id for u in a)
    assert all([u.id for u in s] == sorted(u.id for u in s) for s in shards_a)
    # longest-first greedy: loads differ by at most the longest unit
    loads = [sum(u.estimate_s for u in s) for s in shards_a]
    assert max(loads) - min(loads) <= max(estimates) + 1e-6


def test_partition_longest_first_to_least_loaded():
    units = _units([10, 50, 30, 30, 5])
    partition(units, 2)
    # 50 -> 1; 30 (u002) -> 2; 30 (u003) -> 2 (30 < 50); 10 -> 1 (50 < 60); 5 -> 2 (60 = 60: shard 1)
    assert [u.shard for u in units] == [1, 1, 2, 2, 1]


def test_tier_selection():
    p = parse_params(
        {
            "name": "t",
            COLD_WARM: {"tier": "per-commit"},
            WARMUP_SHAPES: {"tier": "extra"},
            MEMORY_BUDGET: {"enabled": False},
        }
    )
    sel, skipped = shards.select(p, tier="per-commit")
    assert COLD_WARM in sel and WARMUP_SHAPES not in sel
    assert skipped[WARMUP_SHAPES] == "tier extra, not selected by --tier per-commit"
    assert skipped[MEMORY_BUDGET] == "disabled in the params"
    sel, _ = shards.select(p, tier="extra")
    assert sel == [WARMUP_SHAPES]
    with pytest.raises(ValueError, match="unknown tier"):
        shards.select(p, tier="nightly")
    with pytest.raises(Exception, match="tier"):
        parse_params({"name": "t", COLD_WARM: {"tier": "nightly"}})


def test_inprocess_executor_retries_and_reports_errors(tmp_path):
    calls: dict[str, int] = {}

    def run_unit(unit, out_dir):
        calls[unit["id"]] = calls.get(unit["id"], 0) + 1
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "engine.log").write_text("engine said: out of memory\n")
        if unit["id"] == "flaky" and calls["flaky"] == 1:
            raise RuntimeError("engine crashed")
        if unit["id"] == "broken":
            raise RuntimeError("always broken")

    events = []
    units = [WorkUnit(id=i, parts=[]).to_dict() for i in ("fine", "flaky", "broken")]
    out = shards.run_units_inprocess(
        units, run_unit, tmp_path, retries=1, on_event=lambda *e: events.append(e[:2])
    )
    by = {o.unit_id: o for o in out}
    assert [o.unit_id for o in out] == ["fine", "flaky", "broken"]
    assert by["fine"].status == "ok" and by["fine"].attempts == 1
    assert by["flaky"].status == "ok" and by["flaky"].attempts == 2
    assert by["broken"].status == "error" and by["broken"].attempts == 2
    assert "always broken" in by["broken"].error
    assert "out of memory" in by["broken"].log_tail and "Traceback" in by["broken"].log_tail
    assert all(o.wall_s is not None and o.started_at <= o.ended_at for o in out)
    assert ("retry", "flaky") in events and events[-1] == ("finished", "broken")
    doc = json.loads((tmp_path / "broken" / UNIT_FILE).read_text())
    assert doc["outcome"]["status"] == "error" and doc["unit"]["id"] == "broken"
    # without retries the flaky one fails
    calls.clear()
    out = shards.run_units_inprocess(units[1:2], run_unit, tmp_path / "b")
    assert out[0].status == "error" and out[0].attempts == 1


def test_executor_lookup():
    assert shards.executor("inprocess") is shards.run_units_inprocess
    with pytest.raises(shards.ExecutorError, match="unknown executor"):
        shards.executor("slurm")


def test_executor_refuses_replay(tmp_path):
    from perfkit.suite import run_suite

    with pytest.raises(ValueError, match="cannot be combined with --replay"):
        run_suite(tmp_path / "p.yaml", tmp_path / "out", replay=tmp_path, executor="inprocess")
    assert not (tmp_path / "out").exists()


def test_concurrent_pairs():
    oc = [
        {"unit_id": "a", "started_at": 0, "ended_at": 10},
        {"unit_id": "b", "started_at": 5, "ended_at": 15},
        {"unit_id": "c", "started_at": 15, "ended_at": 20},
        {"unit_id": "d", "started_at": None, "ended_at": None},
    ]
    assert shards.concurrent_pairs(oc) == [["a", "b"]]


def test_refresh_estimates(tmp_path):
    p = ci_params()
    units = plan_units(p, [COLD_WARM, WARMUP_SHAPES])
    namer = case_namer(p.engine_dict(), p.request.model_dump())
    cw = namer()
    base = bl.new_baseline("ci-cpu-2core")
    base["scenarios"][cw] = {"expected_e2e_ms": 100.0, "stages_ms": {}, "denoise_step_ms": {}}
    f = tmp_path / "b.json"
    bl.save_baseline(base, f)
    manifest = tmp_path / "shard.json"
    manifest.write_text(
        json.dumps(
            {
                "units": [u.to_dict() for u in units],
                "outcomes": [{"unit_id": COLD_WARM, "status": "ok", "wall_s": 40.0}],
            }
        )
    )
    written = shards.refresh_estimates(f, [manifest])
    # cold_warm's unit holds two cases (cold_warm's and warmup17's): 20 s each; only one is in the file
    assert written == {cw: 20.0}
    assert bl.load_baseline(f)["scenarios"][cw]["estimated_full_test_time_s"] == 20.0
    with pytest.raises(ValueError, match="no finished unit"):
        shards.refresh_estimates(f, [tmp_path / "nothing"])


def test_one_progress_bar_over_launches(tmp_path):
    import io

    from perfkit.measuring.progress import emit

    units = [WorkUnit(id="a", parts=[], launches=3), WorkUnit(id="b", parts=[], launches=2)]
    buf = io.StringIO()
    on_event, close = shards.progress_events(units, file=buf)

    def run_unit(unit, out_dir):
        emit("launch_done", label="x")  # what track_requests emits at the end of each launch
        if unit["id"] == "b":
            raise RuntimeError("no")

    shards.run_units_inprocess([u.to_dict() for u in units], run_unit, tmp_path, on_event=on_event)
    close()
    text = buf.getvalue()
    assert "5/5" in text and "1 failed" in text


def test_merge_refuses_what_is_not_a_shard(tmp_path):
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / shards.MANIFEST).write_text(json.dumps({"kind": "perfkit-shard", "params": {}}))
    with pytest.raises(ValueError, match="nothing to merge") as exc:
        shards.merge_shards([tmp_path / "empty", bad], tmp_path / "merged")
    assert "no shard.json" in str(exc.value) and "incomplete shard manifest" in str(exc.value)

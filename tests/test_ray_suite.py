"""``perfkit suite --executor ray`` on a local single-node Ray gives what the suite gives in
process: the small suite derived from params/ci-cpu.yaml (``test_scaleout_merge.small_params``:
timing invariants off, since two runs on a shared 2-core runner differ in timing), for real on
the tiny reference engine. The Ray run is the session's unsplit run (``scaleout_runs``, shared
with test_scaleout_merge); the in-process side is its shards 1/2 and 2/2, run in process and
merged (test_scaleout_merge checks the rest of that equality): same verdict rows, same tables
bar timing values, every unit's output back from its task."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfkit.bundle import ResultBundle
from perfkit.investigations.cold_warm import NAME as COLD_WARM
from perfkit.investigations.memory_budget import NAME as MEMORY_BUDGET
from perfkit.investigations.offload_modes import NAME as OFFLOAD_MODES
from perfkit.investigations.warmup_shapes import NAME as WARMUP_SHAPES
from perfkit.scaleout import shards

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))
from test_scaleout_merge import _tables, _verdict_rows  # noqa: E402


@pytest.mark.slow
def test_suite_through_ray_equals_in_process(scaleout_runs):
    assert scaleout_runs["executor"] == "ray"
    ray_proc, inp_proc = scaleout_runs["unsplit"], scaleout_runs["merged"]
    assert inp_proc.returncode in (0, 1), inp_proc.stdout + inp_proc.stderr[-3000:]
    assert ray_proc.returncode == inp_proc.returncode, ray_proc.stdout + ray_proc.stderr[-3000:]
    a, b = scaleout_runs["merged_dir"], scaleout_runs["unsplit_dir"]
    ra, rb = json.loads((a / "run.json").read_text()), json.loads((b / "run.json").read_text())
    assert ra["status"] == rb["status"]
    assert {n["name"]: n["status"] for n in ra["notebooks"]} == {
        n["name"]: n["status"] for n in rb["notebooks"]
    }
    assert _verdict_rows(a) == _verdict_rows(b)
    for name in (COLD_WARM, WARMUP_SHAPES, MEMORY_BUDGET, OFFLOAD_MODES):
        assert _tables(ResultBundle.load(a / name)) == _tables(ResultBundle.load(b / name)), name
    manifest = json.loads((b / "shards" / "1" / shards.MANIFEST).read_text())
    assert manifest["executor"] == "ray" and rb["scaleout"]["problems"] == []
    assert manifest["outcomes"] and all(o["status"] == "ok" and o["host"] for o in manifest["outcomes"])
    for o in manifest["outcomes"]:  # each unit's output came back from its task, unit.json beside it
        assert (b / "shards" / "1" / "units" / o["unit_id"] / "unit.json").is_file()
    walls = scaleout_runs["walls"]
    print(
        f"wall time: ray {walls['unsplit']:.0f} s, in-process shards {walls['s1'] + walls['s2']:.0f} s",
        file=sys.stderr,
    )

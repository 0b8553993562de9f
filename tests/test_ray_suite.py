"""``perfkit suite --executor ray`` on a local single-node Ray gives the verdict of the in-process
executor (the ci-cpu suite for real: the tiny reference engine on CPU, both executors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]


def _suite(out: Path, executor: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "perfkit.cli", "suite", "--params", "params/ci-cpu.yaml"]
        + ["--executor", executor, "--out", str(out), "--no-screenshot", "-q"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        },
    )
    return proc, time.monotonic() - t0


def _verdict(run: Path) -> tuple[str, list[tuple[str, str, str]]]:
    v = json.loads((run / "baseline_gate" / "verdict.json").read_text())
    return v["status"], sorted((r["case"], r["metric"], r["status"]) for r in v["rows"])


@pytest.mark.slow
def test_ci_cpu_suite_through_ray_gives_the_in_process_verdict(tmp_path):
    ray_proc, ray_s = _suite(tmp_path / "ray", "ray")
    assert ray_proc.returncode == 0, ray_proc.stdout[-3000:] + ray_proc.stderr[-3000:]
    inp_proc, inp_s = _suite(tmp_path / "inprocess", "inprocess")
    assert inp_proc.returncode == 0, inp_proc.stdout[-3000:] + inp_proc.stderr[-3000:]
    assert _verdict(tmp_path / "ray") == _verdict(tmp_path / "inprocess")
    assert _verdict(tmp_path / "ray")[0] == "pass"
    shard = json.loads((tmp_path / "ray" / "shards" / "1" / "shard.json").read_text())
    assert shard["executor"] == "ray"
    assert shard["outcomes"] and all(o["status"] == "ok" and o["host"] for o in shard["outcomes"])
    for o in shard["outcomes"]:  # each unit's output came back from its task
        assert (tmp_path / "ray" / "shards" / "1" / "units" / o["unit_id"] / "unit.json").is_file()
    print(f"ci-cpu wall time: ray {ray_s:.0f} s, in-process {inp_s:.0f} s")

"""The Ray executor on a real local Ray (logical GPUs declared with ``num_gpus=2``; no CUDA)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from perfkit.scaleout.ray_executor import (  # noqa: E402
    default_runtime_env,
    pack_dir,
    run_units_ray,
    unit_dir_name,
    unpack_dir,
)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module: 2 CPUs, 2 logical GPUs (without ``num_gpus`` a GPU task
    never schedules on a host without GPUs)."""
    if ray.is_initialized():
        ray.shutdown()
    here = Path(__file__).resolve().parent
    src = str(here.parent / "src")
    path = os.pathsep.join(
        [src, str(here)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield ray
    ray.shutdown()


# run_unit functions (module level: pickled by reference, so tests/ is on the workers' path)
def _write_gpu_ids(unit, out: Path) -> None:
    import ray as r

    (out / "bundle").mkdir()
    (out / "bundle" / "seen.json").write_text(
        json.dumps(
            {
                "gpu_ids": [str(g) for g in r.get_gpu_ids()],
                "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "omp": os.environ.get("OMP_NUM_THREADS"),
            }
        )
    )
    from perfkit.measuring.progress import track_requests

    for launch in range(int(unit.get("launches", 0))):  # what an engine launch reports
        list(track_requests([1, 2], f"launch{launch}"))
    time.sleep(float(unit.get("sleep", 0)))
    if unit.get("barrier"):  # wait (up to 60 s) until every peer has started too
        b = Path(unit["barrier"])
        (b / f"{unit['id']}.started").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all((b / f"{p}.started").exists() for p in unit["peers"]):
            time.sleep(0.05)


def _fail(unit, out: Path) -> None:
    (out / "partial.txt").write_text("half")
    (out / "engine").mkdir()
    (out / "engine" / "stderr.log").write_text("CUDA error: out of memory\n")
    raise RuntimeError(f"engine {unit['id']} exited with code 3")


def _crash(unit, out: Path) -> None:
    os._exit(1)


def test_two_gpu_unit_sees_both_gpus_without_cuda(local_ray, tmp_path):
    events = []
    [oc] = run_units_ray(
        [{"id": "cfg2", "gpus": 2, "launches": 2}],
        _write_gpu_ids,
        tmp_path,
        on_event=lambda e, uid, o: events.append((e, uid)),
    )
    assert oc.status == "ok", oc.log_tail
    seen = json.loads((tmp_path / "cfg2" / "bundle" / "seen.json").read_text())
    assert sorted(seen["gpu_ids"]) == ["0", "1"]
    assert sorted(seen["cvd"].split(",")) == ["0", "1"]  # what an engine launched here inherits
    assert seen["omp"] == os.environ.get("OMP_NUM_THREADS")  # the driver's, not Ray's task CPUs
    assert oc.out_dir == tmp_path / "cfg2" and oc.attempts == 1 and oc.host
    assert oc.gpu_uuids == []  # logical GPUs: no NVML device behind them
    assert events == [("started", "cfg2"), ("launch", "cfg2"), ("launch", "cfg2"), ("finished", "cfg2")]


def test_one_gpu_units_run_side_by_side_on_different_gpus(local_ray, tmp_path):
    # each unit waits until the other has started: they overlap only when Ray runs them at once
    (tmp_path / "barrier").mkdir()
    units = [{"id": u, "gpus": 1, "barrier": str(tmp_path / "barrier"), "peers": ["a", "b"]} for u in "ab"]
    out = run_units_ray(units, _write_gpu_ids, tmp_path / "out")
    tmp_path = tmp_path / "out"
    assert [o.unit_id for o in out] == ["a", "b"] and all(o.status == "ok" for o in out)
    a, b = out
    assert a.started_at < b.ended_at and b.started_at < a.ended_at, "the two units did not overlap"
    ids = [json.loads((tmp_path / u / "bundle" / "seen.json").read_text())["gpu_ids"] for u in ("a", "b")]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]


def test_cpu_units_have_the_node_to_themselves(local_ray, tmp_path):
    # a CPU unit asks for every CPU of the node; sending its progress events must not give them
    # back to Ray meanwhile (a task blocked in ray.get does), or the next unit would start beside it
    units = [{"id": f"cpu{i}", "gpus": 0, "launches": 30, "sleep": 1.0} for i in (1, 2)]
    a, b = run_units_ray(units, _write_gpu_ids, tmp_path)
    assert a.status == b.status == "ok"
    assert a.ended_at <= b.started_at or b.ended_at <= a.started_at, "two CPU units overlapped"


def test_failing_unit_is_retried_then_an_error_and_crash_does_not_stop_others(local_ray, tmp_path):
    events = []
    units = [
        {"id": "bad", "gpus": 0},
        {"id": "crash", "gpus": 1},
        {"id": "good", "gpus": 1},
    ]

    def run(unit, out):
        {"bad": _fail, "crash": _crash, "good": _write_gpu_ids}[unit["id"]](unit, out)

    out = run_units_ray(units, run, tmp_path, retries=1, on_event=lambda e, uid, o: events.append((e, uid)))
    bad, crash, good = out
    assert bad.status == "error" and bad.attempts == 2
    assert bad.error == "RuntimeError: engine bad exited with code 3"
    assert "Traceback" in bad.log_tail and "exited with code 3" in bad.log_tail
    assert "--- engine/stderr.log (end) ---\nCUDA error: out of memory" in bad.log_tail
    assert (tmp_path / "bad" / "partial.txt").read_text() == "half"  # a failed unit's output kept
    assert crash.status == "error" and crash.attempts == 2 and crash.out_dir is None
    doc = json.loads((tmp_path / "crash" / "unit.json").read_text())
    assert doc["unit"]["id"] == "crash" and doc["outcome"]["status"] == "error"
    assert crash.error.startswith("WorkerCrashedError: The worker died"), crash.error
    assert good.status == "ok" and good.attempts == 1
    assert events.count(("retry", "bad")) == 1 and events.count(("retry", "crash")) == 1
    assert events.count(("started", "bad")) == 2  # each attempt, when its task starts
    assert sorted(uid for e, uid in events if e == "finished") == ["bad", "crash", "good"]


def test_archive_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "cold_warm" / "tables").mkdir(parents=True)
    (src / "cold_warm" / "meta.json").write_text('{"a": 1}')
    (src / "cold_warm" / "tables" / "x.bin").write_bytes(bytes(range(256)) * 100)
    (src / "empty").mkdir()
    data = pack_dir(src)
    d = unpack_dir(data, tmp_path / "dst")
    files = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
    assert files == sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
    assert (d / "cold_warm" / "tables" / "x.bin").read_bytes() == bytes(range(256)) * 100
    assert (d / "cold_warm" / "meta.json").read_text() == '{"a": 1}'


def test_bad_units_are_refused_before_ray(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        run_units_ray([{"id": "a", "gpus": 0}, {"id": "a", "gpus": 0}], _fail, tmp_path)
    with pytest.raises(ValueError, match="gpus"):
        run_units_ray([{"id": "a", "gpus": 1.5}], _fail, tmp_path)
    assert unit_dir_name("cold_warm/h200 x2") == "cold_warm_h200_x2"


def test_without_ray_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    from perfkit.scaleout.shards import ExecutorError  # exit 2 in the CLI

    with pytest.raises(ExecutorError, match=r"pip install 'perfkit\[ray\]'"):
        run_units_ray([{"id": "a", "gpus": 0}], _fail, tmp_path)


def test_runtime_env_ships_perfkit_and_its_variables_not_secrets(monkeypatch):
    import perfkit

    monkeypatch.setenv("PERFKIT_FOO", "1")
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("SGLANG_API_KEY", "k")
    monkeypatch.setenv("UNRELATED", "x")
    pkg = Path(perfkit.__file__).resolve().parent
    local = default_runtime_env(None)
    ev = local["env_vars"]
    assert ev["PERFKIT_FOO"] == "1" and ev["HF_HOME"] == "/models"
    assert "HF_TOKEN" not in ev and "SGLANG_API_KEY" not in ev and "UNRELATED" not in ev
    assert ev["PYTHONPATH"].split(os.pathsep)[0] == str(pkg.parent) and "py_modules" not in local
    cluster = default_runtime_env("auto")
    assert cluster["py_modules"] == [str(pkg)] and "PYTHONPATH" not in cluster["env_vars"]

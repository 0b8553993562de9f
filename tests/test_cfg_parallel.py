"""The reference engine with ``--num-gpus 2`` on the CPU: CFG parallel over two gloo ranks.

Started through :func:`perfkit.engine.launch.launch`, as investigations start it. Checks: a request completes,
both ranks' timings are in its record, memory snapshots are the max across ranks, the frames match
the single-process engine for the same seed, the multi-GPU two-stage warmup option, a dead rank
makes the engine unhealthy, and teardown leaves no rank alive.
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import httpx
import numpy as np
import psutil
import pytest

from perfkit.engine.launch import launch
from perfkit.engine.spec import EngineSpec
from perfkit.refengine.cli import main as engine_main
from perfkit.refengine.profiling import max_snapshots
from refengine_helpers import spec

pytestmark = pytest.mark.slow

STAGES = ["TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage"]


def _spec(**kw) -> EngineSpec:
    base = dict(preset="tiny", device="cpu", num_gpus=2, warmup_frames=9, startup_timeout_s=240.0)
    base.update(kw)
    return EngineSpec(**base)


def _ranks(h) -> list[psutil.Process]:
    return psutil.Process(h.pid).children(recursive=True)


def _ok(out):
    assert out.ok, f"{out.status}: {out.error}"
    assert out.record is not None
    return out.record


def _frames(h, out) -> np.ndarray:
    return np.load(h.perf_log_dir / "outputs" / f"{out.request_id}.npy")


def test_two_ranks_complete_a_request_with_both_ranks_timed_and_match_one_process(tmp_path):
    req = spec(24, steps=4, seed=7)
    with launch(_spec(keep_outputs=True), run_dir=tmp_path, label="cfg2") as h:
        children = _ranks(h)
        assert [c.cmdline()[-6:-4] for c in children] == [["--rank", "1"]]
        with _client(h) as c:
            out = c.generate(req)
        rec = _ok(out)
        got = _frames(h, out)
        warm = [r for r in h.records() if r.is_warmup]
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], (
        "a rank survived teardown"
    )

    pk = rec.perfkit
    assert pk["num_gpus"] == 2 and pk["parallelism"] == "cfg"
    assert pk["num_frames_effective"] == 25 and pk["latent_frames"] == 4  # 8k+1 for any N
    assert [n for n, _ in rec.stages] == STAGES  # rank 0's stages
    ranks = pk["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [s["name"] for s in ranks[0]["stages"]] == STAGES
    assert [s["name"] for s in ranks[1]["stages"]] == STAGES[:3]  # only rank 0 decodes
    for r in ranks:
        assert len(r["steps"]) == 4 and all(ms > 0 for ms in r["steps"])
        # where each step's time went on this rank: its transformer branch vs the all_gather wait
        assert len(r["cfg_compute_ms"]) == len(r["cfg_gather_ms"]) == 4
        assert all(ms > 0 for ms in r["cfg_compute_ms"]) and all(ms >= 0 for ms in r["cfg_gather_ms"])
        assert sum(r["cfg_compute_ms"]) <= sum(r["steps"])
        assert all(s["execution_time_ms"] > 0 for s in r["stages"])
        assert r["host_anon_mib"] > 0
    assert rec.steps == ranks[0]["steps"]
    assert rec.raw["memory_snapshots"] == {}  # CPU: no device snapshots on any rank
    assert len(warm) == 1 and [r["rank"] for r in warm[0].perfkit["ranks"]] == [0, 1]
    assert warm[0].perfkit["warmup_frames"] == 9 and warm[0].perfkit["warmup_frames_rule"] == "generic"

    with launch(_spec(num_gpus=1, keep_outputs=True), run_dir=tmp_path, label="single") as h1:
        with _client(h1) as c:
            out1 = c.generate(req)
        ref = _frames(h1, out1)
        assert "ranks" not in _ok(out1).perfkit
    assert got.shape == ref.shape
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())


def test_multi_gpu_two_stage_warmup_frames_option_covers_the_24_frame_request(tmp_path):
    s = _spec(two_stage=True, warmup_frames=17, extra_args=["--multi-gpu-warmup-frames", "25"])
    with launch(s, run_dir=tmp_path, label="two-stage") as h, _client(h) as c:
        rec = _ok(c.generate(spec(24, steps=2)))
        warm = [r for r in h.records() if r.is_warmup][0]
    wp = warm.perfkit
    assert wp["warmup_frames"] == 25 and wp["warmup_frames_rule"] == "multi_gpu_two_stage"
    assert wp["multi_gpu_warmup_frames"] == 25
    assert wp["num_frames_effective"] == 25 and wp["latent_frames"] == 4
    assert rec.perfkit["latent_shape"] == wp["latent_shape"]  # covered shape
    for r in rec.perfkit["ranks"]:
        assert "RefinementStage" in [st["name"] for st in r["stages"]]
        assert len(r["refinement_steps"]) == 2


def test_a_dead_rank_makes_the_engine_unhealthy_and_requests_fail(tmp_path):
    with launch(_spec(warmup_frames=0), run_dir=tmp_path, label="dead") as h, _client(h) as c:
        (child,) = _ranks(h)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while c.health() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = httpx.get(c.base_url + "/health")
        assert r.status_code == 503 and "rank 1" in r.json()["error"]
        out = c.generate(spec(17, steps=2))
        assert out.status == "failed" and "rank 1" in (out.error or "")
        assert h.alive()


def test_max_snapshots_takes_the_max_of_each_field_across_ranks():
    a = {
        "load_peak": {"allocated_mb": 10.0, "peak_allocated_mb": 30.0},
        "runtime_peak": {"peak_allocated_mb": 5.0},
    }
    b = {
        "load_peak": {"allocated_mb": 12.0, "peak_allocated_mb": 20.0},
        "warmup_peak": {"peak_allocated_mb": 7.0},
    }
    assert max_snapshots([a, b]) == {
        "load_peak": {"allocated_mb": 12.0, "peak_allocated_mb": 30.0},
        "runtime_peak": {"peak_allocated_mb": 5.0},
        "warmup_peak": {"peak_allocated_mb": 7.0},
    }


def test_the_server_aligns_and_profiles_on_the_pipeline_behind_rank0s_runner(tmp_path, monkeypatch):
    """With --num-gpus > 1 requests go through dist.Rank0Runner: the frame alignment (the VAE's
    temporal factor) and the request's profiler are the StagedPipeline's, not the runner's."""
    import torch

    from perfkit.refengine.dist import Rank0Runner
    from perfkit.refengine.jobs import GenRequest, RunResult
    from perfkit.refengine.server import Engine

    monkeypatch.setenv("SGLANG_DIFFUSION_TORCH_PROFILER_DIR", str(tmp_path))
    profiled = []

    def run(req, keep_output=False, slow=False):
        profiled.append(pipe.profiler is not None)
        return RunResult()

    pipe = SimpleNamespace(temporal=4, device=torch.device("cpu"), profiler=None, run=run)
    runner = Rank0Runner([])
    runner.attach(pipe, SimpleNamespace(broadcast=lambda msg: msg, gather=lambda obj: [obj]))
    defaults = {"height": 64, "width": 64, "steps": 2, "num_frames": 9}
    engine = Engine(pipe, defaults, 257, None, {}, runner=runner)
    profile = {"all_stages": True, "num_profiled_timesteps": None}
    job = engine.submit(GenRequest("a cat", 10, 64, 64, 2), profile=profile)
    assert job.done.wait(60)
    runner.stopping = True
    assert job.status == "completed", job.error
    assert job.effective_frames == 13  # 4k + 1 for this VAE (8k + 1 would be 17)
    assert profiled == [True]


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-gpus", "0"],
        ["--num-gpus", "2", "--rank", "1"],
        ["--cpu-threads", "0"],
        # found probing: torch took 10**9 and libgomp died at the first parallel region ("Out of
        # memory allocating 216000001344 bytes"); 10**30 raised a traceback in torch
        ["--cpu-threads", str(10**9)],
        ["--cpu-threads", str(10**30)],
        ["--cpu-threads", str((os.cpu_count() or 1) + 1)],
    ],
)
def test_bad_parallel_arguments_exit_2(argv, capsys):
    assert engine_main(["--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and argv[0] in err
    assert argv[0] != "--cpu-threads" or f"got {argv[1]}" in err  # the value as given


def _client(h):
    from perfkit.engine.client import VideoClient

    return VideoClient(h.base_url, perf_log_dir=h.perf_log_dir, timeout_s=300.0)


def test_no_rank_outlives_rank_0_killed_alone(tmp_path):
    with launch(_spec(warmup_frames=0), run_dir=tmp_path, label="kill0") as h:
        (child,) = _ranks(h)
        os.kill(h.pid, signal.SIGKILL)  # rank 0 only, not the group: the kernel kills rank 1
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, f"rank 1 (pid {child.pid}) outlived rank 0"


def test_warmup_shapes_on_two_ranks_reports_each_rank_and_steady_state_across_warmups(tmp_path):
    """Seed 003's investigation on two gloo ranks: per rank the first request's compiles and
    where its penalty sits, the warm step split (branch vs all_gather wait), and the warm median
    after each warmup setting compared with an interval."""
    from perfkit.investigations.warmup_shapes import reading, warmup_shapes

    s = _spec(compile=True, compile_backend="aot_eager", warmup_frames=17)
    b = warmup_shapes(s, warmup_frames=[17, 25], request_frames=[24], repeats=3, run_dir=tmp_path)
    cov = {c["warmup_frames"]: c for c in b.results["coverage"]}
    assert cov[17]["covered"] is False and cov[25]["covered"] is True
    for w, c in cov.items():
        ranks = c["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for r in ranks:
            assert r["warm_step_median_ms"] > 0 and r["warm_compute_median_ms"] > 0
            assert r["warm_gather_median_ms"] >= 0 and r["warm_compiles"] == 0
        if w == 17:  # both ranks recompile for the uncovered shape, in DenoisingStage
            assert all(r["first_compiles"] >= 1 and r["penalty_stage"] == "DenoisingStage" for r in ranks)
        else:
            assert all(r["first_compiles"] == 0 for r in ranks)
    (x,) = b.results["warm_across_warmups"]
    assert (x["warmup_frames"], x["vs_warmup_frames"], x["request_frames"]) == (25, 17, 24)
    lo, hi = x["ratio_ci"]
    assert 0 < lo <= x["ratio"] <= hi and x["n"] == [2, 2]
    text = reading(b.results)
    assert "rank 1" in text and "all_gather wait" in text and "Steady state, request 24 frames" in text

"""Record what real sglang writes, for tests/fixtures/sglang/<version>/<case>/ (docs/sglang.md).

    python deploy/sglang/record.py CASE OUT_DIR [--venv .sglang-venv] [--port 30341]

Builds the case's tiny model (deploy/sglang/tiny_models.py) under OUT_DIR/work, serves it with
``sglang serve`` (stage logging, perf log dir, torch profiler dir, ``--enable-metrics``), sends the
case's requests one at a time, then writes into OUT_DIR: performance.log, perf_dump.json (the
first request's ``perf_dump_path``), jobs.json (each request body, its POST /v1/videos answer
and its final GET /v1/videos/{id}), server.log (start up to the first request), metrics.prom and
the profiler traces. Stdlib only; the server is killed with its process group.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPT = "a cat walks on the beach at sunset, cinematic"
#: case -> (tiny_models family, extra serve flags, request bodies)
CASES = {
    "ltx-2": (
        "ltx-2",
        ["--warmup-mode", "server", "--warmup-num-frames", "17", "--warmup-resolutions", "64x64",
         "--warmup-steps", "2"],
        [
            {"num_frames": 17, "num_inference_steps": 3, "perf_dump": True},
            {"num_frames": 25, "num_inference_steps": 3},
            {"num_frames": 17, "num_inference_steps": 3, "profile": True, "num_profiled_timesteps": 1},
            {"num_frames": 17, "num_inference_steps": 2, "profile": True, "profile_all_stages": True},
        ],
    ),
    "ltx-video-diffusers": (
        "ltx-video",
        ["--backend", "diffusers", "--warmup-mode", "off"],
        [
            {"num_frames": 9, "num_inference_steps": 3, "perf_dump": True},
            {"num_frames": 17, "num_inference_steps": 3},
        ],
    ),
}  # fmt: skip


def _call(base: str, method: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _video(base: str, body: dict) -> dict:
    post = _call(base, "POST", "/v1/videos", body)
    job = post
    while job.get("status") not in ("completed", "failed", "error", "cancelled"):
        time.sleep(0.2)
        job = _call(base, "GET", f"/v1/videos/{post['id']}")
    return {"request": body, "post": post, "final": job}


def record(case: str, out: Path, venv: Path, port: int) -> None:
    """Serve the case's model, send its requests, copy what sglang wrote into ``out``."""
    family, flags, bodies = CASES[case]
    work = out / "work"
    perf, prof = work / "perf", work / "profiles"
    for d in (perf, prof):
        d.mkdir(parents=True, exist_ok=True)
    py = str(venv / "bin" / "python")
    builder = Path(__file__).with_name("tiny_models.py")
    model = subprocess.run([py, str(builder), family, str(work)], check=True, capture_output=True, text=True)
    model_dir = model.stdout.strip().splitlines()[-1]
    env = dict(os.environ, SGLANG_DIFFUSION_STAGE_LOGGING="1", SGLANG_PERF_LOG_DIR=str(perf),
               SGLANG_TORCH_PROFILER_DIR=str(prof), HF_HUB_OFFLINE="1")  # fmt: skip
    cmd = [str(venv / "bin" / "sglang"), "serve", "--model-path", model_dir, "--port", str(port),
           "--host", "127.0.0.1", "--num-gpus", "1", "--enable-metrics", *flags]  # fmt: skip
    (work / "command.txt").write_text(" ".join(cmd) + "\n")
    log = open(work / "server.log", "wb")
    t0 = time.monotonic()
    srv = subprocess.Popen(
        cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if srv.poll() is not None or time.monotonic() - t0 > 900:
                sys.exit(f"server did not become healthy; see {work / 'server.log'}")
            try:
                urllib.request.urlopen(base + "/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        ready_s = time.monotonic() - t0
        log.flush()
        shutil.copy(work / "server.log", out / "server.log")  # start up to the first request
        jobs = []
        for i, b in enumerate(bodies):
            body = {"prompt": PROMPT, "height": 64, "width": 64, "seed": 0, **b}
            if body.pop("perf_dump", False):
                body["perf_dump_path"] = str(work / "perf_dump.json")
            jobs.append(_video(base, body))
            print(
                f"request {i}: {jobs[-1]['final'].get('status')} {jobs[-1]['final'].get('inference_time_s')} s"
            )
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            (out / "metrics.prom").write_bytes(r.read())
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(60)
    (out / "jobs.json").write_text(json.dumps(jobs, indent=1) + "\n")
    shutil.copy(perf / "performance.log", out / "performance.log")
    shutil.copy(work / "perf_dump.json", out / "perf_dump.json")
    for t in sorted(prof.glob("*.trace.json.gz")):
        shutil.copy(t, out / t.name)
    print(f"ready after {ready_s:.1f} s; model {model_dir}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--venv", type=Path, default=Path(os.environ.get("SGLANG_VENV", ".sglang-venv")))
    ap.add_argument("--port", type=int, default=30341)
    a = ap.parse_args()
    record(a.case, a.out.resolve(), a.venv.resolve(), a.port)

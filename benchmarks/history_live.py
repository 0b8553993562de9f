"""Live benchmark of the history: 24 short runs of the tiny reference engine on CPU, the
injected DenoisingStage +30 % from run 13 on (the reference engine's test-only
``debug_stage_delay``), each run stored as commit ``run01`` .. ``run24``.

Expected: one change point in ``DenoisingStage_ms`` at run 13 ± 1 and no other; ``perfkit
history check --confirm 1`` (alarm at the first run above the level) on run 12 (against runs
1–11) exits 0 and on run 13 (against runs 1–12) exits 1. Prints the change points of every series of the case and both exit codes.

    PYTHONPATH=src python benchmarks/history_live.py [--runs 24] [--from 13] [--out outputs/history-live]
    # on a GPU host: --device cuda --measure-only, then here --judge-only on the copied runs

Each run is ``python -m perfkit.measure --only`` the cold/warm session (params/ci-cpu.yaml, compile off to
keep a launch short), about 20 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def measure(
    out: Path,
    runs: int,
    first_slow: int,
    device: str,
    threads: int = 0,
    steps: int = 0,
    lanes: int = 1,
    size: int = 0,
) -> None:
    """``runs`` measured runs of the cold/warm session into ``out/runNN/`` (no history import:
    this part also runs on a host without perfkit's history dependencies).

    ``threads``: the engine's torch threads on CPU (``OMP_NUM_THREADS``; 0: the engine's default,
    every core). ``steps``: the request's denoising steps, ``size``: its height and width in pixels
    (0: params/ci-cpu.yaml's). ``lanes``: runs
    measured side by side, each lane pinned to its own cores (``os.sched_setaffinity``); run i goes
    to lane i mod lanes, so a lane's bias is spread over the history, not turned into a step."""
    from concurrent.futures import ThreadPoolExecutor

    from perfkit.investigations import registry

    SESSION = registry.session_name()  # the investigation whose bundle is one session
    base = yaml.safe_load((ROOT / "params/ci-cpu.yaml").read_text())
    cores = sorted(os.sched_getaffinity(0))
    per_lane = max(1, len(cores) // lanes)

    def one(i: int) -> None:
        p = dict(base)
        p["engine"] = {**base["engine"], "compile": False, "device": device}
        if threads:
            env = dict(p["engine"].get("env") or {})
            env.update({"PERFKIT_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)})
            p["engine"]["env"] = env
        p["request"] = dict(base["request"])
        if steps:
            p["request"]["num_inference_steps"] = steps
        if size:
            p["request"].update(height=size, width=size)
        if device != "cpu":
            p["engine"]["dtype"] = "bfloat16"
        if i >= first_slow:
            p["engine"]["debug_stage_delay"] = {"DenoisingStage": "30%"}
        pf = out / f"params-{i:02d}.yaml"
        pf.parent.mkdir(parents=True, exist_ok=True)
        pf.write_text(yaml.safe_dump(p))
        cmd = [
            sys.executable,
            "-m",
            "perfkit.measure",
            "--params",
            str(pf),
            "--out",
            str(out / f"run{i:02d}"),
        ]
        lane = (i - 1) % lanes
        mine = set(cores[lane * per_lane : (lane + 1) * per_lane]) if lanes > 1 else set(cores)
        proc = subprocess.run(
            [*cmd, "--only", SESSION],
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, mine),  # noqa: PLW0108
        )
        if proc.returncode != 0:
            raise SystemExit(f"run {i}: measure failed ({proc.returncode}): {proc.stderr[-2000:]}")
        print(f"run {i} measured (lane {lane})", flush=True)

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        for _ in pool.map(one, range(1, runs + 1)):
            pass


def judge(out: Path, runs: int, first_slow: int, hardware: str) -> dict[int, int]:
    """Store the runs one by one as commits run01..; check runs ``first_slow − 1`` and
    ``first_slow`` before storing them (``--confirm 1``); print every series' steps. Returns the exit codes."""
    from perfkit.history import changepoints as cp
    from perfkit.history.check import add, check
    from perfkit.history.store import read_store
    from perfkit.investigations import registry

    SESSION = registry.session_name()  # the investigation whose bundle is one session
    store = out / "store"
    shutil.rmtree(store, ignore_errors=True)
    codes = {}
    for i in range(1, runs + 1):
        bundle = out / f"run{i:02d}" / SESSION
        if i in (first_slow - 1, first_slow):
            res, summary = check(
                store, bundle, out / f"check{i:02d}", commit=f"run{i:02d}", hardware=hardware,
                settings=cp.Settings(confirm_runs=1),
            )  # fmt: skip
            codes[i] = res.exit_code
            print(f"history check on run {i}: exit {res.exit_code} ({summary})")
        add(store, [bundle], commit=f"run{i:02d}", hardware=hardware)
    for an in cp.analyse_frame(read_store(store)):
        steps = ", ".join(f"{s.after.commit} ({s.change_pct:+.1f} %)" for s in an.steps) or "none"
        print(
            f"{an.case_id} {an.metric}: steps at {steps}; outliers {len(an.outliers)}; noise {an.noise:.1%}"
        )
    print(f"check exit codes: {codes} (expected: run {first_slow - 1} -> 0, run {first_slow} -> 1)")
    return codes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--from", dest="first_slow", type=int, default=13)
    ap.add_argument("--out", default="outputs/history-live")
    ap.add_argument("--device", default="cpu", help="the reference engine's device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=0, help="the engine's torch threads on CPU (0: all cores)")
    ap.add_argument(
        "--steps", type=int, default=0, help="denoising steps a request (0: params/ci-cpu.yaml's)"
    )
    ap.add_argument(
        "--size", type=int, default=0, help="request height and width, px (0: params/ci-cpu.yaml's)"
    )
    ap.add_argument("--lanes", type=int, default=1, help="runs measured side by side, each on its own cores")
    ap.add_argument("--measure-only", action="store_true", help="measure, store nothing (e.g. on a GPU host)")
    ap.add_argument(
        "--judge-only", action="store_true", help="store and judge runs already measured in --out"
    )
    a = ap.parse_args()
    out = Path(a.out)
    if not a.judge_only:
        shutil.rmtree(out, ignore_errors=True)
        measure(out, a.runs, a.first_slow, a.device, a.threads, a.steps, a.lanes, a.size)
    if not a.measure_only:
        judge(out, a.runs, a.first_slow, hardware=f"live-{a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Live benchmark of the history: 24 short runs of the tiny reference engine on CPU, the
injected DenoisingStage +30 % from run 13 on (the reference engine's test-only
``debug_stage_delay``), each run stored as commit ``run01`` .. ``run24``.

Expected: one change point in ``DenoisingStage_ms`` at run 13 ± 1 and no other; ``perfkit
history check`` on run 12 (against runs 1–11) exits 0 and on run 13 (against runs 1–12)
exits 1. Prints the change points of every series of the case and both exit codes.

    PYTHONPATH=src python benchmarks/history_live.py [--runs 24] [--from 13] [--out outputs/history-live]
    # on a GPU host: --device cuda --measure-only, then here --judge-only on the copied runs

Each run is ``python -m perfkit.measure --only`` the cold/warm session (params/ci-cpu.yaml, compile off to
keep a launch short), about 20 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def measure(out: Path, runs: int, first_slow: int, device: str) -> None:
    """``runs`` measured runs of the cold/warm session into ``out/runNN/`` (no history import:
    this part also runs on a host without perfkit's history dependencies)."""
    from perfkit.scenarios.cold_warm import NAME as SESSION

    base = yaml.safe_load((ROOT / "params/ci-cpu.yaml").read_text())
    for i in range(1, runs + 1):
        p = dict(base)
        p["engine"] = {**base["engine"], "compile": False, "device": device}
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
        proc = subprocess.run([*cmd, "--only", SESSION], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"run {i}: measure failed ({proc.returncode}): {proc.stderr[-2000:]}")
        print(f"run {i} measured", flush=True)


def judge(out: Path, runs: int, first_slow: int, hardware: str) -> dict[int, int]:
    """Store the runs one by one as commits run01..; check runs ``first_slow − 1`` and
    ``first_slow`` before storing them; print every series' steps. Returns the exit codes."""
    from perfkit.history import changepoints as cp
    from perfkit.history.api import add, check
    from perfkit.history.store import read_store
    from perfkit.scenarios.cold_warm import NAME as SESSION

    store = out / "store"
    shutil.rmtree(store, ignore_errors=True)
    codes = {}
    for i in range(1, runs + 1):
        bundle = out / f"run{i:02d}" / SESSION
        if i in (first_slow - 1, first_slow):
            res, summary = check(
                store, bundle, out / f"check{i:02d}", commit=f"run{i:02d}", hardware=hardware
            )
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
    ap.add_argument("--measure-only", action="store_true", help="measure, store nothing (e.g. on a GPU host)")
    ap.add_argument(
        "--judge-only", action="store_true", help="store and judge runs already measured in --out"
    )
    a = ap.parse_args()
    out = Path(a.out)
    if not a.judge_only:
        shutil.rmtree(out, ignore_errors=True)
        measure(out, a.runs, a.first_slow, a.device)
    if not a.measure_only:
        judge(out, a.runs, a.first_slow, hardware=f"live-{a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

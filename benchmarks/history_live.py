"""Live benchmark of the history: 24 short runs of the tiny reference engine on CPU, the
injected DenoisingStage +30 % from run 13 on (the reference engine's test-only
``debug_stage_delay``), each run stored as commit ``run01`` .. ``run24``.

Expected: one change point in ``DenoisingStage_ms`` at run 13 ± 1 and no other; ``perfkit
history check`` on run 12 (against runs 1–11) exits 0 and on run 13 (against runs 1–12)
exits 1. Prints the change points of every series of the case and both exit codes.

    PYTHONPATH=src python benchmarks/history_live.py [--runs 24] [--from 13] [--out outputs/history-live]

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--from", dest="first_slow", type=int, default=13)
    ap.add_argument("--out", default="outputs/history-live")
    a = ap.parse_args()
    from perfkit.history import changepoints as cp
    from perfkit.history.api import add, check
    from perfkit.history.store import read_store
    from perfkit.scenarios.cold_warm import NAME as SESSION

    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    store = out / "store"
    base = yaml.safe_load((ROOT / "params/ci-cpu.yaml").read_text())
    codes = {}
    for i in range(1, a.runs + 1):
        p = dict(base)
        p["engine"] = {**base["engine"], "compile": False}
        if i >= a.first_slow:
            p["engine"]["debug_stage_delay"] = {"DenoisingStage": "30%"}
        pf = out / f"params-{i:02d}.yaml"
        pf.parent.mkdir(parents=True, exist_ok=True)
        pf.write_text(yaml.safe_dump(p))
        run = out / f"run{i:02d}"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "perfkit.measure",
                "--params",
                str(pf),
                "--out",
                str(run),
                "--only",
                SESSION,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            print(f"run {i}: measure failed ({proc.returncode}): {proc.stderr[-2000:]}")
            return 2
        bundle = run / SESSION
        if i in (a.first_slow - 1, a.first_slow):
            res, summary = check(store, bundle, run, commit=f"run{i:02d}", hardware="ci-cpu")
            codes[i] = res.exit_code
            print(f"history check on run {i}: exit {res.exit_code} ({summary})")
        add(store, [bundle], commit=f"run{i:02d}", hardware="ci-cpu")
        print(f"run {i} stored", flush=True)
    for an in cp.analyse_frame(read_store(store)):
        steps = ", ".join(f"{s.after.commit} ({s.change_pct:+.1f} %)" for s in an.steps) or "none"
        print(f"{an.case_id} {an.metric}: steps at {steps}; outliers {len(an.outliers)}")
    print(f"check exit codes: {codes} (expected: run {a.first_slow - 1} -> 0, run {a.first_slow} -> 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

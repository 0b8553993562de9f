"""Benchmark: import and change points for 10,000 runs × 50 metrics (target: ≤ 30 s, ≤ 1 GiB).

Writes 10,000 sglang nightly comparison files (50 cases each, log-normal 2 % noise, a +8 %
step in every fifth case at run 6,000, a 5× outlier every 997 runs, an error every 501 runs)
to a temporary directory, then times, in this process:

1. ``perfkit.history.check.import_nightly`` (parse + validate every file, store them: one
   parquet file),
2. ``read_store`` (DuckDB over the store),
3. ``changepoints.analyse_frame`` (50 series of 10,000 runs: outliers, Otava, intervals; in
   this process: 2 spawned processes, once tried, cost 6.5 s more CPU and 270 MiB more in
   this process, measured),

and prints each phase's wall time, the peak RSS of this process (``ru_maxrss``) and what was
found. Writing the input files is not timed (it is the nightly job's part).

    PYTHONPATH=src python benchmarks/history_scale.py [--runs 10000] [--cases 50]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np


def write_files(d: Path, runs: int, cases: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    base = 10 * np.exp(rng.normal(0, 1, cases))
    for i in range(runs):
        vals = base * np.exp(rng.normal(0, 0.02, cases))
        if i >= int(runs * 0.6):
            vals[::5] *= 1.08
        if i % 997 == 500:
            vals *= 5
        results = [
            {
                "case_id": f"case{c:02d}",
                "framework": "sglang",
                "model": "m",
                "task": "t",
                "latency_s": None if i % 501 == 250 else round(float(vals[c]), 4),
                "error": "Server did not start" if i % 501 == 250 else None,
            }
            for c in range(cases)
        ]
        doc = {
            "timestamp": (t0 + timedelta(hours=6 * i)).isoformat(),
            "commit_sha": f"{i:040x}",
            "run_id": str(100000 + i),
            "results": results,
        }
        (d / f"{i:06d}.json").write_text(json.dumps(doc))


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--cases", type=int, default=50)
    a = ap.parse_args()
    from perfkit.history import changepoints as cp
    from perfkit.history.check import import_nightly
    from perfkit.history.store import ANALYSIS_COLUMNS, read_store

    with tempfile.TemporaryDirectory() as tmp:
        src, store = Path(tmp) / "in", Path(tmp) / "store"
        src.mkdir()
        t = time.perf_counter()
        write_files(src, a.runs, a.cases)
        print(f"wrote {a.runs} files × {a.cases} cases in {time.perf_counter() - t:.1f} s (not timed)")
        t0, c0 = time.perf_counter(), time.process_time()
        res = import_nightly(store, src, hardware="bench")
        t1 = time.perf_counter()
        rss = [_peak_mib()]
        frame = read_store(store, columns=ANALYSIS_COLUMNS)
        t2 = time.perf_counter()
        rss.append(_peak_mib())
        analyses = cp.analyse_frame(frame)
        t3, c3 = time.perf_counter(), time.process_time()
        rss.append(_peak_mib())
        size = sum(f.stat().st_size for f in store.rglob("*.parquet"))
    steps = sum(len(x.steps) for x in analyses)
    stepped = sum(1 for x in analyses if any(abs(s.ratio - 1.08) < 0.01 for s in x.steps))
    outliers = sum(len(x.outliers) for x in analyses)
    gaps = sum(len(x.gaps) for x in analyses)
    peak_mib = _peak_mib()
    print(f"peak RSS after import / read / change points: {rss[0]:.0f} / {rss[1]:.0f} / {rss[2]:.0f} MiB")
    print(f"import ({len(res.added)} runs, {len(frame)} rows, store {size / 2**20:.1f} MiB): {t1 - t0:.1f} s")
    print(f"read_store (pyarrow): {t2 - t1:.1f} s")
    print(f"change points ({len(analyses)} series): {t3 - t2:.1f} s")
    cpu = c3 - c0
    print(
        f"total import + change points: {t3 - t0:.1f} s wall, {cpu:.1f} s CPU (target 30 s); "
        f"peak RSS {peak_mib:.0f} MiB (target 1024); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"found: {steps} steps ({stepped} of the {len(range(0, a.cases, 5))} +8 % steps), "
        f"{outliers} outliers, {gaps} gaps"
    )


if __name__ == "__main__":
    main()

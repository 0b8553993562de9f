"""Time and peak memory of reading a large sglang ``performance.log`` (issue 34's target: a
200,000-line file, about 136 MiB, in at most 5 s and 300 MiB on the 2-core runner).

Writes a synthetic file of ``--lines`` records (sglang's layout with the reference engine's
``perfkit`` extras, about 680 bytes a line, as in the issue's 136 MiB file), then reads it in a fresh process three ways:

- ``stream``: :func:`perfkit.readings.records.iter_perf_log`, every record built and dropped
  (what a reader that aggregates pays);
- ``compare``: what ``perfkit compare --run performance.log`` does (records streamed with their
  raw fields dropped, then one baseline entry);
- ``report``: :func:`perfkit.readings.records.read_perf_log` (every record kept, raw included).

Peak memory is the child process's peak RSS (``ru_maxrss``, MiB), the interpreter and imports
included; ``baseline`` is that of the imports alone. Times: wall and CPU (user + system) of the
reading alone, imports excluded.

    python benchmarks/read_perf_log.py [--lines 200000] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = ["TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage"]


def record(i: int) -> dict:
    """One performance.log line's object (about 680 bytes as JSON)."""
    return {
        "request_id": f"req-{i:08d}",
        "timestamp": "2026-12-01T12:00:00.000000",
        "commit_hash": "0123456789abcdef0123456789abcdef01234567",
        "tag": "pipeline_stage_metrics",
        "stages": [
            {"name": n, "execution_time_ms": 10.0 + k + (i % 7) * 0.125} for k, n in enumerate(STAGES)
        ],
        "steps": [5.0 + (i + k) % 3 * 0.25 for k in range(8)],
        "total_duration_ms": 100.0 + i % 11,
        "memory_snapshots": {
            cp: {
                "allocated_mb": 1000.0,
                "reserved_mb": 1200.0,
                "peak_allocated_mb": 1300.0,
                "peak_reserved_mb": 1400.0,
            }
            for cp in ("load_peak", "warmup_peak", "runtime_peak")
        },
    }


def write_log(path: Path, lines: int) -> int:
    with open(path, "w") as fh:
        for i in range(lines):
            fh.write(json.dumps(record(i)) + "\n")
    return path.stat().st_size


CHILD = r"""
import resource, sys, time
from perfkit.readings import records
mode, path = sys.argv[1], sys.argv[2]
ru0 = resource.getrusage(resource.RUSAGE_SELF)
cpu0 = ru0.ru_utime + ru0.ru_stime
t0 = time.perf_counter()
n = 0
if mode == "stream":
    for r in records.iter_perf_log(path):
        n += 1
elif mode == "compare":
    from perfkit.gate import baseline as bl
    def counted():
        global n
        for r in records.iter_perf_log(path, strict=True, keep_raw=False, partial_last=False):
            n += 1
            yield r
    bl.entry_from_records(counted())
elif mode == "report":
    n = len(records.read_perf_log(path).records)
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru.ru_utime + ru.ru_stime - cpu0
print(n, round(dt, 2), round(cpu, 2), round(ru.ru_maxrss / 1024, 1))
"""


def measure(mode: str, path: Path) -> tuple[int, float, float, float]:
    """(records, wall s, CPU s, peak RSS MiB) of reading ``path`` in a fresh process (CPU time
    is what a loaded, shared runner does not inflate)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, check=True
    )
    n, dt, cpu, rss = out.stdout.split()
    return int(n), float(dt), float(cpu), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--modes", default="stream,compare,report")
    ap.add_argument("--keep", type=Path, default=None, help="write the file here and keep it")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.keep or Path(tmp) / "performance.log"
        size = write_log(path, a.lines)
        print(f"performance.log: {a.lines:,} lines, {size / 2**20:.1f} MiB")
        base = subprocess.run(
            [
                sys.executable,
                "-c",
                "import resource, perfkit.readings.records, perfkit.gate.baseline;"
                "print(round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"baseline (imports only): peak RSS {base} MiB")
        for mode in a.modes.split(","):
            n, dt, cpu, rss = measure(mode, path)
            print(f"{mode:8s} {n:,} records  {dt:.2f} s wall  {cpu:.2f} s CPU  peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()

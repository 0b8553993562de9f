"""CPU cost of the memory sampler (target: under 1% of one core at 100 ms).

Samples a child process tree (a parent holding memory plus a few children) for ``--seconds``
at ``--interval`` and prints the CPU time of the sampler thread (``time.thread_time`` inside the
thread) as a % of one core, plus the whole benchmark process's CPU time as a cross-check.

    python benchmarks/bench_sampler.py --seconds 20 --interval 0.1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from perfkit.readings.sampler import MemorySampler

TREE = (
    "import subprocess, sys, time\n"
    "x = b'x' * (64 * 2**20)\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']) "
    "for _ in range({children})]\n"
    "time.sleep(3600)\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--children", type=int, default=4)
    ap.add_argument("--target-pct", type=float, default=1.0)
    a = ap.parse_args()

    p = subprocess.Popen([sys.executable, "-c", TREE.format(children=a.children)], start_new_session=True)
    try:
        time.sleep(1.0)
        cpu0 = time.process_time()
        s = MemorySampler(p.pid, interval_s=a.interval)
        with s:
            time.sleep(a.seconds)
        cpu_proc = time.process_time() - cpu0
        n = len(s.samples)
        pct = s.overhead_pct()
        proc_pct = 100.0 * cpu_proc / a.seconds
        per_sample_ms = 1000.0 * s.cpu_seconds / max(n, 1)
        print(
            f"samples: {n} over {a.seconds:g} s at {a.interval * 1000:g} ms "
            f"(tree of {a.children + 1} processes, device mode: {s.device_mode})"
        )
        print(
            f"sampler thread CPU: {s.cpu_seconds * 1000:.1f} ms = {pct:.3f}% of one core "
            f"({per_sample_ms:.3f} ms per sample)"
        )
        print(f"benchmark process CPU (cross-check, includes the main thread): {proc_pct:.3f}%")
        ok = pct < a.target_pct
        print(f"{'PASS' if ok else 'FAIL'}: target < {a.target_pct:g}% of one core")
        return 0 if ok else 1
    finally:
        os.killpg(p.pid, 9)
        p.wait()


if __name__ == "__main__":
    sys.exit(main())

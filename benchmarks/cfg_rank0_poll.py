"""Experiment (issue 21): is rank 0 of the CFG-parallel engine slowed by serving HTTP polls?

In the 2-GPU two-stage run rank 1 computed its CFG branch in ~5 ms a step while rank 0 took
~20-27 ms for the same work (rank 1 then waited in the all_gather). Rank 0 is the process that
also serves HTTP; the client polls ``GET /v1/videos/{id}`` every 50 ms. This launches one engine
from a params file and sends the same request in blocks with different client poll intervals,
printing per block the median of each rank's per-step branch time and all_gather wait (ms).

    python benchmarks/cfg_rank0_poll.py params/h200x2-two-stage.yaml [--per-block 3]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import click

from perfkit.engine.client import VideoClient, VideoRequestSpec
from perfkit.engine.launch import launch
from perfkit.params import load_params


@click.command()
@click.argument("params")
@click.option("--per-block", default=3, show_default=True)
@click.option(
    "--polls",
    default="0.05,1.0,0.005",
    show_default=True,
    help="client poll intervals (s); a '+s' suffix runs perfkit's memory sampler (NVML + /proc, 0.1 s) during the block",
)
def main(params: str, per_block: int, polls: str) -> None:
    p = load_params(params)
    spec = p.engine_spec()
    req = VideoRequestSpec.from_dict(p.request.model_dump())
    out = {}
    with tempfile.TemporaryDirectory() as d, launch(spec, run_dir=Path(d), label="poll") as h:
        print(f"ready in {h.cold_start['ready_s']:.1f} s", flush=True)
        with VideoClient(h.base_url, h.perf_log_dir) as c:
            c.generate(req)  # cold request (recompiles nothing when the warmup covers it)
        for item in polls.split(","):
            poll, sampled = float(item.rstrip("+s")), item.endswith("+s")
            rows = []
            sampler = h.sampler(interval_s=0.1) if sampled else None
            if sampler is not None:
                sampler.start()
            with VideoClient(h.base_url, h.perf_log_dir, poll_s=poll) as c:
                for _ in range(per_block):
                    o = c.generate(req)
                    if not o.ok or o.record is None:
                        print(f"poll {poll}: request failed: {o.error}", file=sys.stderr)
                        continue
                    rows.append(o.record)
            if sampler is not None:
                sampler.stop()
            block = {"e2e_ms": statistics.median(r.total_duration_ms for r in rows)}
            for k, rank in enumerate(rows[0].perfkit.get("ranks") or []):
                for key in ("cfg_compute_ms", "cfg_gather_ms"):
                    vals = [v for r in rows for v in (r.perfkit["ranks"][k].get(key) or [])]
                    block[f"rank{k}_{key}"] = round(statistics.median(vals), 2) if vals else None
            out[item] = block
            print(f"poll {item} s: {json.dumps(block)}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

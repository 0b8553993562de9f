"""False alarms and detections of params/ci-cpu.yaml's invariants with every core busy (issue 51).

Runs ``perfkit suite --params <arm's params> --only <the investigations the arm's invariants
judge>`` ``--runs`` times per arm, the arms interleaved, while a load generator it starts keeps
every core busy (``--load-procs`` busy-loop processes at nice 0, default one per core; ``--load-procs
0``: no load). Arms (``--arms``):

- ``unchanged``: params/ci-cpu.yaml as written, every investigation its invariants judge
  (cold/warm, warmup shapes, memory budget). A run that exits 1 is a false REGRESSION: goal 0.
- ``uncovered``: the startup warmup stops covering what users send: the requests set
  ``guidance_scale: 1`` while the warmup runs the engine's default guidance 3 (classifier-free
  guidance, a transformer batch of 2) at their latent shape, so the shape counts as covered and
  its first request recompiles (batch 1). Only the warmup-shapes investigation runs. Detected:
  exit 1 with a ``covered_compiles`` or ``covered_first_request_ratio`` row failed; goal 100 %.
- ``leak`` (not in the default arms): ``engine.debug_leak_mib: 64``, the engine keeps 64 MiB of
  host memory a request. Only cold/warm runs. Detected: exit 1 with
  ``host_anon_slope_mib_per_request`` failed.

Prints a table per arm (runs, exit codes, false regressions or detections, runs with an
inconclusive row, wall time, host load) and per check (pass / inconclusive / fail / skipped, the
measured values' range; checks skipped in every run of an arm left out), and writes ``OUT/ci_cpu_false_alarms.json``; every run's directory
stays under ``OUT/<arm>/runNN`` and its outcome in ``OUT/runs.jsonl`` (``--summarize`` reprints
from it without running anything).

    PYTHONPATH=src python benchmarks/ci_cpu_false_alarms.py --runs 20      # ~2 h 30 min at load 10-15
    PYTHONPATH=src python benchmarks/ci_cpu_false_alarms.py --runs 3 --out outputs/fa-small
    PYTHONPATH=src python benchmarks/ci_cpu_false_alarms.py --summarize --out outputs/ci-cpu-false-alarms
    PYTHONPATH=src python benchmarks/ci_cpu_false_alarms.py --resume --arms unchanged --runs 20 --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from perfkit.gate.verdicts import collect_verdicts
from perfkit.investigations import registry

ROOT = Path(__file__).resolve().parents[1]
#: arm -> (params overrides {section: {key: value}}, invariant keys whose investigations run
#: (None: every one of the params), the check metrics whose failure is the detection)
ARMS: dict[str, tuple[dict[str, dict[str, Any]], tuple[str, ...] | None, tuple[str, ...]]] = {
    "unchanged": ({}, None, ()),
    "uncovered": (
        {"request": {"guidance_scale": 1.0}},
        ("covered_first_request_max_ratio", "covered_compiles_max"),
        ("covered_compiles", "covered_first_request_ratio"),
    ),
    "leak": (
        {"engine": {"debug_leak_mib": 64}},
        ("host_anon_slope_mib_per_request_max",),
        ("host_anon_slope_mib_per_request",),
    ),
}


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes at nice 0, each in its own session (ended by :func:`stop_load`)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)
    ]


def stop_load(procs: list[subprocess.Popen]) -> None:
    """End the load generator's processes, each by its own id."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        p.wait(timeout=30)


def arm_params(params: Path, arm: str, out: Path) -> tuple[Path, list[str]]:
    """Write the arm's params file under ``out/params/`` and return it with the investigations
    to run (those whose invariants model declares one of the arm's keys, enabled in the file)."""
    doc = yaml.safe_load(params.read_text())
    overrides, keys, _ = ARMS[arm]
    for section, values in overrides.items():
        doc.setdefault(section, {}).update(values)
    keys = keys or tuple((doc.get("invariants") or {}).keys())
    only = [
        s.name
        for s in registry.all_investigations()
        if (doc.get(s.name) or {}).get("enabled") and any(k in s.invariants_model.model_fields for k in keys)
    ]
    if not only:
        raise SystemExit(f"{arm}: no enabled investigation of {params} judges {', '.join(keys)}")
    path = out / "params" / f"{arm}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, only


def run_once(params: Path, only: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """One ``perfkit suite`` run into ``out``: exit code, wall time, host load, its check rows."""
    cmd = [sys.executable, "-m", "perfkit.cli", "suite", "--params", str(params), "--only", ",".join(only)]
    cmd += ["--out", str(out), "--force", "--no-screenshot", "-q"]
    load0, t0 = os.getloadavg()[0], time.monotonic()
    try:
        code = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        code = -1
    rows = collect_verdicts(out) if out.exists() else None
    return {
        "exit": code,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "rows": [] if rows is None else rows.drop(columns=["notebook"]).to_dict("records"),
    }


def metric_base(metric: str) -> str:
    """``covered_compiles[warmup=25f,request=25f]`` -> ``covered_compiles``."""
    return str(metric).split("[", 1)[0]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: runs, exit codes, false regressions (unchanged) or detections (the others), runs
    with an inconclusive row, wall and load medians; per check: its statuses and values."""
    out: dict[str, Any] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        rs = [r for r in runs if r["arm"] == arm]
        target = ARMS[arm][2]
        codes = [r["exit"] for r in rs]
        s: dict[str, Any] = {
            "runs": len(rs),
            "exit_0": codes.count(0),
            "exit_1": codes.count(1),
            "exit_other": len(codes) - codes.count(0) - codes.count(1),
            "with_inconclusive": sum(any(x["status"] == "inconclusive" for x in r["rows"]) for r in rs),
            "wall_s_median": float(np.median([r["wall_s"] for r in rs])),
            "load_1min_median": float(np.median([r["load_1min"][1] for r in rs])),
        }
        if target:
            hit = [
                r["exit"] == 1
                and any(x["status"] == "fail" and metric_base(x["metric"]) in target for x in r["rows"])
                for r in rs
            ]
            s["detected"] = sum(hit)
            s["detection_rate"] = sum(hit) / len(rs)
        else:
            s["false_regressions"] = codes.count(1)
        checks: dict[str, dict[str, Any]] = {}
        for r in rs:
            for x in r["rows"]:
                c = checks.setdefault(metric_base(x["metric"]), {"values": []})
                c[x["status"]] = c.get(x["status"], 0) + 1
                if isinstance(x.get("actual"), (int, float)) and x["actual"] == x["actual"]:
                    c["values"].append(float(x["actual"]))
        # checks of investigations the arm does not run are skipped in every run: left out
        checks = {k: c for k, c in checks.items() if set(c) - {"values", "skipped"}}
        for c in checks.values():
            v = c.pop("values")
            c["min"], c["median"], c["max"] = (
                (float(np.min(v)), float(np.median(v)), float(np.max(v))) if v else (None,) * 3
            )
        s["checks"] = checks
        out[arm] = s
    return out


def print_tables(summary: dict[str, Any]) -> None:
    """The arms' table, then the checks' table."""
    print(
        f"\n{'arm':10s} {'runs':>4s} {'exit 0':>6s} {'exit 1':>6s} {'other':>5s} {'outcome':>28s} "
        f"{'inconcl.':>8s} {'wall s':>7s} {'load1':>5s}"
    )
    for arm, s in summary.items():
        if "detected" in s:
            what = f"detected {s['detected']}/{s['runs']} ({s['detection_rate']:.0%})"
        else:
            what = f"false REGRESSION {s['false_regressions']}/{s['runs']}"
        print(
            f"{arm:10s} {s['runs']:4d} {s['exit_0']:6d} {s['exit_1']:6d} {s['exit_other']:5d} {what:>28s} "
            f"{s['with_inconclusive']:8d} {s['wall_s_median']:7.0f} {s['load_1min_median']:5.1f}"
        )
    print(
        f"\n{'arm':10s} {'check':36s} {'pass':>4s} {'inc.':>4s} {'fail':>4s} {'skip':>4s}  values min / median / max"
    )
    for arm, s in summary.items():
        for name, c in s["checks"].items():
            rng = "–" if c["min"] is None else f"{c['min']:.3g} / {c['median']:.3g} / {c['max']:.3g}"
            print(
                f"{arm:10s} {name:36s} {c.get('pass', 0):4d} {c.get('inconclusive', 0):4d} "
                f"{c.get('fail', 0):4d} {c.get('skipped', 0):4d}  {rng}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per arm")
    ap.add_argument("--arms", nargs="+", default=["unchanged", "uncovered"], choices=list(ARMS))
    ap.add_argument("--params", default=str(ROOT / "params" / "ci-cpu.yaml"))
    ap.add_argument("--load-procs", type=int, default=os.cpu_count() or 1, help="busy loops (0: no load)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "ci-cpu-false-alarms"))
    ap.add_argument("--timeout-s", type=float, default=1800, help="per suite run")
    ap.add_argument("--summarize", action="store_true", help="reprint OUT/runs.jsonl; run nothing")
    ap.add_argument("--resume", action="store_true", help="add to OUT/runs.jsonl: each arm from its next run")
    a = ap.parse_args()
    out = Path(a.out)
    log = out / "runs.jsonl"
    if not a.summarize:
        done: dict[str, int] = {}
        if log.exists() and not a.resume:
            raise SystemExit(f"{log} holds earlier runs: --summarize or --resume them, or give another --out")
        if log.exists():
            for line in log.read_text().splitlines():
                r = json.loads(line)
                done[r["arm"]] = max(done.get(r["arm"], 0), int(r["run"]))
        out.mkdir(parents=True, exist_ok=True)
        plan = {arm: arm_params(Path(a.params), arm, out) for arm in a.arms}
        load = start_load(a.load_procs)
        try:
            for i in range(1, a.runs + 1):
                for arm in a.arms:
                    if i <= done.get(arm, 0):
                        continue
                    path, only = plan[arm]
                    r = {"arm": arm, "run": i, "only": only, "load_procs": a.load_procs}
                    r.update(run_once(path, only, out / arm / f"run{i:02d}", a.timeout_s))
                    with log.open("a") as f:
                        f.write(json.dumps(r, default=str) + "\n")
                    bad = [
                        f"{x['metric']} {x['status']}"
                        for x in r["rows"]
                        if x["status"] in ("fail", "inconclusive")
                    ]
                    print(
                        f"{arm} run {i}: exit {r['exit']} in {r['wall_s']:.0f} s, load {r['load_1min'][1]}; "
                        + ("; ".join(bad) or "every check passed"),
                        flush=True,
                    )
        finally:
            stop_load(load)
    runs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    summary = summarize(runs)
    print_tables(summary)
    (out / "ci_cpu_false_alarms.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwritten: {out / 'ci_cpu_false_alarms.json'} (runs: {log})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

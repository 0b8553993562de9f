"""Power of `perfkit ab`: A/A false-alarm rate and detection rate of injected slowdowns, from
one live pool of launches, over every way to pick the launches (exact for the pool) or random
draws where there are too many (`perfkit.ab.power`).

One pool: `perfkit.ab.driver.run_arms` runs --pool launches of A (--spec, default
examples/ab/tiny-cpu.yaml) and of one B arm per --slowdown (the same engine with the test-only
`debug_stage_delay: {DenoisingStage: X%}`), all in one interleaved order (A B C C B A ...), each
with --warm warm requests; `pool.json` records each arm's slowdown and the metric it is meant to
be caught on (--target). Then, for each N (launches a side), M (the first M warm requests of a
launch) and decision setting (--threshold, --confidence):

- A/A: 2N distinct A launches split in two sides: how often DenoisingStage, warm e2e or any
  metric is called a regression (false alarms), and how often the DenoisingStage interval
  holds 1;
- A/B: N A launches against N launches of each arm: how often DenoisingStage and warm e2e are
  called a regression (detection), and TextEncodingStage (untouched by the slowdown).

Resampled draws share launches, so the rates are estimates from one pool (its size printed),
not independent experiments. Also prints the pool's variance split (ICC, CVs) per metric and
the cheapest (N, M) meeting --detect-min and --alarm-max.

The sequential `perfkit ab` (`perfkit.ab.sequential`: first look at --min-launches, then pairs
until every gated metric is decided, at most --max-launches a side, cut to what the pool holds)
is replayed on the pool too, with each slow-spell rule: A/A exits 1 as a regression, each arm
caught, runs ending undecided, launches a side used. Each experiment draws, without
replacement, a random order of the pool's launches for each side (an A/A: the first `max` of a
random order of A's launches on one side, the next `max` on the other) and feeds them one at a
time in the order the procedure asks for. `--replay-pools DIR...` does only that, on each pool.

    PYTHONPATH=src python benchmarks/ab_power.py --pool 8 --warm 5 --n 2 3 4 --m 3 5
    PYTHONPATH=src python benchmarks/ab_power.py --replay-pools examples/h200/ab-pool/h200-dec01 \
        examples/h200/ab-pool/h200-1gpu --threshold 0.01      # the sequential replay only
    PYTHONPATH=src python benchmarks/ab_power.py --pool-dir examples/h200/ab-pool/h200 \
        --threshold 0.01 --confidence 0.95      # recompute from a recorded pool
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from perfkit import stats
from perfkit.ab import power
from perfkit.common.numfmt import percent_text

ROOT = Path(__file__).resolve().parents[1]
METRICS_SHOWN = ("DenoisingStage", "warm_e2e", "TextEncodingStage", "denoising_step", "cold_e2e", "ready")


def _record(a: argparse.Namespace) -> None:
    """Record a pool into --pool-dir unless one is there (sets --pool-dir when it was not given)."""
    if a.pool_dir and (Path(a.pool_dir) / "a" / "meta.json").exists():
        return
    if a.pool_dir and Path(a.pool_dir).is_dir() and any(Path(a.pool_dir).iterdir()):
        # a typo'd or damaged pool must not start minutes of launches over what is there
        raise ValueError(
            f"{a.pool_dir}: not a recorded pool (no a/meta.json) and not empty: give an empty or new "
            "directory to record one"
        )
    from perfkit.ab.driver import run_arms
    from perfkit.engine.client import VideoRequestSpec
    from perfkit.engine.spec import EngineSpec
    from perfkit.params import load_yaml

    data = load_yaml((ROOT / a.spec).read_text())
    # an engine spec, or a mapping with `engine` and `request` (the request shape of the pool)
    engine, request = (data["engine"], data.get("request") or {}) if "engine" in data else (data, {})
    spec_a = EngineSpec.from_dict(engine)
    # one arm per slowdown, B, C, ...: each compared with the same A launches
    arms = {"A": spec_a}
    counts = {"A": a.pool}
    for i, slow in enumerate(a.slowdown):
        arm = "BCDEFG"[i]
        arms[arm] = spec_a.replace(debug_stage_delay={"DenoisingStage": float(slow)})
        counts[arm] = a.pool_b[i] if a.pool_b else a.pool
    out = Path(a.pool_dir or f"outputs/ab-pool-{os.getpid()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "pool.json").write_text(
        json.dumps(
            {
                "arms": {
                    arm: {"DenoisingStage_pct": float(slow), "target": tgt}
                    for arm, slow, tgt in zip("BCDEFG", a.slowdown, a.target or ["DenoisingStage"] * 9)
                },
                "launches": counts,
                "warm": max(a.m + [a.warm]),
                "spec": a.spec,
            },
            indent=2,
        )
        + "\n"
    )
    run_arms(arms, VideoRequestSpec.from_dict(request), counts, max(a.m + [a.warm]), out)
    a.pool_dir = str(out)
    print(f"pool recorded in {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=8, help="launches of A in the live pool (<= 8 on 2 cores)")
    ap.add_argument(
        "--spec",
        default="examples/ab/tiny-cpu.yaml",
        help="engine spec of side A (B adds the slowdown), or a mapping with `engine` and `request`;"
        " relative to the checkout",
    )
    ap.add_argument("--warm", type=int, default=5, help="warm requests a launch in the pool")
    ap.add_argument("--n", type=int, nargs="+", default=[2, 3, 4], help="launches a side")
    ap.add_argument("--m", type=int, nargs="+", default=[3, 5], help="warm requests a launch to use")
    ap.add_argument(
        "--sims",
        type=int,
        default=2000,
        help="random draws per (arm, N, M) where the ways to pick launches exceed perfkit.ab.power.MAX_EXACT",
    )
    ap.add_argument(
        "--slowdown",
        type=float,
        nargs="+",
        default=None,
        help="injected DenoisingStage slowdown, %%, one B arm each (B, C, ...); default 30",
    )
    ap.add_argument(
        "--pool-b", type=int, nargs="+", default=None, help="launches of each B arm (default --pool)"
    )
    ap.add_argument(
        "--target",
        nargs="+",
        default=None,
        help="the metric each B arm is meant to be caught on (DenoisingStage, warm_e2e); kept in pool.json",
    )
    ap.add_argument("--threshold", type=float, nargs="+", default=[stats.DEFAULT_THRESHOLD])
    ap.add_argument("--confidence", type=float, nargs="+", default=[stats.DEFAULT_CONFIDENCE])
    ap.add_argument("--detect-min", type=float, default=0.95, help="detection target of the recommendation")
    ap.add_argument(
        "--alarm-max", type=float, default=0.01, help="A/A false-alarm bound of the recommendation"
    )
    ap.add_argument("--pool-dir", default=None, help="record the pool here, or reuse one recorded here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-launches", type=int, default=3, help="sequential replay: first look")
    ap.add_argument("--max-launches", type=int, default=10, help="sequential replay: most a side")
    ap.add_argument("--seq-sims", type=int, default=2000, help="sequential replay: experiments a row")
    ap.add_argument("--gate", default="DenoisingStage,warm_e2e", help="sequential replay: gated metrics")
    ap.add_argument(
        "--replay-pools",
        nargs="+",
        default=None,
        metavar="DIR",
        help="only the sequential replay, on each pool",
    )
    a = ap.parse_args()
    a.slowdown_given = a.slowdown is not None or a.pool_b is not None
    a.slowdown = a.slowdown or [30.0]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if a.replay_pools:
            for d in a.replay_pools:
                _sequential(a, power.load_pool(d))
            return 0
        return _report(a)
    except (FileNotFoundError, ValueError) as exc:
        print(f"ab_power: error: {exc}", file=sys.stderr)
        return 2


def _report(a: argparse.Namespace) -> int:
    recorded = bool(a.pool_dir) and (Path(a.pool_dir) / "a" / "meta.json").exists()
    if recorded and (a.slowdown_given or a.target):
        print(
            f"note: {a.pool_dir} holds a recorded pool: --slowdown/--pool-b/--target are not used (pool.json says)"
        )
    _record(a)
    pool = power.load_pool(a.pool_dir)
    sizes = ", ".join(f"{len(pool.launches(arm))} of {arm}" for arm in pool.values)
    print(
        f"pool {pool.path}: {sizes} (interleaved), {pool.warm} warm requests a launch, "
        f"host load at the end {pool.meta.get('loadavg_end')}, {pool.meta.get('cpu_count')} CPUs"
    )
    for arm, info in pool.arms.items():
        print(
            f"  arm {arm}: DenoisingStage +{info.get('DenoisingStage_pct')} %, caught on {info.get('target')}"
        )

    print("\nvariance split of the pool (log values, all arms, arm means removed); measured change per arm:")
    var = power.variance_table(pool)
    print(
        var.to_string(
            index=False,
            formatters={c: percent_text for c in ("cv_between", "cv_within", "cv_launch_a")}
            | {c: "{:+.1f}%".format for c in var.columns if c.endswith("_pct")}
            | {"icc": "{:.2f}".format},
        )
    )
    settings = [(t, c) for t in a.threshold for c in a.confidence]
    table = power.power_table(pool, a.n, a.m, settings, sims=a.sims, seed=a.seed)
    exact = bool(table["aa_exact"].dropna().all() and table["ab_exact"].dropna().all())
    how = (
        "every way to pick the launches (exact for this pool)"
        if exact
        else f"up to {a.sims} random draws each"
    )
    print(f"\ndecisions over {how}, Welch t on launch medians (aa_* columns are shared by every arm's rows):")
    shown = table.drop(columns=["slowdown_pct", "launches_a", "launches_b", "aa_exact", "ab_exact"])
    print(
        shown.to_string(
            index=False,
            formatters={
                c: percent_text
                for c in shown.columns
                if c.startswith(("aa_", "detect_", "alarm_")) and not c.endswith("_ways")
            },
        )
    )
    untrusted = power.arm_warnings(pool)
    for said in untrusted.values():
        print(f"\nwarning: {said}; no N and M are recommended from this pool")
    for alarm in power.JUDGEMENTS:
        if untrusted:
            break
        rec = power.recommend(table, a.detect_min, a.alarm_max, alarm=alarm)
        what = power.JUDGEMENTS[alarm]
        if rec.empty:
            print(
                f"\nno (N, M) meets detection >= {a.detect_min:.0%} with A/A false alarms ({what}) <= {a.alarm_max:.0%}"
            )
        else:
            r = rec.iloc[0]
            print(
                f"\ncheapest meeting detection >= {a.detect_min:.0%}, A/A false alarms ({what}) <= {a.alarm_max:.0%}: "
                f"N = {int(r['n'])}, M = {int(r['m'])}, threshold {r['threshold']:.1%}, confidence {r['confidence']:.0%} "
                f"(detection >= {r['detect_min_seen']:.1%}, false alarms <= {r['alarm_max_seen']:.1%})"
            )
    _sequential(a, pool)
    return 0


def _sequential(a: argparse.Namespace, pool: power.Pool) -> None:
    """Print the sequential procedure's replay on ``pool`` (module doc), each slow-spell rule and
    each --threshold and --confidence."""
    from perfkit.ab import sequential as sq

    gate = [g.strip() for g in a.gate.split(",") if g.strip()]
    for thr in a.threshold:
        for conf in a.confidence:
            for rule in sq.SLOW_RULES:
                design = sq.Design(a.min_launches, a.max_launches, conf, "pocock", rule)
                t0 = time.time()
                runs = sq.replay_pool(pool, design, gate, thr, sims=a.seq_sims, seed=a.seed)
                summ = sq.replay_summary(runs)
                mx = int(summ["max_launches"].iloc[0])
                print(
                    f"\nsequential replay of {pool.path}: launches {a.min_launches}..{mx} a side (cut to the pool), "
                    f"threshold {thr:g}, confidence {conf:g} (Pocock), gate {','.join(gate)}, slow spells {rule}, "
                    f"{a.seq_sims} experiments a row ({time.time() - t0:.0f} s):"
                )
                print(
                    summ.to_string(
                        index=False,
                        formatters={
                            c: percent_text for c in ("regression", "caught", "decided", "undecided")
                        },
                    )
                )
                dist = (
                    runs.groupby("kind", sort=False)["launches"]
                    .value_counts(normalize=True)
                    .unstack(fill_value=0)
                    .sort_index(axis=1)
                )
                print("launches a side used (share of experiments):")
                print(dist.to_string(float_format=lambda x: f"{x:.1%}"))


if __name__ == "__main__":
    sys.exit(main())

"""Power of `perfkit ab`: A/A false-alarm rate and detection rate of an injected slowdown, from
one live pool of launches a side, by resampling launches.

One pool: `perfkit.ab.driver.run_ab` runs --pool launches of A (examples/ab/tiny-cpu.yaml) and
of B (the same with the test-only `debug_stage_delay: {DenoisingStage: 30%}`), interleaved
A B B A ..., each with --warm warm requests. Then, for each N (launches a side) and M (warm
requests a launch, the first M of each launch):

- A/A: draw 2N distinct A launches, split them into two sides of N, decide (Welch t interval on
  launch medians, threshold 5 %): the false-alarm rate is how often a metric is called a
  regression (DenoisingStage, warm e2e, and any metric), and the coverage how often the
  DenoisingStage interval holds 1 (nominal 95 %);
- A/B: draw N A launches and N B launches: the detection rate is how often DenoisingStage is
  called a regression; TextEncodingStage (untouched) shows the false alarms on a stage the
  slowdown does not touch.

Resampled draws share launches, so the rates are estimates from one pool (its size printed),
not independent experiments. Also prints the pool's variance split (ICC, CVs) per metric.

    PYTHONPATH=src python benchmarks/ab_power.py --pool 8 --warm 5 --n 2 3 4 --m 3 5
    PYTHONPATH=src python benchmarks/ab_power.py --pool-dir outputs/ab-pool   # reuse a recorded pool
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from perfkit.ab import stats
from perfkit.ab.metrics import metric_values
from perfkit.bundle import ResultBundle

ROOT = Path(__file__).resolve().parents[1]
METRICS_SHOWN = ("DenoisingStage", "warm_e2e", "TextEncodingStage", "denoising_step", "cold_e2e", "ready")


def _pool(a: argparse.Namespace) -> tuple[ResultBundle, ResultBundle]:
    if a.pool_dir and (Path(a.pool_dir) / "a" / "meta.json").exists():
        return ResultBundle.load(Path(a.pool_dir) / "a"), ResultBundle.load(Path(a.pool_dir) / "b")
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
    b = run_arms(arms, VideoRequestSpec.from_dict(request), counts, max(a.m + [a.warm]), out)
    print(f"pool recorded in {out}")
    return b["A"], b["B"]


def _medians(values: pd.DataFrame, m: int) -> dict[str, dict[str, float]]:
    """metric -> launch -> median of the launch's values with index <= m (launch metrics as is)."""
    v = values[(values["index"] <= m) | (values["index"] == 0)]
    g = v.groupby(["metric", "launch"])["value"].median()
    out: dict[str, dict[str, float]] = {}
    for (metric, launch), x in g.items():
        out.setdefault(metric, {})[launch] = float(x)
    return out


def _interval(
    ma: dict[str, float], mb: dict[str, float], la: list[str], lb: list[str]
) -> stats.RatioInterval:
    return stats.ratio_interval([ma[x] for x in la if x in ma], [mb[x] for x in lb if x in mb])


def _decide(ma: dict[str, float], mb: dict[str, float], la: list[str], lb: list[str], thr: float) -> str:
    return stats.decide(_interval(ma, mb, la, lb), thr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=8, help="launches a side in the live pool (<= 8 on 2 cores)")
    ap.add_argument(
        "--spec",
        default="examples/ab/tiny-cpu.yaml",
        help="engine spec of side A (B adds the slowdown), or a mapping with `engine` and `request`;"
        " relative to the checkout",
    )
    ap.add_argument("--warm", type=int, default=5, help="warm requests a launch in the pool")
    ap.add_argument("--n", type=int, nargs="+", default=[2, 3, 4], help="launches a side to resample")
    ap.add_argument("--m", type=int, nargs="+", default=[3, 5], help="warm requests a launch to use")
    ap.add_argument("--sims", type=int, default=2000, help="resamples per (N, M)")
    ap.add_argument(
        "--slowdown",
        type=float,
        nargs="+",
        default=[30.0],
        help="injected DenoisingStage slowdown, %%, one B arm each (B, C, ...)",
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
    ap.add_argument("--threshold", type=float, default=stats.DEFAULT_THRESHOLD)
    ap.add_argument("--pool-dir", default=None, help="record the pool here, or reuse one recorded here")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    bundle_a, bundle_b = _pool(a)
    va, vb = metric_values(bundle_a), metric_values(bundle_b)
    la, lb = sorted(va["launch"].unique()), sorted(vb["launch"].unique())
    ab_meta = bundle_a.meta.get("ab") or {}
    m_pool = int(ab_meta.get("warm_per_launch", va["index"].max()))
    print(
        f"pool: {len(la)} launches of A, {len(lb)} of B (interleaved), {m_pool} warm requests a launch, "
        f"host load at the end {ab_meta.get('loadavg_end')}, {ab_meta.get('cpu_count')} CPUs"
    )
    rng = np.random.default_rng(a.seed)

    print("\nvariance split of the pool (log values, both sides, side means removed):")
    print(f"{'metric':<24}{'CV between':>12}{'CV within':>11}{'ICC':>7}{'B/A':>9}")
    both = pd.concat([va.assign(side="A"), vb.assign(side="B")])
    for metric in METRICS_SHOWN:
        sub = both[both["metric"] == metric]
        if sub.empty:
            continue
        sp = stats.variance_split(sub["value"], sub["side"] + sub["launch"], sub["side"])
        ma, mb = _medians(va, m_pool).get(metric, {}), _medians(vb, m_pool).get(metric, {})
        iv = stats.ratio_interval(list(ma.values()), list(mb.values()))
        # one value a launch (ready, cold e2e): no split, the launch values' own spread instead
        between = (
            sp.cv_between if sp.cv_between == sp.cv_between else math.hypot(iv.sd_log_a, iv.sd_log_b) / 2**0.5
        )
        within = f"{sp.cv_within * 100:>10.1f}%" if sp.cv_within == sp.cv_within else f"{'-':>11}"
        icc = f"{sp.icc:>7.2f}" if sp.icc == sp.icc else f"{'-':>7}"
        print(f"{metric:<24}{between * 100:>11.1f}%{within}{icc}{(iv.ratio - 1) * 100:>+8.1f}%")

    print(f"\nresampled decisions ({a.sims} draws each, threshold {a.threshold:.0%}, 95 % Welch t):")
    print(
        f"{'N':>3}{'M':>3}  {'A/A covers 1':>13}{'A/A false alarm: Denoising':>28}{'warm e2e':>10}{'any':>7}"
        f"   {'detect Denoising +' + format(a.slowdown[0], 'g') + '%':>24}{'TextEnc regr.':>15}"
    )
    for n in a.n:
        for m in a.m:
            if m > m_pool:
                continue
            meda, medb = _medians(va, m), _medians(vb, m)
            metrics = sorted(set(meda) & set(medb))
            fa = {"DenoisingStage": 0, "warm_e2e": 0, "any": 0, "covers": 0}
            det = te = 0
            can_aa = 2 * n <= len(la)
            for _ in range(a.sims):
                if can_aa:
                    pick = rng.choice(la, 2 * n, replace=False)
                    s1, s2 = list(pick[:n]), list(pick[n:])
                    ivs = {k: _interval(meda[k], meda[k], s1, s2) for k in metrics}
                    words = {k: stats.decide(iv, a.threshold) for k, iv in ivs.items()}
                    den = ivs["DenoisingStage"]
                    fa["covers"] += den.low <= 1.0 <= den.high
                    fa["DenoisingStage"] += words.get("DenoisingStage") == "regression"
                    fa["warm_e2e"] += words.get("warm_e2e") == "regression"
                    fa["any"] += "regression" in words.values()
                pa = list(rng.choice(la, n, replace=False))
                pb = list(rng.choice(lb, n, replace=False))
                det += (
                    _decide(meda["DenoisingStage"], medb["DenoisingStage"], pa, pb, a.threshold)
                    == "regression"
                )
                te += (
                    _decide(meda["TextEncodingStage"], medb["TextEncodingStage"], pa, pb, a.threshold)
                    == "regression"
                )
            rate = lambda k: f"{k / a.sims:.1%}" if can_aa else "n/a"  # noqa: E731
            print(
                f"{n:>3}{m:>3}  {rate(fa['covers']):>13}{rate(fa['DenoisingStage']):>28}"
                f"{rate(fa['warm_e2e']):>10}{rate(fa['any']):>7}"
                f"   {det / a.sims:>24.1%}{te / a.sims:>15.1%}"
            )
    if any(2 * n > len(la) for n in a.n):
        print(f"(A/A needs 2N distinct A launches: n/a where 2N > {len(la)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

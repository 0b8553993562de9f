"""Power of ``perfkit ab`` from a recorded pool of A/B launches: the pool loaded and checked, the
variance split per metric, A/A false-alarm and detection rates for each N, M and setting. Draws
share launches, so the rates describe one pool; how they are made: docs/choosing-n-m.md."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit import stats
from perfkit.ab.decide import metric_values
from perfkit.bundle import ResultBundle

#: the pool's description (arms, their slowdowns and target metrics)
POOL_FILE = "pool.json"
#: the metrics whose alarms and detections are reported one by one, and the gate's metrics
KEY_METRICS = ("DenoisingStage", "warm_e2e")
#: a stage the injected slowdown does not touch: its "detections" are false alarms
UNTOUCHED = "TextEncodingStage"


@dataclass
class Pool:
    """A recorded power pool: ``values`` (arm -> :func:`perfkit.ab.decide.metric_values`), ``arms``
    (B arm -> ``{"DenoisingStage_pct", "target"}``), ``warm`` requests a launch, ``meta`` (the A
    bundle's ``meta["ab"]``)."""

    path: Path
    values: dict[str, pd.DataFrame]
    arms: dict[str, dict[str, Any]]
    warm: int
    meta: dict[str, Any] = field(default_factory=dict)
    bundles: dict[str, ResultBundle] = field(default_factory=dict)

    def launches(self, arm: str) -> list[str]:
        """The arm's launch labels, sorted."""
        return sorted(self.values[arm]["launch"].unique())


class Arm(BaseModel):
    """One B arm of ``pool.json``: the injected DenoisingStage slowdown (percent), its metric."""

    model_config = ConfigDict(extra="forbid", strict=True)

    DenoisingStage_pct: float = Field(gt=0, lt=1000)
    target: Literal["DenoisingStage", "warm_e2e"] = "DenoisingStage"


class PoolFile(BaseModel):
    """``pool.json``: the arms (B, C, …) and what was asked when recording."""

    model_config = ConfigDict(extra="allow")

    arms: dict[str, Arm]


#: the tables a pool's bundles must have
NEEDED_TABLES = ("requests.parquet", "stages.parquet", "launches.parquet")


def load_pool(path: str | Path) -> Pool:
    """Read a pool directory (``a/``, a directory per B arm, optional :data:`POOL_FILE`). Raises
    FileNotFoundError: a missing bundle or table (named); ValueError: a bad ``pool.json`` (the key
    named), an arm without a slowdown, a launch without a warm DenoisingStage time (named)."""
    p = Path(path)
    if not (p / "a" / "meta.json").exists():
        raise FileNotFoundError(
            f"{p}: no a/meta.json (not a power pool: record one with benchmarks/ab_power.py)"
        )
    dirs = [d for d in sorted(p.iterdir()) if d.is_dir() and len(d.name) == 1 and (d / "meta.json").exists()]
    for d in dirs:
        for name in NEEDED_TABLES:
            if not (d / name).exists():
                raise FileNotFoundError(
                    f"{d / name}: missing (arm {d.name.upper()} of the pool has no {name})"
                )
    bundles = {d.name.upper(): ResultBundle.load(d) for d in dirs}
    if len(bundles) < 2:
        raise FileNotFoundError(f"{p}: no B arm (b/meta.json) next to a/")
    arms: dict[str, dict[str, Any]] = {}
    if (p / POOL_FILE).exists():
        try:
            doc = PoolFile.model_validate_json((p / POOL_FILE).read_text())
        except ValidationError as exc:
            where = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ValueError(f"{p / POOL_FILE}: bad pool description ({where})") from None
        arms = {k: v.model_dump() for k, v in doc.arms.items()}
        lower = sorted(k for k in arms if k != k.upper())
        if lower:
            raise ValueError(f"{p / POOL_FILE}: arm names are upper-case letters (B, C, …), got {lower}")
        missing = sorted(set(arms) - set(bundles))
        if missing:
            raise ValueError(f"{p / POOL_FILE}: arms {missing} have no bundle directory")
        if not arms:
            raise ValueError(
                f"{p / POOL_FILE}: describes no arm, yet {', '.join(sorted(set(bundles) - {'A'}))} "
                "have bundles (remove the file to read the slowdowns from the bundles)"
            )
    for arm, b in bundles.items():
        if arm != "A" and arm not in arms:
            delay = ((b.meta.get("params") or {}).get("spec") or {}).get("debug_stage_delay") or {}
            pct = delay.get("DenoisingStage")
            if not isinstance(pct, (int, float)) or isinstance(pct, bool):
                raise ValueError(
                    f"{p / arm.lower() / 'meta.json'}: params.spec.debug_stage_delay.DenoisingStage is "
                    f"{pct!r}, not a percentage (and {POOL_FILE} does not describe arm {arm})"
                )
            arms[arm] = {"DenoisingStage_pct": float(pct), "target": "DenoisingStage"}
    a_meta = bundles["A"].meta.get("ab") or {}
    values = {arm: metric_values(b) for arm, b in bundles.items()}
    for arm, v in values.items():
        if not (v["metric"] == "DenoisingStage").any():
            raise ValueError(f"{p / arm.lower()}: no completed warm request with a DenoisingStage time")
        # such a launch would bias every rate down without a word
        la = bundles[arm].launches
        listed = [str(x) for x in la["launch"]] if not la.empty and "launch" in la else []
        warm_den = set(v.loc[(v["metric"] == "DenoisingStage") & (v["index"] >= 1), "launch"].astype(str))
        empty = [x for x in listed if x not in warm_den]
        if empty:
            raise ValueError(
                f"{p / arm.lower()}: launches {empty} have no completed warm request with a DenoisingStage "
                "time (failed or cut short: drop them from the pool, or record it again)"
            )
    warm = int(a_meta.get("warm_per_launch") or values["A"]["index"].max())
    return Pool(p, values, dict(sorted(arms.items())), warm, a_meta, bundles)


def arm_warnings(pool: Pool, tolerance_pp: float = 1.0) -> dict[str, str]:
    """arm -> a sentence, for arms whose measured DenoisingStage change is further from the asked one
    than ``tolerance_pp`` points or half of it, whichever is larger."""
    var = variance_table(pool, ["DenoisingStage"])
    out = {}
    for arm, info in pool.arms.items():
        asked = float(info["DenoisingStage_pct"])
        got = float(var[f"{arm}_pct"].iloc[0]) if len(var) else math.nan
        if not math.isfinite(got) or abs(got - asked) > max(tolerance_pp, asked / 2):
            out[arm] = (
                f"arm {arm} measured {got:+.1f} % on DenoisingStage against +{asked:g} % asked (the injection "
                "overshot, or the host swamped it): its rates describe what the gate saw here, not that change"
            )
    return out


def log_medians(values: pd.DataFrame, m: int) -> pd.DataFrame:
    """Log of each launch's median over its first ``m`` warm requests: launch x metric (NaN: not
    measured)."""
    v = values[(values["index"] <= m) | (values["index"] == 0)]
    med = v.groupby(["launch", "metric"])["value"].median().unstack("metric")
    return np.log(med.astype(float))


def variance_table(pool: Pool, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Per metric: ``cv_between``, ``cv_within``, ``icc`` of all arms (each arm's mean removed),
    ``cv_launch_a`` (A's launch medians) and each B arm's measured change ``<arm>_pct``."""
    names = list(metrics or (*KEY_METRICS, UNTOUCHED, "denoising_step", "cold_e2e", "ready"))
    both = pd.concat([v.assign(side=arm) for arm, v in pool.values.items()], ignore_index=True)
    med = {arm: log_medians(v, pool.warm) for arm, v in pool.values.items()}
    rows = []
    for metric in names:
        sub = both[both["metric"] == metric]
        if sub.empty:
            continue
        sp = stats.variance_split(sub["value"], sub["side"] + sub["launch"], sub["side"])
        a = med["A"][metric].dropna() if metric in med["A"] else pd.Series(dtype=float)
        row: dict[str, Any] = {
            "metric": metric,
            "cv_between": sp.cv_between,
            "cv_within": sp.cv_within,
            "icc": sp.icc,
            "cv_launch_a": float(a.std(ddof=1)) if len(a) > 1 else math.nan,
        }
        for arm in pool.arms:
            b = med[arm][metric].dropna() if metric in med[arm] else pd.Series(dtype=float)
            row[f"{arm}_pct"] = (math.exp(b.mean() - a.mean()) - 1) * 100 if len(a) and len(b) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


#: up to this many ways to pick the launches, every way is taken
MAX_EXACT = 100_000


def _rate(hits: np.ndarray, has: np.ndarray) -> float:
    """Share of draws with a hit; NaN (never 0) when no draw has an interval."""
    return float(np.mean(hits)) if has.any() else math.nan


def _draws(rng: np.random.Generator, n_launches: int, k: int, sims: int) -> np.ndarray:
    return np.argsort(rng.random((sims, n_launches)), axis=1)[:, :k]


Moments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: (launch index groups (G, n), each draw's first and second side as rows of them, every way taken)
Ways = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]


def _aa_ways(rng: np.random.Generator, n_launches: int, n: int, sims: int) -> Ways:
    """A/A splits, n a side and disjoint: every ordered split up to :data:`MAX_EXACT`, else ``sims`` draws."""
    ways = math.comb(n_launches, n) * math.comb(n_launches - n, n)
    if ways <= MAX_EXACT:
        combos = list(itertools.combinations(range(n_launches), n))
        pos = {c: i for i, c in enumerate(combos)}
        rest = [[j for j in range(n_launches) if j not in x] for x in combos]
        pairs = [(i, pos[y]) for i in range(len(combos)) for y in itertools.combinations(rest[i], n)]
        first, second = np.array(pairs, dtype=int).reshape(-1, 2).T
        g = np.array(combos, dtype=int)
        return g, first, g, second, True
    d = _draws(rng, n_launches, 2 * n, sims)
    rows = np.arange(sims)
    return d[:, :n], rows, d[:, n:], rows, False


def _ab_ways(rng: np.random.Generator, n_a: int, n_b: int, n: int, sims: int) -> Ways:
    """n of A's launches against n of B's: every pair up to :data:`MAX_EXACT`, else ``sims`` draws."""
    if math.comb(n_a, n) * math.comb(n_b, n) <= MAX_EXACT:
        ca = np.array(list(itertools.combinations(range(n_a), n)), dtype=int)
        cb = np.array(list(itertools.combinations(range(n_b), n)), dtype=int)
        ra, rb = np.arange(len(ca)), np.arange(len(cb))
        return ca, np.repeat(ra, len(cb)), cb, np.tile(rb, len(ca)), True
    rows = np.arange(sims)
    return _draws(rng, n_a, n, sims), rows, _draws(rng, n_b, n, sims), rows, False


def _moments(xa: np.ndarray, xb: np.ndarray, ways: Ways | None) -> tuple[Moments | None, int, bool | None]:
    """(Welch (d, se, df, bad) of the draws, the draws, every way taken)."""
    if ways is None:
        return None, 0, None
    ga, pa, gb, pb, exact = ways
    sa, sb = stats.side_moments(xa[ga]), stats.side_moments(xb[gb])
    mom = stats.combine(tuple(v[pa] for v in sa), tuple(v[pb] for v in sb))  # type: ignore[arg-type]
    return mom, len(pa), exact


def power_table(
    pool: Pool,
    n: Iterable[int] = (2, 3, 4, 5),
    m: Iterable[int] | None = None,
    settings: Iterable[tuple[float, float]] = ((stats.DEFAULT_THRESHOLD, stats.DEFAULT_CONFIDENCE),),
    sims: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Resampled rates for every B arm, N launches a side, M warm requests (default 1, 3, 5 and the
    pool's) and (threshold, confidence): every way to pick the launches up to :data:`MAX_EXACT`,
    else ``sims`` draws. A row per setting: ``aa_covers``, ``aa_alarm_``/``detect_`` ``<metric>``
    (:data:`KEY_METRICS`), ``_any``, ``_gate``, ``alarm_untouched`` (fractions; NaN: nothing
    drawn), ``aa_ways``/``ab_ways``, ``aa_exact``/``ab_exact``. Raises ValueError: a setting
    outside (0, 1), or N < 2."""
    settings = [(float(t), float(c)) for t, c in settings]
    for t, c in settings:
        if not (0.0 < t < 1.0 and 0.0 < c < 1.0):
            raise ValueError(
                f"threshold and confidence must be in (0, 1) (as perfkit ab takes them), got ({t}, {c})"
            )
    ns = sorted(set(int(x) for x in n))
    if not ns or ns[0] < 2:
        raise ValueError(f"launches a side must be >= 2 for an interval, got {ns}")
    if sims < 1:
        raise ValueError(f"sims must be >= 1, got {sims}")
    if m is None:
        ms = sorted({x for x in (1, 3, 5, pool.warm) if x <= pool.warm})
    else:
        ms = sorted(set(int(x) for x in m))
        bad = [x for x in ms if not 1 <= x <= pool.warm]
        if bad:
            raise ValueError(f"M {bad}: the pool has 1 to {pool.warm} warm requests a launch")
    rng = np.random.default_rng(seed)
    rows = []
    for mm in ms:
        med = {arm: log_medians(v, mm) for arm, v in pool.values.items()}
        a = med["A"]
        la = a.to_numpy()
        cols = list(a.columns)
        gate = [cols.index(k) for k in KEY_METRICS if k in cols]
        for nn in ns:
            aa, aa_ways, aa_exact = _moments(
                la, la, _aa_ways(rng, len(a), nn, sims) if 2 * nn <= len(a) else None
            )
            for arm, info in pool.arms.items():
                b = med[arm].reindex(columns=cols)
                ways = _ab_ways(rng, len(a), len(b), nn, sims) if nn <= min(len(a), len(b)) else None
                ab, ab_ways, ab_exact = _moments(la, b.to_numpy(), ways)
                for thr, conf in settings:
                    row: dict[str, Any] = {
                        "arm": arm,
                        "slowdown_pct": info["DenoisingStage_pct"],
                        "target": info["target"],
                        "n": nn,
                        "m": mm,
                        "threshold": thr,
                        "confidence": conf,
                        "launches_a": len(a),
                        "launches_b": len(b),
                        "aa_ways": aa_ways,
                        "aa_exact": aa_exact,
                        "ab_ways": ab_ways,
                        "ab_exact": ab_exact,
                    }
                    up = math.log1p(thr)
                    row.update(_rates(aa, conf, cols, gate, up, True))
                    row.update(_rates(ab, conf, cols, gate, up, False))
                    rows.append(row)
    return pd.DataFrame(rows)


def _rates(
    mom: Moments | None, conf: float, cols: list[str], gate: list[int], up: float, aa: bool
) -> dict[str, float]:
    """A/A (``aa``) or detection rates of a row; a regression's low end is above ``up``."""
    pre = "aa_alarm" if aa else "detect"
    keys = [f"{pre}_{m}" for m in KEY_METRICS]
    row = dict.fromkeys(
        [*(["aa_covers", *keys] if aa else [*keys, "alarm_untouched"]), f"{pre}_any", f"{pre}_gate"], math.nan
    )
    if mom is None:
        return row
    has = ~mom[3]
    low, high = stats.log_ends(*mom, conf)
    reg = low > up

    def rate(metric: str, hit: np.ndarray) -> float:
        return _rate(hit[:, cols.index(metric)], has[:, cols.index(metric)]) if metric in cols else math.nan

    row.update({k: rate(m, reg) for m, k in zip(KEY_METRICS, keys)})
    if aa:
        row["aa_covers"] = rate("DenoisingStage", has & (low <= 0) & (high >= 0))
    else:
        row["alarm_untouched"] = rate(UNTOUCHED, reg)
    row[f"{pre}_any"] = _rate(reg.any(axis=1), has)
    row[f"{pre}_gate"] = _rate(reg[:, gate].any(axis=1), has[:, gate]) if gate else math.nan
    return row


#: what each judgement of :func:`recommend` means (Markdown)
JUDGEMENTS = {
    "key": "each arm caught on its own metric; false alarms of DenoisingStage and warm e2e",
    "gate": "the exit code with `--gate-metrics DenoisingStage,warm_e2e`",
    "any": "the exit code with every metric gating",
}
#: what :func:`recommend` judges: detection column(s), false-alarm column(s)
_JUDGED = {
    "key": (None, tuple(f"aa_alarm_{k}" for k in KEY_METRICS)),
    "gate": ("detect_gate", ("aa_alarm_gate",)),
    "any": ("detect_any", ("aa_alarm_any",)),
}


def recommend(
    table: pd.DataFrame, detect_min: float = 0.95, alarm_max: float = 0.01, alarm: str = "key"
) -> pd.DataFrame:
    """The settings (N, M, threshold, confidence) of a :func:`power_table` whose every arm detects at
    least ``detect_min`` with A/A alarms at most ``alarm_max``, judged as ``alarm``
    (:data:`JUDGEMENTS`) says; cheapest first, NaN never meets. Raises ValueError: a bad
    ``alarm``, a target not a fraction, or a column the judgement needs missing."""
    if alarm not in _JUDGED:
        raise ValueError(f"alarm must be one of {sorted(_JUDGED)}, got {alarm!r}")
    for name, v in (("detect_min", detect_min), ("alarm_max", alarm_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1] (0.95, not 95), got {v!r}")
    if table.empty:
        return pd.DataFrame(
            columns=["threshold", "confidence", "n", "m", "detect_min_seen", "alarm_max_seen"]
        )
    det_col, alarm_cols = _JUDGED[alarm]
    t = table.copy()
    targets = sorted(set(t["target"])) if "target" in t else []
    need = [det_col] if det_col else ["target", *[f"detect_{x}" for x in targets]]
    missing = [c for c in [*need, *alarm_cols, "threshold", "confidence", "n", "m"] if c not in t]
    if missing:
        raise ValueError(f"table lacks {missing} (not a power_table() of this perfkit)")
    t["detect"] = t[det_col] if det_col else [r[f"detect_{r['target']}"] for _, r in t.iterrows()]
    t["alarm"] = t[list(alarm_cols)].max(axis=1, skipna=False)
    g = t.groupby(["threshold", "confidence", "n", "m"], as_index=False).agg(
        detect_min_seen=("detect", lambda x: x.min(skipna=False)),
        alarm_max_seen=("alarm", lambda x: x.max(skipna=False)),
    )
    ok = g[(g["detect_min_seen"] >= detect_min) & (g["alarm_max_seen"] <= alarm_max)]
    ok = ok.sort_values(["n", "m", "alarm_max_seen", "detect_min_seen"], ascending=[True, True, True, False])
    return ok.astype({"n": int, "m": int}).reset_index(drop=True)

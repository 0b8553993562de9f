"""A recorded pool of A/B launches (:func:`perfkit.ab.driver.run_arms`): its arms and description
(:data:`POOL_FILE`), loaded and checked (:func:`load_pool`, :func:`arm_warnings`), each launch's
log medians (:func:`log_medians`), the variance split per metric (:func:`variance_table`), and
host slow spells: the launches that ran their median in one (:func:`slow_launches`), the spells
with the host's clock and power readings (:func:`slow_spells`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit import stats
from perfkit.ab.metrics import metric_values
from perfkit.bundle import ResultBundle
from perfkit.readings.sampler.nvml import POWER_REASONS

#: the pool's description (arms, their slowdowns and target metrics), next to the bundles
POOL_FILE = "pool.json"
#: the metrics whose alarms and detections are reported one by one, and the gate's metrics
KEY_METRICS = ("DenoisingStage", "warm_e2e")
#: a stage the injected slowdown does not touch: its "detections" are false alarms
UNTOUCHED = "TextEncodingStage"


@dataclass
class Pool:
    """A recorded power pool.

    Attributes:
        path: its directory.
        values: arm ("A", "B", …) -> :func:`perfkit.ab.metrics.metric_values` of its bundle.
        arms: B arm -> ``{"DenoisingStage_pct": float, "target": metric}`` (from ``pool.json``,
            else from the arm's engine spec with target DenoisingStage).
        warm: warm requests a launch (M of the pool).
        meta: the A bundle's ``meta["ab"]`` (order, load averages, wall time).
        bundles: arm -> its bundle (requests' times, the sampler's clocks and power).
    """

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
    """One B arm as ``pool.json`` describes it: the injected share of DenoisingStage (percent)
    and the metric it is meant to be caught on."""

    model_config = ConfigDict(extra="forbid", strict=True)

    DenoisingStage_pct: float = Field(gt=0, lt=1000)
    target: Literal["DenoisingStage", "warm_e2e"] = "DenoisingStage"


class PoolFile(BaseModel):
    """``pool.json``: the arms (B, C, …) and, informative only, what was asked when recording."""

    model_config = ConfigDict(extra="allow")

    arms: dict[str, Arm]


#: the tables a pool's bundles must have (a pool without them has nothing to compare)
NEEDED_TABLES = ("requests.parquet", "stages.parquet", "launches.parquet")


def _pool_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        doc = PoolFile.model_validate_json(path.read_text())
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise ValueError(f"{path}: bad pool description ({where})") from None
    return {k: v.model_dump() for k, v in doc.arms.items()}


def load_pool(path: str | Path) -> Pool:
    """Read a pool directory (``a/``, a directory per B arm, optional :data:`POOL_FILE`).

    Raises:
        FileNotFoundError: no ``a/`` bundle, no B arm bundle, or an arm without one of
            :data:`NEEDED_TABLES` (the file is named).
        ValueError: ``pool.json`` unreadable or invalid (the key is named), naming an arm without
            a bundle or in lower case, describing no arm; an arm without a spec'd slowdown; a
            launch without a warm DenoisingStage time (named).
    """
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
        arms = _pool_file(p / POOL_FILE)
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
        # a launch without a warm DenoisingStage would sit in every draw as "no interval":
        # rates biased down without a word, so it is an error naming the launch
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
    """Arms whose measured DenoisingStage change (ratio of geometric means of launch medians over
    the whole pool) is further from the asked share than ``tolerance_pp`` percentage points or
    half the asked share, whichever is larger: their rates do not describe the asked change
    (an injection that overshot, or a host that swamped it). arm -> the sentence."""
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
    """Log of each launch's median over its first ``m`` warm requests (launch-level metrics as
    they are): a frame indexed by launch with one column per metric (NaN: not measured there)."""
    v = values[(values["index"] <= m) | (values["index"] == 0)]
    med = v.groupby(["launch", "metric"])["value"].median().unstack("metric")
    return np.log(med.astype(float))


def variance_table(pool: Pool, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Per metric: CV between and within launches and the ICC of all arms together (each arm's
    mean removed; :func:`perfkit.stats.variance_split`), the launch-median CV of A (for
    one-value-a-launch metrics, the only spread there is), and each B arm's measured ratio B/A
    over the whole pool (percent change).

    Columns: ``metric, cv_between, cv_within, icc, cv_launch_a`` (fractions) and ``<arm>_pct``.
    """
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


#: a warm request ran in a slow spell when it took more than this × its side's quiet level
SLOW_FACTOR = 1.05
#: the quiet level: this quantile of the side's warm requests (linear interpolation, Hyndman-Fan 7;
#: 1 / it an integer)
QUIET_QUANTILE = 0.10


def _request_clocks(bundle: ResultBundle) -> pd.DataFrame:
    """Per warm request (``launch, index``): the median SM clock (MHz) and the share of samples
    with a power reason set (:data:`perfkit.readings.sampler.POWER_REASONS`) while it ran, from
    the sampler's memory table; empty when the bundle has no clock samples (recorded without
    NVML, or before perfkit sampled clocks)."""
    mem, req = bundle.memory, bundle.requests
    if mem.empty or "sm_clock_mhz" not in mem or mem["sm_clock_mhz"].isna().all():
        return pd.DataFrame(columns=["launch", "index", "sm_mhz", "power_capped"])
    rows = []
    warm = req[(req["index"] > 0) & req["t_start_s"].notna() & req["t_end_s"].notna()]
    for r in warm.itertuples():
        m = mem[(mem["launch"] == r.launch) & (mem["t_s"] >= r.t_start_s) & (mem["t_s"] <= r.t_end_s)]
        clk = m["sm_clock_mhz"].dropna()
        rs = m["clock_event_reasons"].dropna()
        rows.append(
            {
                "launch": r.launch,
                "index": r.index,
                "sm_mhz": float(clk.median()) if len(clk) else math.nan,
                "power_capped": float(((rs.astype("int64") & POWER_REASONS) > 0).mean())
                if len(rs)
                else math.nan,
            }
        )
    return pd.DataFrame(rows)


def slow_launches(
    requests: dict[str, np.ndarray], factor: float = SLOW_FACTOR, share: float = 0.5
) -> list[str]:
    """The launches whose median ran in a slow spell: at least ``share`` of their warm requests
    took more than ``factor`` × the side's quiet level (the :data:`QUIET_QUANTILE` of all the
    side's warm requests given), the rule of :func:`slow_spells` applied launch by launch.

    Args:
        requests: launch label -> its warm requests' times of one metric (ms), one side.

    Returns:
        the marked labels, in the order given (none when no request was given).
    """
    lists = {k: np.asarray(v, dtype=float).ravel().tolist() for k, v in requests.items()}
    every = [x for v in lists.values() for x in v]
    if not every:
        return []
    # the sequential replay calls this ~300,000 times: the stdlib's quantiles cost ~1/5 of numpy's
    if len(every) > 1 and all(math.isfinite(x) for x in every):
        quiet = statistics.quantiles(every, n=round(1 / QUIET_QUANTILE), method="inclusive")[0]
    else:
        quiet = float(np.quantile(np.array(every), QUIET_QUANTILE))
    cut = factor * quiet
    return [k for k, v in lists.items() if v and sum(x > cut for x in v) / len(v) >= share]


def slow_spells(pool: Pool, metric: str = "DenoisingStage", factor: float = SLOW_FACTOR) -> pd.DataFrame:
    """How much of each arm ran in a slow spell: warm requests whose ``metric`` took more than
    ``factor`` × the arm's quiet level (the 10th percentile of all its warm requests), and the
    launches with at least one such request; where the sampler recorded clocks, the median SM
    clock (MHz) and the share of samples at a power limit of the slow and the quiet requests.

    Columns: ``arm, quiet_ms, requests, slow_requests, launches, slow_launches, worst_pct``
    (the slowest request over the quiet level, percent), ``slow_sm_mhz, quiet_sm_mhz,
    slow_power_capped, quiet_power_capped`` (NaN: no clock samples).
    """
    rows = []
    for arm, v in pool.values.items():
        x = v[(v["metric"] == metric) & (v["index"] > 0)]
        if x.empty:
            continue
        quiet = float(x["value"].quantile(QUIET_QUANTILE))
        is_slow = x["value"] > factor * quiet
        slow = x[is_slow]
        row: dict[str, Any] = {
            "arm": arm,
            "quiet_ms": quiet,
            "requests": len(x),
            "slow_requests": len(slow),
            "launches": x["launch"].nunique(),
            "slow_launches": slow["launch"].nunique(),
            "worst_pct": (float(x["value"].max()) / quiet - 1) * 100,
        }
        clocks = _request_clocks(pool.bundles[arm]) if arm in pool.bundles else pd.DataFrame()
        joined = (
            x.assign(slow=is_slow).merge(clocks, on=["launch", "index"], how="left")
            if not clocks.empty
            else None
        )
        for part, want in (("slow", True), ("quiet", False)):
            sub = joined[joined["slow"] == want] if joined is not None else None
            has = sub is not None and len(sub)
            row[f"{part}_sm_mhz"] = float(sub["sm_mhz"].median()) if has else math.nan
            row[f"{part}_power_capped"] = float(sub["power_capped"].mean()) if has else math.nan
        rows.append(row)
    return pd.DataFrame(rows)

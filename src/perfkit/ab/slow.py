"""Host slow spells in a recorded A/B: warm requests above :data:`SLOW_FACTOR` x their side's quiet
level (:data:`QUIET_QUANTILE`), the launches that ran their median in one
(:func:`slow_launches`), and the spells named with the host's clock and power readings
(:func:`slow_spells`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import pandas as pd

from perfkit.ab.pool import Pool
from perfkit.bundle import ResultBundle
from perfkit.readings.sampler.nvml import POWER_REASONS

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
    launches with at least one such request. A host that slows the GPU for seconds at a time
    (power capping, a neighbour) shows here before it shows as a wide interval. Where the
    sampler recorded clocks, the median SM clock (MHz) and the share of samples at a power limit
    of the slow and the quiet requests say whether the GPU itself slowed down.

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

"""The values an A/B compares, read from one side's bundle: one long table, a row per
(launch, metric, request). The metrics and their units (s, ms, MiB): docs/ab.md, "Metrics". A
metric without a value on a launch has no row there (never a 0): "not measured", not "no change".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfkit.bundle import WARMUP_INDEX, ResultBundle
from perfkit.readings import stages as _stages

#: unit of each fixed metric (stage metrics are ms)
METRIC_UNITS = {
    **dict.fromkeys(("ready", "first_result"), "s"),
    **dict.fromkeys(("cold_e2e", "warm_e2e", "denoising_step"), "ms"),
    **dict.fromkeys(("peak_vram", "host_peak"), "MiB"),
}
#: metrics with one value a launch (no variance within a launch)
LAUNCH_METRICS = ("ready", "first_result", "cold_e2e", "peak_vram", "host_peak")

COLUMNS = ["launch", "metric", "unit", "index", "value"]


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) and x > 0 else math.nan


def metric_values(bundle: ResultBundle) -> pd.DataFrame:
    """Long table of a side's values: columns ``launch, metric, unit, index, value`` (``index``:
    the request's place in its launch, 0 for launch-level metrics). Only completed measured
    requests count; values that are missing, zero or not finite are left out (not measured).
    Units: :data:`METRIC_UNITS` (s, ms, MiB; stages ms).
    """
    rows: list[tuple[Any, str, str, int, float]] = []
    launches = bundle.launches
    req = bundle.measured_requests()
    mem = bundle.memory

    def add(launch: Any, metric: str, index: int, value: Any, unit: str | None = None) -> None:
        v = _num(value)
        if not math.isnan(v):
            rows.append((str(launch), metric, unit or METRIC_UNITS.get(metric, "ms"), int(index), v))

    for lr in launches.to_dict("records"):
        lab = lr["launch"]
        add(lab, "ready", 0, lr.get("ready_s"))
        add(lab, "first_result", 0, lr.get("first_result_s"))
        # PSS is read on some samples only, by the cap watchdog (launch row) and the sampler
        # (memory table) each within its time budget (readings.memory.PSS_DUTY): the peak is the
        # largest read of either, as memory_budget and offload_modes take it
        host = _num(lr.get("host_pss_peak_mib"))
        if not mem.empty and "host_pss_mib" in mem.columns:
            m = mem[(mem["launch"] == lab).fillna(False).to_numpy(bool)]
            sampled = (
                _num(pd.to_numeric(m["host_pss_mib"], errors="coerce").max()) if not m.empty else math.nan
            )
            host = float(np.fmax(host, sampled))
        add(lab, "host_peak", 0, host)
        r = req[(req["launch"] == lab).fillna(False).to_numpy(bool)] if not req.empty else req
        if not r.empty:
            add(lab, "peak_vram", 0, pd.to_numeric(r["peak_reserved_mib"], errors="coerce").max())
            cold = r[r["index"] == 0]
            if not cold.empty:
                add(lab, "cold_e2e", 0, cold["e2e_ms"].iloc[0])
            for rec in r[r["index"] >= 1].to_dict("records"):
                add(lab, "warm_e2e", rec["index"], rec["e2e_ms"])
    warm_ids = set(req.loc[(req["index"] >= 1).fillna(False).to_numpy(bool), "request_id"].astype(str))
    st = bundle.stages
    if not st.empty and warm_ids:
        st = st[st["request_id"].astype(str).isin(warm_ids) & (st["index"] != WARMUP_INDEX).fillna(False)]
        per = st.groupby(["launch", "index", "stage"], sort=False)["ms"].sum().reset_index()
        for rec in per.to_dict("records"):
            add(rec["launch"], rec["stage"], rec["index"], rec["ms"], "ms")
    sp = bundle.steps
    if not sp.empty and warm_ids:
        sp = sp[sp["request_id"].astype(str).isin(warm_ids)]
        sp = sp[sp["stage"].map(lambda s: _stages.stage_class(str(s)) == _stages.DENOISING)]
        per = sp.groupby(["launch", "index"], sort=False)["ms"].mean().reset_index()
        for rec in per.to_dict("records"):
            add(rec["launch"], "denoising_step", rec["index"], rec["ms"])
    return pd.DataFrame(rows, columns=COLUMNS)


def launch_errors(bundle: ResultBundle) -> dict[str, Any]:
    """Launch label -> error of each failed launch (start error, crash) of a side's bundle."""
    la = bundle.launches
    if la.empty or "error" not in la:
        return {}
    return {str(r["launch"]): r["error"] for r in la[la["error"].notna()].to_dict("records")}


def launch_means(values: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, launch): the launch's one number, the **median** of its values (in the
    metric's unit; why not the mean: docs/choosing-n-m.md), and how many requests it has.
    Columns ``metric, launch, unit, value, n``."""
    if values.empty:
        return pd.DataFrame(columns=["metric", "launch", "unit", "value", "n"])
    g = values.groupby(["metric", "launch"], sort=False)
    return g.agg(unit=("unit", "first"), value=("value", "median"), n=("value", "size")).reset_index()


def paired_values(values_a: pd.DataFrame, values_b: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The pairs of a paired A/B (``perfkit ab --paired``: launch ``A<k>`` ran beside ``B<k>``,
    their requests in turn) for one metric: a row per pair with a value on both sides.

    Columns ``pair`` (``k``), ``a`` (A's launch median, the metric's unit), ``b``: A's median times
    the **median over the warm requests of B's request over A's request of the same place** (the
    host's state cancels request by request); a launch-level metric (ready, cold e2e, peaks)
    takes B's value itself. ``log b − log a`` is what :func:`perfkit.stats.paired_ratio_interval`
    averages.
    """
    rows = []
    va, vb = values_a[values_a["metric"] == metric], values_b[values_b["metric"] == metric]
    by_a = {str(x)[1:]: g for x, g in va.groupby("launch")}
    by_b = {str(x)[1:]: g for x, g in vb.groupby("launch")}
    for k in sorted(set(by_a) & set(by_b)):
        ga, gb = by_a[k], by_b[k]
        a_med = float(ga["value"].median())
        if metric in LAUNCH_METRICS:
            rows.append((k, a_med, float(gb["value"].median())))
            continue
        both = (
            ga.set_index("index")["value"]
            .to_frame("a")
            .join(gb.set_index("index")["value"].to_frame("b"), how="inner")
        )
        if both.empty:
            continue
        ratio = float(np.exp(np.median(np.log(both["b"].to_numpy(float) / both["a"].to_numpy(float)))))
        rows.append((k, a_med, a_med * ratio))
    return pd.DataFrame(rows, columns=["pair", "a", "b"])


def metric_order(names: Any) -> list[str]:
    """Metrics in report order: ready, first result, cold e2e, warm e2e, the stages in pipeline
    order, denoising step, peak VRAM, host peak."""
    names = list(dict.fromkeys(names))
    head = [m for m in ("ready", "first_result", "cold_e2e", "warm_e2e") if m in names]
    tail = [m for m in ("denoising_step", "peak_vram", "host_peak") if m in names]
    stages = _stages.order_stages([m for m in names if m not in head and m not in tail])
    return head + stages + tail

"""Serving-under-load figures from the per-level results (ms, epoch s) and the ``memory`` table (MiB),
and the offload modes figure (:func:`offload_memory_latency`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from perfkit.report.plots.base import Figure, empty_note, is_finite, ms_axis, new_figure, one_axis, x_text


def _label(lv: Mapping[str, Any]) -> str:
    if lv.get("concurrency") is not None:
        return f"c{lv['concurrency']}"
    return f"open {float(lv.get('rate_rps') or 0):.2f}/s"


def _num(v: Any) -> float:
    return float(v) if is_finite(v) else np.nan


def latency_vs_concurrency(levels: Sequence[Mapping[str, Any]], *, title: str | None = None) -> Figure:
    """p50 and p99 of e2e (ms) per closed-loop level, the p99's 95 % interval as a bar."""
    fig, ax = one_axis(6.4, 3.8)
    closed = [lv for lv in levels if lv.get("concurrency") is not None]
    if not closed:
        empty_note(ax, "no closed-loop level measured")
        return fig
    x = [int(lv["concurrency"]) for lv in closed]
    p50 = [_num(lv.get("p50_ms")) for lv in closed]
    p99 = [_num(lv.get("p99_ms")) for lv in closed]
    ax.plot(x, p50, "o-", label="p50", color="tab:blue")
    ax.plot(x, p99, "s-", label="p99", color="tab:red")
    for xi, lv in zip(x, closed):
        lo, hi = (list(lv.get("p99_ci") or []) + [None, None])[:2]
        if is_finite(lo) and is_finite(hi):
            ax.plot([xi, xi], [lo, hi], color="tab:red", alpha=0.4, lw=6)
        elif is_finite(lo):
            ax.annotate(
                "",
                (xi, _num(lv.get("p99_ms")) * 1.15),
                (xi, lo),
                arrowprops={"arrowstyle": "->", "color": "tab:red"},
            )
    ax.set_xticks(x)
    ax.set_xlabel("requests in flight (closed loop)")
    ax.set_ylabel("end-to-end latency (ms)")
    ms_axis(ax)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title or "Latency vs concurrency: p50, p99 (bar: p99's 95 % interval)")
    return fig


def queue_vs_service(levels: Sequence[Mapping[str, Any]], *, title: str | None = None) -> Figure:
    """Median queue wait stacked on median service time (ms) per level; a level not reported gets
    no bar (never 0) and says so, one whose wait was derived (e2e − duration) is marked so."""
    fig, ax = one_axis(6.4, 3.8)
    if not levels:
        empty_note(ax, "no level measured")
        return fig
    svc = np.array([_num(lv.get("service_ms")) for lv in levels], dtype=float)
    wait = np.array([_num(lv.get("queue_wait_ms")) for lv in levels], dtype=float)
    shown = ~(np.isnan(svc) | np.isnan(wait))
    derived = [any(str(s).startswith("derived") for s in lv.get("start_source") or []) for lv in levels]
    names = [
        _label(lv) + ("" if ok else "\n(not reported)") + ("\n(derived)" if ok and d else "")
        for lv, ok, d in zip(levels, shown, derived)
    ]
    x = np.arange(len(names))
    ax.bar(x[shown], svc[shown], 0.6, label="service (started → completed)", color="tab:green")
    ax.bar(
        x[shown],
        wait[shown],
        0.6,
        bottom=svc[shown],
        label="queue wait (submitted → started)",
        color="tab:orange",
    )
    ax.set_xticks(x, names)
    ax.set_ylabel("median per request (ms)")  # linear: stacked bars start at 0
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title or "Queue wait vs service time per level")
    return fig


def memory_under_concurrency(
    memory: pd.DataFrame, levels: Sequence[Mapping[str, Any]], *, title: str | None = None
) -> Figure:
    """Device memory in use and host PSS (MiB) over s since the first sample, levels shaded."""
    fig, ax = one_axis(8.0, 3.8)
    if memory is None or memory.empty or "t_s" not in memory.columns:
        empty_note(ax, "no memory samples")
        return fig
    t0 = float(pd.to_numeric(memory["t_s"], errors="coerce").min())
    t = pd.to_numeric(memory["t_s"], errors="coerce") - t0
    drew = False
    for col, label, color in (
        ("device_used_mib", "device in use", "tab:blue"),
        ("host_pss_mib", "host PSS (engine tree)", "tab:orange"),
    ):
        y = pd.to_numeric(memory.get(col), errors="coerce") if col in memory.columns else None
        if y is not None and y.notna().any():
            keep = y.notna()  # PSS is read on some samples only (readings.memory.PSS_DUTY)
            dots = {"marker": "o", "ms": 3} if not keep.all() else {}  # a lone read still shows
            ax.plot(t[keep], y[keep], label=label, color=color, lw=1.2, **dots)
            drew = True
    if not drew:
        empty_note(ax, "no device or host memory readings")
        return fig
    for i, lv in enumerate(levels):
        a, b = lv.get("t0_s"), lv.get("t1_s")
        if is_finite(a) and is_finite(b):
            ax.axvspan(a - t0, b - t0, color="grey", alpha=0.08 + 0.06 * (i % 2))
            x_text(ax, (a + b) / 2 - t0, 1.0, _label(lv), va="bottom")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("MiB")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or "Memory under concurrency (levels shaded)", pad=14)
    return fig


def offload_memory_latency(modes: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Per offload mode (the offload investigation's summary table): device reserved and host peak
    (MiB, left axis) and warm e2e (ms, right axis); a mode without a value shows its status."""
    fig = new_figure(10.0, 4.2)
    ax_mem, ax_lat = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if modes is None or modes.empty or "mode" not in modes.columns:
        empty_note(ax_mem, "no offload modes")
        empty_note(ax_lat, "no offload modes")
        return fig
    names = [str(m) for m in modes["mode"]]
    status = [str(s) for s in modes.get("status", pd.Series(["ran"] * len(modes)))]
    x = np.arange(len(names))

    vals = modes.reindex(columns=["peak_reserved_mib", "host_pss_peak_mib", "warm_ms"]).apply(
        pd.to_numeric, errors="coerce"
    )
    dev, host, warm = (vals[c].replace([np.inf, -np.inf], np.nan).tolist() for c in vals.columns)
    w = 0.38
    ax_mem.bar(x - w / 2, np.nan_to_num(dev), w, label="device peak reserved", color="tab:blue")
    ax_mem.bar(x + w / 2, np.nan_to_num(host), w, label="host PSS peak (engine tree)", color="tab:orange")
    ax_lat.bar(x, np.nan_to_num(warm), 0.6, color="tab:green", label="warm e2e")
    top_mem = max([v for v in dev + host if is_finite(v)] or [1.0])
    top_lat = max([v for v in warm if is_finite(v)] or [1.0])

    def note(ax: Any, xi: float, top: float, text: str) -> None:
        ax.text(xi, top * 0.05, text, rotation=90, ha="center", va="bottom", color="grey", fontsize=8)

    for i, st in enumerate(status):
        if st != "ran":
            note(ax_mem, i, top_mem, st)
            note(ax_lat, i, top_lat, st)
        elif not is_finite(dev[i]):
            note(ax_mem, i - w / 2, top_mem, "no device")
    for ax in (ax_mem, ax_lat):
        ax.set_xticks(x, names)
        ax.set_xlabel("offload mode")
        ax.set_ylim(bottom=0)
    ax_mem.set_ylabel("memory (MiB)")
    ax_mem.legend(fontsize="small")
    ax_mem.set_title("Device vs host memory per mode")
    ax_lat.set_ylabel("warm end-to-end latency (ms)")
    ax_lat.set_title("Warm e2e per mode")
    if title:
        fig.suptitle(title)
    return fig

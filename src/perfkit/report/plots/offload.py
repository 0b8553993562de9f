"""The offload modes figure: device and host memory (MiB) and warm latency (ms) per offload mode
(:func:`offload_memory_latency`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfkit.report.plots.base import Figure, empty_note, is_finite, new_figure


def offload_memory_latency(modes: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Per offload mode: device reserved and host peak (MiB, left) and warm e2e (ms, right); a mode
    without a value gets its status written in place of the bar.

    Args:
        modes: ``mode``, ``status`` (ran / not applicable / failed), ``peak_reserved_mib``,
            ``host_pss_peak_mib``, ``warm_ms`` (the offload investigation's summary table).

    Returns:
        Figure with two axes (grouped memory bars, warm e2e bars)."""
    fig = new_figure(10.0, 4.2)
    ax_mem, ax_lat = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if modes is None or modes.empty or "mode" not in modes.columns:
        empty_note(ax_mem, "no offload modes")
        empty_note(ax_lat, "no offload modes")
        return fig
    names = [str(m) for m in modes["mode"]]
    status = [str(s) for s in modes.get("status", pd.Series(["ran"] * len(modes)))]
    x = np.arange(len(names))

    def col(name: str) -> list[float]:
        if name not in modes.columns:
            return [math.nan] * len(modes)
        return [float(v) if is_finite(v) else math.nan for v in pd.to_numeric(modes[name], errors="coerce")]

    dev, host, warm = col("peak_reserved_mib"), col("host_pss_peak_mib"), col("warm_ms")
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

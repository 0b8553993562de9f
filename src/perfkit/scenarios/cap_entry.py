"""What memory_budget reads from one launch under one budget (:func:`cap_entry`): did it
complete, did the cap hold, the peaks (MiB) and the latency (ms) it cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from perfkit.common.numfmt import json_float
from perfkit.engine.caps import MemoryCaps
from perfkit.measuring.launch_rows import LaunchData
from perfkit.scenarios.common import peak_mib

#: A warm request slower than the cold one by more than this fraction "degrades".
WARM_DEGRADE_TOLERANCE = 0.10


def cap_entry(data: LaunchData, cap: MemoryCaps, repeats: int) -> dict[str, Any]:
    """One ``caps`` entry of memory_budget's results from the launch ``data`` under ``cap``
    (``repeats`` requests asked): completion, whether the cap held, device peaks and host peaks
    (MiB), the caps in force, placement, cold and warm latency (ms) and ``warm_degrades``; see
    :func:`perfkit.scenarios.memory_budget.memory_budget` for every key."""
    df = data.sent_rows()
    ok = df[df["status"] == "completed"] if not df.empty else df
    lr = data.launch_row
    exceeded = bool(lr.get("cap_exceeded")) or (data.error or "").startswith("host memory cap exceeded")
    oom = bool(not df.empty and df["error"].fillna("").str.contains("out of device memory").any())
    e = {
        "label": cap.label,
        "device_cap_gib": cap.device_gib,
        "host_cap_gib": cap.host_gib,
        "completed": bool(len(ok) == repeats),
        "n_completed": int(len(ok)),
        "cap_held": bool(not exceeded and not oom),
        "host_cap_effective_gib": json_float(lr.get("host_cap_effective_gib")),
        "host_cap_clamp": _text(lr.get("host_cap_clamp")),
        "enforcement": lr.get("enforcement"),
        "cap_mechanism": _text(lr.get("cap_mechanism")),
        "host_source": _text(lr.get("host_source")),
        "peak_reserved_mib": json_float(ok["peak_reserved_mib"].max()) if len(ok) else None,
        "peak_allocated_mib": json_float(ok["peak_allocated_mib"].max()) if len(ok) else None,
        "load_peak_mib": json_float(lr.get("load_peak_mib")),
        "host_anon_peak_mib": peak_mib(data.memory, "host_anon_mib"),
        "host_pss_peak_mib": peak_mib(data.memory, "host_pss_mib", lr.get("host_pss_peak_mib")),
        "cgroup_peak_mib": peak_mib(data.memory, "cgroup_current_mib", lr.get("cgroup_peak_mib")),
        "placement": lr.get("placement"),
        "error": data.error or (None if len(ok) == repeats else "; ".join(df["error"].dropna().astype(str))),
    }
    if len(ok) >= 2:
        cold, warm = float(ok["e2e_ms"].iloc[0]), float(np.median(ok["e2e_ms"].iloc[1:]))
        e.update(cold_ms=cold, warm_ms=warm, warm_degrades=bool(warm > cold * (1 + WARM_DEGRADE_TOLERANCE)))
    else:
        cold = json_float(ok["e2e_ms"].iloc[0]) if len(ok) else None
        e.update(cold_ms=cold, warm_ms=None, warm_degrades=None)
    return e


def _text(v: Any) -> str | None:
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)

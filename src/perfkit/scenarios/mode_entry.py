"""What offload_modes reads from one launch (:func:`mode_entry`): its status, the placement the
engine reported, peaks (MiB) and latency (ms)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from perfkit.common.numfmt import json_float
from perfkit.measuring.launch_rows import LaunchData
from perfkit.readings.records import parse_lines
from perfkit.scenarios.common import peak_mib

#: A warm request slower than the cold one by more than this fraction fails
#: ``offload_warm_not_slower``.
WARM_TOLERANCE = 0.10

#: Row statuses.
RAN, NOT_APPLICABLE, FAILED = "ran", "not applicable", "failed"

#: The engine's refusal of a mode the device cannot run (refengine.placement).
REFUSAL_RE = re.compile(r"offload mode '(?P<mode>[\w-]+)' needs an accelerator; device is (?P<device>\w+)")


#: the placement facts the engine reports in its records, in results order
_REPORTED = (
    "placement offload placement_by_component offload_use_stream device compile_active "
    "compile_disabled_reason compile_requested"
).split()


def _reported(data: LaunchData) -> dict[str, Any]:
    """The engine's placement facts from the launch's last record (``perfkit`` extras), as
    measure_launch parsed them (a reused launch: its kept lines)."""
    report = data.report or parse_lines(data.record_lines)
    pk = next((r.perfkit for r in reversed(report.records) if r.perfkit), None)
    return {k: pk.get(k) for k in _REPORTED} if pk else {}


def mode_entry(data: LaunchData, mode: str, repeats: int) -> dict[str, Any]:
    """The results entry of one offload mode's launch: cold start parts (s), device and host
    peaks (MiB), the placement the engine reported, cold and warm latency (ms) and the status
    (``ran``, ``not applicable`` with the engine's reason, ``failed``); see
    :func:`perfkit.scenarios.offload_modes.offload_modes` for every key."""
    lr = data.launch_row
    df = data.sent_rows()
    ok = df[df["status"] == "completed"] if not df.empty else df
    m = REFUSAL_RE.search(data.error or "")
    refused = m.group(0) if m else None  # the engine's "not applicable" reason
    rep = _reported(data)
    ps, ml = json_float(lr.get("process_start_s")), json_float(lr.get("models_loaded_s"))
    e: dict[str, Any] = {
        "ready_s": json_float(lr.get("ready_s")),
        "process_start_s": ps,
        "load_s": (ml - ps) if ml is not None and ps is not None else ml,
        "warmup_s": json_float(lr.get("warmup_s")),
        "n_completed": int(len(ok)),
        "peak_reserved_mib": json_float(ok["peak_reserved_mib"].max()) if len(ok) else None,
        "peak_allocated_mib": json_float(ok["peak_allocated_mib"].max()) if len(ok) else None,
        "load_peak_mib": json_float(lr.get("load_peak_mib")),
        "host_anon_peak_mib": peak_mib(data.memory, "host_anon_mib"),
        # the host figure the checks use: PSS of the engine's tree (pinned offload buffers are
        # resident and mapped, so they count here; anon RSS leaves them out)
        "host_pss_peak_mib": peak_mib(data.memory, "host_pss_mib", lr.get("host_pss_peak_mib")),
        "cgroup_peak_mib": json_float(lr.get("cgroup_peak_mib")),
        "placement": rep.get("placement") or lr.get("placement"),
        **{k: rep.get(k) for k in _REPORTED[1:]},
        "cold_ms": json_float(ok["e2e_ms"].iloc[0]) if len(ok) else None,
        "warm_ms": json_float(np.median(ok["e2e_ms"].iloc[1:])) if len(ok) >= 2 else None,
    }
    if refused:
        e.update({"status": NOT_APPLICABLE, "reason": refused})
        m = REFUSAL_RE.search(refused)
        e["device"] = e["device"] or (m.group("device") if m else None)
    elif len(ok) == repeats and data.error is None:
        e.update({"status": RAN, "reason": None})
    else:
        why = data.error
        if not why and not df.empty:
            why = "; ".join(df["error"].dropna().astype(str))
        e.update({"status": FAILED, "reason": (why or "see the engine log").splitlines()[0][:300]})
    if e["status"] == RAN:
        off = e["offload"] or {}
        e["placement_matches"] = bool(off) and all(v == mode for v in off.values())
        cold, warm = e["cold_ms"], e["warm_ms"]
        e["warm_not_slower"] = (
            bool(warm <= cold * (1 + WARM_TOLERANCE)) if cold is not None and warm is not None else None
        )
    else:
        e["placement_matches"] = None
        e["warm_not_slower"] = None
    return e

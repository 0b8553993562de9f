"""Memory budget: does the pipeline fit a consumer budget (e.g. 12 GiB GPU + 32 GiB host), and
what does it cost in latency? (seed case 000)

A launch per cap; per request the peak device reserved/allocated and host anonymous RSS; the
placement the engine chose; whether the cap held; whether the warm request degrades.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfkit.bundle import ResultBundle, _gpu_info
from perfkit.caps import MemoryCaps
from perfkit.client import VideoRequestSpec
from perfkit.engine import EngineSpec
from perfkit.scenarios.common import assemble, json_float, measure_launch, reuse_launch

log = logging.getLogger(__name__)

#: A warm request slower than the cold one by more than this fraction "degrades".
WARM_DEGRADE_TOLERANCE = 0.10


def _req(request) -> VideoRequestSpec:
    return request if isinstance(request, VideoRequestSpec) else VideoRequestSpec.from_dict(request or {})


def memory_budget(spec: EngineSpec, caps: list[MemoryCaps | None] | None = None,
                  request: VideoRequestSpec | dict | None = None, repeats: int = 2,
                  run_dir: str | Path = "outputs/memory_budget", sample_interval_s: float = 0.1,
                  min_budget: dict[str, float] | None = None, reuse: Any = None) -> ResultBundle:
    """Run the memory-budget investigation.

    Args:
        spec: the engine.
        caps: one launch per entry (None or ``MemoryCaps()`` = unlimited). Default: unlimited and
            12 GiB device + 32 GiB host.
        request: the request, sent ``repeats`` times per launch (1 cold + warm).
        repeats: >= 1.
        min_budget: ``{"lo_gib", "hi_gib"}`` to also bisect the minimum device cap (GPU only).
        reuse: a cold_warm ResultBundle of this run; the unlimited cap takes its session when it
            ran the same spec and request without caps (results ``reused_launches``).

    Returns:
        ResultBundle ``memory_budget``; results ``caps`` has one entry per cap: ``label``,
        ``device_cap_gib``, ``host_cap_gib``, ``completed`` (all requests), ``cap_held``,
        ``enforcement``, ``peak_reserved_mb``/``peak_allocated_mb`` (device, MiB),
        ``host_anon_peak_mib`` (sampler), ``placement``, ``cold_ms``, ``warm_ms``,
        ``warm_degrades``, ``error``; ``min_budget_gib`` when asked (None on CPU).

    Raises:
        ValueError: repeats < 1.
    """
    if repeats < 1:
        raise ValueError(f"memory_budget: repeats must be >= 1, got {repeats}")
    caps = list(caps) if caps else [MemoryCaps(), MemoryCaps(device_gib=12, host_gib=32)]
    caps = [c if c is not None else MemoryCaps() for c in caps]
    req = _req(request)
    launches, entries, reused = [], [], []
    for i, cap in enumerate(caps):
        label = f"cap{i}"
        data = reuse_launch(reuse, spec, req, repeats, label, caps=cap) if reuse is not None else None
        if data is not None:
            reused.append(label)
        else:
            data = measure_launch(spec, [req] * repeats, Path(run_dir), label, caps=cap,
                                  sample_interval_s=sample_interval_s)
        data.launch_row["cap_label"] = cap.label
        launches.append(data)
        df = data.measured()
        ok = df[df["status"] == "completed"] if not df.empty else df
        lr = data.launch_row
        host_peak = float(data.memory["host_anon_mib"].max()) if not data.memory.empty else float("nan")
        exceeded = bool(lr.get("cap_exceeded")) or (data.error or "").startswith("host memory cap exceeded")
        oom = bool(not df.empty and df["error"].fillna("").str.contains("out of device memory").any())
        e = {
            "label": cap.label, "device_cap_gib": cap.device_gib, "host_cap_gib": cap.host_gib,
            "completed": bool(len(ok) == repeats), "n_completed": int(len(ok)),
            "cap_held": bool(not exceeded and not oom), "enforcement": lr.get("enforcement"),
            "peak_reserved_mb": json_float(ok["peak_reserved_mb"].max()) if len(ok) else None,
            "peak_allocated_mb": json_float(ok["peak_allocated_mb"].max()) if len(ok) else None,
            "load_peak_mb": json_float(lr.get("load_peak_mb")),
            "host_anon_peak_mib": json_float(host_peak),
            "placement": lr.get("placement"), "error": data.error or (None if len(ok) == repeats else
                                                                      "; ".join(df["error"].dropna().astype(str))),
        }
        if len(ok) >= 2:
            cold = float(ok["e2e_ms"].iloc[0])
            warm = float(np.median(ok["e2e_ms"].iloc[1:]))
            e.update({"cold_ms": cold, "warm_ms": warm,
                      "warm_degrades": bool(warm > cold * (1 + WARM_DEGRADE_TOLERANCE))})
        else:
            e.update({"cold_ms": json_float(ok["e2e_ms"].iloc[0]) if len(ok) else None, "warm_ms": None,
                      "warm_degrades": None})
        entries.append(e)
    results: dict[str, Any] = {"caps": entries, "warm_degrade_tolerance": WARM_DEGRADE_TOLERANCE,
                               "reused_launches": reused}
    if min_budget:
        mb = find_min_budget(spec, req, float(min_budget["lo_gib"]), float(min_budget["hi_gib"]),
                             run_dir=Path(run_dir) / "bisect", resolution_gib=float(min_budget.get("resolution_gib", 1.0)))
        results["min_budget_gib"] = mb.get("min_gib")
        results["min_budget_probes"] = mb.get("probes")
        results["min_budget_note"] = mb.get("note")
    params = {"spec": spec.to_dict(), "caps": [c.to_dict() for c in caps], "request": req.payload(),
              "repeats": repeats, "min_budget": min_budget}
    return assemble("memory_budget", launches, params, results, caps=caps)


def find_min_budget(spec: EngineSpec, request: VideoRequestSpec | dict | None, lo_gib: float, hi_gib: float,
                    run_dir: str | Path = "outputs/min_budget", resolution_gib: float = 1.0) -> dict[str, Any]:
    """Bisect the smallest device cap (GiB) at which one request completes.

    GPU only: without an NVIDIA GPU visible through NVML it logs why and returns
    ``{"min_gib": None, "note": ...}``. Each probe is a fresh launch with
    ``MemoryCaps(device_gib=mid)``; the search stops when ``hi - lo <= resolution_gib``.

    Returns:
        ``{"min_gib": float | None, "probes": [{"device_gib", "completed", "placement", "e2e_ms",
        "error"}], "note": str}``.

    Raises:
        ValueError: lo_gib >= hi_gib or non-positive bounds.
    """
    if not (0 < lo_gib < hi_gib):
        raise ValueError(f"find_min_budget: need 0 < lo_gib < hi_gib, got {lo_gib}, {hi_gib}")
    if not _gpu_info().get("gpu_count"):
        note = "find_min_budget needs a GPU (device caps are CUDA memory fractions); none visible: skipped"
        log.warning(note)
        return {"min_gib": None, "probes": [], "note": note}
    req = _req(request)
    probes: list[dict[str, Any]] = []

    def ok_at(gib: float) -> bool:
        data = measure_launch(spec, [req], Path(run_dir), f"probe{gib:g}GiB", caps=MemoryCaps(device_gib=gib),
                              stop_on_failure=True)
        df = data.measured()
        good = bool(not df.empty and (df["status"] == "completed").all() and data.error is None)
        probes.append({"device_gib": gib, "completed": good, "placement": data.launch_row.get("placement"),
                       "e2e_ms": json_float(df["e2e_ms"].iloc[0]) if not df.empty else None,
                       "error": data.error or (None if good else "; ".join(df["error"].dropna().astype(str)))})
        log.info("min budget probe %.2f GiB: %s", gib, "ok" if good else "failed")
        return good

    if not ok_at(hi_gib):
        return {"min_gib": None, "probes": probes, "note": f"fails even at {hi_gib} GiB"}
    lo, hi = lo_gib, hi_gib
    if ok_at(lo):
        return {"min_gib": lo, "probes": probes, "note": f"completes at the lower bound {lo} GiB"}
    while hi - lo > resolution_gib:
        mid = round((lo + hi) / 2, 2)
        if ok_at(mid):
            hi = mid
        else:
            lo = mid
    return {"min_gib": hi, "probes": probes, "note": f"smallest passing cap within {resolution_gib} GiB"}

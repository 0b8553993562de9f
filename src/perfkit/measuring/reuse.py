"""One engine launch serving several investigations: what a scenario would launch
(:class:`PlannedLaunch`, :func:`launch_key`) and taking a matching earlier launch's rows instead
of launching again (:func:`reuse_launch`; seed 001: share a launch across the cases that can)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from perfkit.bundle import WARMUP_INDEX, table_rows
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.launch_rows import LaunchData

log = logging.getLogger(__name__)


def reuse_launch(
    bundle: Any,
    spec: EngineSpec,
    request: VideoRequestSpec,
    n_requests: int,
    label: str,
    caps: MemoryCaps | None = None,
) -> LaunchData | None:
    """A launch of another investigation that already measured what this one would launch for.

    ``bundle`` may be a list of candidates. Returns the first ``n_requests`` measured requests
    (plus the startup warmup) of ``bundle``'s single launch, relabelled ``label``, when it ran the
    same engine spec and request under the same caps with at least that many; else None.
    """
    if isinstance(bundle, (list, tuple)):  # several candidates: the first that fits
        for b in bundle:
            data = reuse_launch(b, spec, request, n_requests, label, caps=caps)
            if data is not None:
                return data
        return None
    if bundle is None or not getattr(bundle, "tables", None):
        return None
    params = bundle.meta.get("params") or {}
    launches = bundle.launches
    if (
        len(launches) != 1
        or params.get("spec") != spec.to_dict()
        or params.get("request") != request.payload()
    ):
        return None
    their_caps = (bundle.meta.get("caps") or [None])[0]
    mine = caps.to_dict() if caps is not None and not caps.unlimited else None
    theirs = (
        their_caps if their_caps and (their_caps.get("device_gib") or their_caps.get("host_gib")) else None
    )
    if (mine or None) != (theirs or None):
        return None
    req = bundle.requests
    measured = (req["index"] != WARMUP_INDEX).fillna(False) if not req.empty else None
    if req.empty or int(measured.sum()) < n_requests:
        return None
    src = launches.iloc[0]["launch"]
    keep = req[((req["launch"] == src) & (req["index"] < n_requests)).fillna(False).to_numpy(bool)]
    ids = set(keep["request_id"].astype(str))
    kept = keep[(keep["index"] != WARMUP_INDEX).fillna(False).to_numpy(bool)]
    if len(kept) < n_requests or (kept["status"] != "completed").fillna(True).any():
        return None

    def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
        if df.empty:
            return []
        sel = df[df["request_id"].astype(str).isin(ids)].copy()
        sel["launch"] = label
        return table_rows(sel)

    data = LaunchData(label=label)
    data.requests = rows(req)
    data.stages = rows(bundle.stages)
    data.steps = rows(bundle.steps)
    mem = bundle.memory
    if not mem.empty:
        t_end = float(pd.to_numeric(keep["t_end_s"], errors="coerce").max()) + 0.5
        mem = mem[((mem["launch"] == src) & (mem["t_s"] <= t_end)).fillna(False).to_numpy(bool)].copy()
        mem["launch"] = label
    data.memory = mem
    lr = table_rows(launches.iloc[:1])[0]
    lr.update({"launch": label, "label": label, "reused_from": f"{bundle.scenario}/{src}"})
    data.launch_row = lr
    data.record_lines = [ln for ln in bundle.records.get(src, []) if any(i in ln for i in ids)]
    data.logs = {k.replace(src, label, 1): v for k, v in bundle.logs.items() if k.startswith(src)}
    data.command = str(lr.get("command") or "").split()
    data.gpus = list(((bundle.meta.get("launch_gpus") or {}).get(src)) or [])
    err = lr.get("error")
    data.error = None if err is None or (isinstance(err, float) and math.isnan(err)) else str(err)
    log.info("%s reuses the %s launch of %s (%d requests)", label, src, bundle.scenario, n_requests)
    return data


@dataclass(frozen=True)
class PlannedLaunch:
    """What a scenario would launch, as the scale-out planner sees it: ``keys`` (its
    :func:`launch_key` identities; empty: never matched), ``requests`` (measured requests it
    sends), ``reuses`` (it takes a matching earlier launch instead of launching)."""

    keys: tuple[str, ...]
    requests: int
    reuses: bool = False


def launch_key(spec: EngineSpec, request: VideoRequestSpec, caps: MemoryCaps | None = None) -> str:
    """The identity :func:`reuse_launch` compares (engine spec, request payload, caps as asked
    when they cap anything), as a JSON string."""
    import json

    mine = caps.to_dict() if caps is not None and not caps.unlimited else None
    return json.dumps([spec.to_dict(), request.payload(), mine], sort_keys=True, default=str)

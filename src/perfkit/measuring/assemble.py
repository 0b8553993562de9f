"""Launches -> one :class:`~perfkit.bundle.ResultBundle`; split parts' bundles -> one
(:func:`join_bundles`, :func:`relabel`); one launch serving several investigations
(:class:`PlannedLaunch`, :func:`launch_key`, :func:`reuse_launch`; seed 001)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from perfkit.bundle import WARMUP_INDEX, ResultBundle, conform, environment_meta, table_rows
from perfkit.bundle_schema import sampler_frame
from perfkit.engine.argv import engine_versions
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.launch_rows import LaunchData


def assemble(
    investigation: str,
    launches: Iterable[LaunchData],
    params: dict[str, Any],
    results: dict[str, Any],
    caps: list[MemoryCaps | None] | None = None,
) -> ResultBundle:
    """A ResultBundle of ``launches``. Raises ValueError: a row carries an undeclared column."""
    launches = list(launches)
    versions: dict[str, dict[str, Any]] = {}  # sglang, torch, diffusers: asked once per program
    for d in launches:
        if d.command and d.command[0] not in versions:
            versions[d.command[0]] = engine_versions(d.command)
    mems = [sampler_frame(d.memory) for d in launches if not d.memory.empty]
    tables = {
        "requests": pd.DataFrame([r for d in launches for r in d.requests]),
        "stages": pd.DataFrame([r for d in launches for r in d.stages]),
        "steps": pd.DataFrame([r for d in launches for r in d.steps]),
        "memory": pd.concat(mems, ignore_index=True) if mems else pd.DataFrame(),
        "launches": pd.DataFrame([d.launch_row for d in launches]),
    }
    tables = {name: conform(name, df) for name, df in tables.items()}
    meta = environment_meta()
    meta.update(
        {
            "params": params,
            "commands": {d.label: d.command for d in launches},
            "engine_versions": {d.label: versions[d.command[0]] for d in launches if d.command},
            "launch_gpus": {d.label: d.gpus for d in launches},
            "caps": [c.to_dict() if c is not None else None for c in (caps or [])],
        }
    )
    return ResultBundle(
        investigation=investigation,
        meta=meta,
        results=results,
        tables=tables,
        records={d.label: d.record_lines for d in launches},
        logs={k: v for d in launches for k, v in d.logs.items()},
    )


def join_bundles(
    investigation: str, parts: list[ResultBundle], params: dict[str, Any], results: dict[str, Any]
) -> ResultBundle:
    """One bundle of an investigation's split parts. Raises ValueError: none, or another's."""
    if not parts:
        raise ValueError(f"{investigation}: nothing to join (no part bundles)")
    for b in parts:
        if b.investigation != investigation:
            raise ValueError(f"{investigation}: cannot join a {b.investigation!r} bundle ({b.path})")
    tables = {}
    for name in {n for b in parts for n in b.tables}:
        frames = [b.tables[name] for b in parts if name in b.tables and not b.tables[name].empty]
        tables[name] = conform(name, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    meta = dict(parts[0].meta)
    meta["params"] = params
    meta["commands"] = {k: v for b in parts for k, v in (b.meta.get("commands") or {}).items()}
    meta["caps"] = [c for b in parts for c in (b.meta.get("caps") or [])]
    return ResultBundle(
        investigation=investigation,
        meta=meta,
        results=results,
        tables=tables,
        records={k: v for b in parts for k, v in b.records.items()},
        logs={k: v for b in parts for k, v in b.logs.items()},
    )


def relabel(bundle: ResultBundle, old: str, new: str) -> ResultBundle:
    """``bundle`` with launch label ``old`` renamed ``new`` everywhere, in place; returned."""
    if old == new:
        return bundle
    for name, df in bundle.tables.items():
        for col in ("launch", "label"):
            if col in df.columns and not df.empty:
                df = df.copy()
                df[col] = df[col].where(df[col].astype("string") != old, new)
        bundle.tables[name] = df
    bundle.records = {(new if k == old else k): v for k, v in bundle.records.items()}
    cmds = bundle.meta.get("commands") or {}
    bundle.meta["commands"] = {(new if k == old else k): v for k, v in cmds.items()}
    bundle.logs = {(new + k[len(old) :] if k.startswith(old + ".") else k): v for k, v in bundle.logs.items()}
    return bundle


log = logging.getLogger(__name__)


def reuse_launch(
    bundle: Any,
    spec: EngineSpec,
    request: VideoRequestSpec,
    n_requests: int,
    label: str,
    caps: MemoryCaps | None = None,
) -> LaunchData | None:
    """The first ``n_requests`` (and the warmup) of ``bundle``'s (or the first fitting candidate's)
    single launch, relabelled ``label``, when it ran the same spec, request and caps; else None."""
    if isinstance(bundle, (list, tuple)):
        found = (reuse_launch(b, spec, request, n_requests, label, caps=caps) for b in bundle)
        return next((d for d in found if d is not None), None)
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
    theirs = (bundle.meta.get("caps") or [None])[0]
    if _asked(caps) != (theirs if theirs and (theirs.get("device_gib") or theirs.get("host_gib")) else None):
        return None
    req = bundle.requests
    if req.empty:
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
    lr.update({"launch": label, "label": label, "reused_from": f"{bundle.investigation}/{src}"})
    data.launch_row = lr
    data.record_lines = [ln for ln in bundle.records.get(src, []) if any(i in ln for i in ids)]
    data.logs = {k.replace(src, label, 1): v for k, v in bundle.logs.items() if k.startswith(src)}
    data.command = str(lr.get("command") or "").split()
    data.gpus = list(((bundle.meta.get("launch_gpus") or {}).get(src)) or [])
    err = lr.get("error")
    data.error = None if err is None or (isinstance(err, float) and math.isnan(err)) else str(err)
    log.info("%s reuses the %s launch of %s (%d requests)", label, src, bundle.investigation, n_requests)
    return data


@dataclass(frozen=True)
class PlannedLaunch:
    """What an investigation would launch (:func:`launch_key` ``keys``), for the scale-out planner."""

    keys: tuple[str, ...]
    requests: int
    reuses: bool = False


def launch_key(spec: EngineSpec, request: VideoRequestSpec, caps: MemoryCaps | None = None) -> str:
    """The identity :func:`reuse_launch` compares (spec, request, caps), as a JSON string."""
    return json.dumps([spec.to_dict(), request.payload(), _asked(caps)], sort_keys=True, default=str)


def _asked(caps: MemoryCaps | None) -> dict[str, Any] | None:
    return caps.to_dict() if caps is not None and not caps.unlimited else None

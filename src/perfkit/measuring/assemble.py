"""Launches -> one :class:`~perfkit.bundle.ResultBundle`, and the bundles of a scenario's split
parts -> the bundle the unsplit scenario would have written (:func:`join_bundles`,
:func:`relabel`)."""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from perfkit.bundle import ResultBundle, conform, environment_meta
from perfkit.bundle_schema import sampler_frame
from perfkit.engine.argv import engine_versions
from perfkit.engine.caps import MemoryCaps
from perfkit.measuring.launch_rows import LaunchData


def assemble(
    scenario: str,
    launches: Iterable[LaunchData],
    params: dict[str, Any],
    results: dict[str, Any],
    caps: list[MemoryCaps | None] | None = None,
) -> ResultBundle:
    """Build a ResultBundle from launches (tables concatenated and conformed, records and logs
    kept). ``params`` (``meta["params"]``) must hold ``spec`` and ``request`` dicts: a replay
    compares them with its params (:func:`perfkit.bundle.identity_differences`).

    Raises:
        ValueError: a row carries a column its table does not declare.
    """
    launches = list(launches)
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
            # sglang, torch, diffusers as installed where each engine ran (not perfkit's)
            "engine_versions": _engine_versions(launches),
            # the GPUs each launch ran on, matched by UUID (meta "gpus" lists every GPU here)
            "launch_gpus": {d.label: d.gpus for d in launches},
            "caps": [c.to_dict() if c is not None else None for c in (caps or [])],
        }
    )
    return ResultBundle(
        scenario=scenario,
        meta=meta,
        results=results,
        tables=tables,
        records={d.label: d.record_lines for d in launches},
        logs={k: v for d in launches for k, v in d.logs.items()},
    )


def _engine_versions(launches: list[LaunchData]) -> dict[str, dict[str, Any]]:
    """:func:`perfkit.engine.argv.engine_versions` per launch label, asked once per program."""
    seen: dict[str, dict[str, Any]] = {}
    for d in launches:
        if d.command and d.command[0] not in seen:
            seen[d.command[0]] = engine_versions(d.command)
    return {d.label: seen[d.command[0]] for d in launches if d.command}


def join_bundles(
    scenario: str, parts: list[ResultBundle], params: dict[str, Any], results: dict[str, Any]
) -> ResultBundle:
    """One bundle from the bundles of a scenario's split parts
    (:attr:`perfkit.scenarios.registry.Scenario.split`): tables concatenated in part order and
    conformed, records, logs, commands and caps united, the first part's environment,
    ``params`` and ``results`` as given.

    Raises:
        ValueError: no parts, or a part of another scenario (naming it).
    """
    if not parts:
        raise ValueError(f"{scenario}: nothing to join (no part bundles)")
    for b in parts:
        if b.scenario != scenario:
            raise ValueError(f"{scenario}: cannot join a {b.scenario!r} bundle ({b.path})")
    tables = {}
    for name in {n for b in parts for n in b.tables}:
        frames = [b.tables[name] for b in parts if name in b.tables and not b.tables[name].empty]
        tables[name] = conform(name, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    meta = dict(parts[0].meta)
    meta["params"] = params
    meta["commands"] = {k: v for b in parts for k, v in (b.meta.get("commands") or {}).items()}
    meta["caps"] = [c for b in parts for c in (b.meta.get("caps") or [])]
    return ResultBundle(
        scenario=scenario,
        meta=meta,
        results=results,
        tables=tables,
        records={k: v for b in parts for k, v in b.records.items()},
        logs={k: v for b in parts for k, v in b.logs.items()},
    )


def relabel(bundle: ResultBundle, old: str, new: str) -> ResultBundle:
    """``bundle`` with launch label ``old`` renamed ``new`` in place (tables' ``launch`` and
    ``label`` columns, records, commands, log names): ``cap0`` of a part is ``cap2`` of the
    whole. Returns ``bundle``."""
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

"""Bundles written by an older schema version read in the current columns, in memory (files on
disk are never rewritten): :func:`upgrade_table`, :func:`upgrade_results`, and a sampler frame in
the memory table's columns (:func:`sampler_frame`).
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from perfkit.bundle_schema.columns import SCHEMA_VERSION, WARMUP_INDEX


# --------------------------------------------------------------------------- version 1
def _v1(*names: str) -> dict[str, str]:
    """{version 1 name: ``name``}: a ``_mib`` name was ``_mb``, an ``_s`` epoch time had no suffix."""
    return {n[:-2] + "b" if n.endswith("_mib") else n[:-2]: n for n in names}


#: table -> {version 1 column: version 2 column}
V1_COLUMN_RENAMES: dict[str, dict[str, str]] = {
    "requests": _v1("peak_allocated_mib", "peak_reserved_mib", "reserved_mib", "t_start_s", "t_end_s"),
    "stages": _v1("peak_allocated_mib", "t_start_s", "t_end_s"),
    "steps": {},
    "memory": _v1("t_s"),
    "launches": _v1("load_peak_mib", "load_peak_allocated_mib", "warmup_peak_mib"),
}
#: results.json: list key -> {version 1 key of its entries: version 2 key}
V1_RESULTS_ENTRY_RENAMES: dict[str, dict[str, str]] = {
    "caps": _v1("peak_reserved_mib", "peak_allocated_mib", "load_peak_mib")
}
_V1_WARMUP_TAG = "warmup"


def sampler_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A :class:`perfkit.readings.sampler.MemorySampler` frame (``t``, ``gpu_util_pct``) in the
    memory table's columns (``t_s``, ``gpu_util_fraction`` = pct / 100). Frames already in
    the table's columns pass unchanged."""
    df = frame.rename(columns=V1_COLUMN_RENAMES["memory"])
    if "gpu_util_pct" in df.columns:
        df = df.assign(gpu_util_fraction=pd.to_numeric(df["gpu_util_pct"], errors="coerce") / 100.0)
        df = df.drop(columns=["gpu_util_pct"])
    return df


def upgrade_table(name: str, df: pd.DataFrame, version: int) -> pd.DataFrame:
    """``df`` of table ``name`` written by schema ``version``, in the current columns.

    Version 1: columns renamed (:data:`V1_COLUMN_RENAMES`), ``gpu_util_pct`` -> fraction, and the
    ``tag`` column folded into ``index`` (a row tagged ``warmup`` gets :data:`WARMUP_INDEX`) and
    dropped. Values are otherwise unchanged (MiB stay MiB, seconds stay seconds).
    """
    if version >= SCHEMA_VERSION or df is None:
        return df
    out = df.rename(columns=V1_COLUMN_RENAMES.get(name, {}))
    if name == "memory":
        out = sampler_frame(out)
    if "tag" in out.columns and name in ("requests", "stages", "steps"):
        warm = out["tag"].astype("string").str.lower() == _V1_WARMUP_TAG
        if "index" in out.columns and warm.fillna(False).any():
            out = out.copy()
            out.loc[warm.fillna(False).to_numpy(bool), "index"] = WARMUP_INDEX
        out = out.drop(columns=["tag"])
    return out


def upgrade_results(results: Mapping[str, Any], version: int = 1) -> dict[str, Any]:
    """results.json written by schema ``version``, with the current keys (a new dict).

    Version 1: entries of ``caps`` (memory_budget) get ``peak_reserved_mib``,
    ``peak_allocated_mib`` and ``load_peak_mib`` for the ``_mb`` keys (values in MiB, unchanged);
    the verdicts it recorded (``thresholds``, and ``passed``/``threshold`` of each leak check) are
    dropped: checks are judged again from the measured values against the invariants of the
    replay, so a recorded verdict cannot contradict the gate.
    Idempotent: already current keys pass unchanged; ``schema_version`` is dropped.
    """
    out = {k: v for k, v in dict(results or {}).items() if k != "schema_version"}
    if version >= SCHEMA_VERSION:
        return out
    out.pop("thresholds", None)
    if isinstance(out.get("leak_checks"), list):
        out["leak_checks"] = [
            {k: v for k, v in c.items() if k not in ("passed", "threshold")} if isinstance(c, dict) else c
            for c in out["leak_checks"]
        ]
    for key, renames in V1_RESULTS_ENTRY_RENAMES.items():
        entries = out.get(key)
        if isinstance(entries, list):
            out[key] = [
                {renames.get(k, k): v for k, v in e.items()} if isinstance(e, dict) else e for e in entries
            ]
    return out

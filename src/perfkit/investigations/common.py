"""Helpers the investigations share that are not measuring: the columns of a summary table
(:func:`pick_columns`) and a first request's extra time per stage (:func:`stage_penalty`).
Measuring one launch lives in :mod:`perfkit.measuring`; number formats in
:mod:`perfkit.common.numfmt`."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

from perfkit.common.numfmt import fmt, json_float
from perfkit.engine.client import VideoRequestSpec

NAN = math.nan


def as_request(request: VideoRequestSpec | Mapping[str, Any] | None) -> VideoRequestSpec:
    """``request`` as a :class:`VideoRequestSpec` (a params mapping or None: ``from_dict``)."""
    return request if isinstance(request, VideoRequestSpec) else VideoRequestSpec.from_dict(request or {})


def mib(v: Any) -> str:
    """``412 MiB`` (``–`` when missing)."""
    return fmt(v, ".0f", " MiB")


def stage_penalty(stages: pd.DataFrame, first_id: str, warm_ids: list[str]) -> dict[str, float]:
    """Stage -> (first request ms - median warm ms)."""
    if stages.empty:
        return {}
    first = stages[stages["request_id"] == first_id].groupby("stage", sort=False)["ms"].sum()
    warm = (
        stages[stages["request_id"].isin(warm_ids)].groupby(["request_id", "stage"], sort=False)["ms"].sum()
    )
    warm_med = warm.groupby("stage").median() if not warm.empty else pd.Series(dtype=float)
    return {st: float(first[st] - warm_med.get(st, NAN)) for st in first.index}


#: the header of a host-anon peak column: anonymous RSS summed over the processes of the engine's
#: tree counts a page shared copy-on-write by forked processes once per process (a 400 MiB block
#: in a parent and two forked children sums to 1,200 MiB); the tree's memory once is its PSS
ANON_SUM_LABEL = "host anon peak, summed per process (MiB)"


def host_peak_text(c: Mapping[str, Any]) -> str:
    """``host PSS peak 412 MiB`` (the tree's memory, shared pages once) from ``host_pss_peak_mib``;
    where PSS was not read (an older bundle, a kernel without smaps_rollup) the summed anon
    peak, saying so."""
    pss, anon = json_float(c.get("host_pss_peak_mib")), json_float(c.get("host_anon_peak_mib"))
    if pss is not None:
        return f"host PSS peak {mib(pss)}"
    if anon is not None:
        return f"host anon peak {mib(anon)} (summed per process; PSS not read)"
    return "host peak –"


def peak_mib(memory: pd.DataFrame, col: str, launch_peak: Any = None) -> float | None:
    """The larger of a memory column's sampled maximum and the launch row's peak (MiB); None
    when neither was measured (never 0)."""
    vals = [json_float(launch_peak)]
    if memory is not None and not memory.empty and col in memory:
        vals.append(json_float(pd.to_numeric(memory[col], errors="coerce").max()))
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def pick_columns(
    df: pd.DataFrame, columns: Iterable[str], sparse: Iterable[str] = ("error",)
) -> pd.DataFrame:
    """The listed ``columns`` that ``df`` has, in that order; a ``sparse`` column (an error, a
    clamp) only when some row has a value. The full rows stay in results.json."""
    if df.empty:
        return df
    keep = [c for c in columns if c in df.columns]
    keep = [c for c in keep if c not in set(sparse) or not df[c].isna().all()]
    return df[keep].rename(columns={"host_anon_peak_mib": ANON_SUM_LABEL})

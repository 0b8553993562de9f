"""Helpers the investigations share that are not measuring: the columns of a summary table
(:func:`pick_columns`) and a first request's extra time per stage (:func:`stage_penalty`).
Measuring one launch lives in :mod:`perfkit.measuring`; number formats in
:mod:`perfkit.common.numfmt`."""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd

NAN = math.nan


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


def pick_columns(
    df: pd.DataFrame, columns: Iterable[str], sparse: Iterable[str] = ("error",)
) -> pd.DataFrame:
    """The listed ``columns`` that ``df`` has, in that order; a ``sparse`` column (an error, a
    clamp) only when some row has a value. The full rows stay in results.json."""
    if df.empty:
        return df
    keep = [c for c in columns if c in df.columns]
    keep = [c for c in keep if c not in set(sparse) or not df[c].isna().all()]
    return df[keep]

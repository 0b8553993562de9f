"""A frame as its table declares it (:func:`conform`: every declared column, in order, cast to its
dtype), an empty declared frame (:func:`empty`) and a table's one-row-per-key rule
(:func:`check_rows`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfkit.bundle_schema.columns import TABLES


def _cast(s: pd.Series, dtype: str) -> pd.Series:
    if str(s.dtype) == dtype:
        return s
    if dtype == "string":
        return s.map(lambda v: None if _missing(v) else str(v)).astype("string")
    if dtype == "boolean":
        return s.map(lambda v: pd.NA if _missing(v) else bool(v)).astype("boolean")
    if dtype in ("Int64", "int64", "float64"):
        num = pd.to_numeric(s, errors="coerce")
        bad = s[(num.isna() & ~s.map(_missing)) | s.map(lambda v: dtype == "float64" and isinstance(v, str))]
        if len(bad):  # text in a number column: an error, never a silent NaN (issue 54)
            raise ValueError(f"column {s.name!r} holds {bad.iloc[0]!r}, not a number ({dtype})")
        if dtype == "float64":
            return num.astype("float64")
        frac = num[num.notna() & (num != num.round())] if num.dtype.kind == "f" else num[:0]
        if len(frac):  # 1.5 as a request index was rounded to 2: another request's row
            raise ValueError(f"column {s.name!r} holds {float(frac.iloc[0])!r}, not an integer ({dtype})")
        # integers that came as floats (NaN-padded) or strings
        return num.round().astype("Int64") if num.dtype.kind == "f" else num.astype(dtype)
    return s.astype(dtype)


def _missing(v: Any) -> bool:
    if v is None or v is pd.NA:
        return True
    if isinstance(v, (float, np.floating)):
        return math.isnan(v)
    return False


def conform(name: str, df: pd.DataFrame | None) -> pd.DataFrame:
    """``df`` as table ``name`` declares it: every declared column, in declared order, cast to
    its dtype; a missing column is added all-NA.

    Raises:
        KeyError: ``name`` is not a declared table.
        ValueError: ``df`` has a column the table does not declare (the message names the table
            and the column), or a number column holds a value that is not a number (text in a
            float column).
    """
    table = TABLES[name]
    df = pd.DataFrame() if df is None else df
    extra = [c for c in df.columns if c not in table.names]
    if extra:
        raise ValueError(
            f"table {name!r}: undeclared column(s) {', '.join(map(repr, extra))} "
            f"(declare them in perfkit.bundle_schema.TABLES[{name!r}])"
        )
    n = len(df)
    cols = {}
    for c in table.columns:
        if c.name in df.columns:
            cols[c.name] = _cast(df[c.name].reset_index(drop=True), c.dtype)
        else:
            cols[c.name] = pd.Series(
                [pd.NA] * n if c.dtype in ("string", "boolean", "Int64") else [np.nan] * n, dtype=c.dtype
            )
    out = pd.DataFrame(cols, columns=table.names)
    out.index = df.index if n else out.index
    return out


#: the columns that name one row of a table (its measured requests' rows, index >= 0)
ROW_KEYS = {"requests": ("launch", "index"), "stages": ("launch", "index", "stage")}
#: rows a bundle table may hold: a day of 0.1 s memory samples is 864,000
MAX_ROWS = 5_000_000


def check_rows(name: str, df: pd.DataFrame) -> None:
    """Raise ValueError when a measured request (``index >= 0``) or one of its stages has two rows
    in table ``name`` (a duplicated row was summed into a stage time, or compared as the request)."""
    keys = ROW_KEYS.get(name)
    if keys is None or df.empty:
        return
    rows = df[(df["index"] >= 0).fillna(False)]
    dup = rows[rows.duplicated(list(keys))]
    if len(dup):
        first = ", ".join(f"{k} {v!r}" if isinstance(v := dup.iloc[0][k], str) else f"{k} {v}" for k in keys)
        raise ValueError(f"two rows for {first}: one row each is what perfkit writes")


def empty(name: str) -> pd.DataFrame:
    """An empty frame with table ``name``'s declared columns and dtypes."""
    return conform(name, None)

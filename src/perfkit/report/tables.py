"""One table formatter for the report page and the Markdown summary.

:func:`format_table` turns a DataFrame into header labels and rows of display strings; the
page's templates and :func:`markdown_table` both render from it, so a number reads the same in
``report.html`` and ``summary.md``:

- no index column;
- integers as integers; floats by :func:`perfkit.checks.number_text` (the rule check reasons
  use too): ``>= 100`` no decimals, ``>= 10`` one, ``>= 1`` two, below that three, never
  exponent notation (``0.016``; ``-3.91e-13`` reads ``0``);
- missing values (None, NaN, ``pd.NA``, ``NaT``) as ``"–"``;
- booleans as ``"yes"`` / ``"no"``;
- strings unchanged (a ``status`` column keeps its word; the page colours it by CSS class).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfkit.checks import number_text

__all__ = ["MISSING", "Table", "cell_text", "format_table", "markdown_table", "status_class"]

#: what a missing value reads as
MISSING = "–"


def cell_text(v: Any) -> str:
    """The display string of one cell value (see the module doc for the rules).

    Accepts Python and numpy scalars, None/NaN/``pd.NA``/``NaT``, and anything else (shown with
    ``str``, newlines folded into spaces). Never raises on a value.
    """
    if v is None or v is pd.NA or v is pd.NaT:
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if bool(v) else "no"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        f = float(v)
        if math.isnan(f):
            return MISSING
        if math.isinf(f):
            return "∞" if f > 0 else "-∞"
        return number_text(f)
    if isinstance(v, str):
        return v.replace("\r\n", " ").replace("\n", " ")
    try:
        if pd.api.types.is_scalar(v) and pd.isna(v):
            return MISSING
    except (TypeError, ValueError):
        pass
    return str(v).replace("\n", " ")


@dataclass(frozen=True)
class Table:
    """A formatted table: what the templates and the Markdown summary render.

    Attributes:
        header: column labels, in the DataFrame's order (``len == n_columns``).
        rows: one list of display strings per DataFrame row (each ``len == len(header)``).
        status_col: index of the column whose cells are status words (coloured by the page),
            or None.
    """

    header: list[str]
    rows: list[list[str]]
    status_col: int | None = None

    def __iter__(self):
        """Unpacks as ``header, rows``."""
        return iter((self.header, self.rows))

    @property
    def empty(self) -> bool:
        """True when the table has no rows."""
        return not self.rows


def format_table(df: pd.DataFrame, status_col: str | None = "status") -> Table:
    """Header labels and rows of display strings of ``df`` (index dropped).

    Args:
        df: any DataFrame (object, numeric, boolean or nullable columns).
        status_col: name of the column holding status words, marked in
            :attr:`Table.status_col` when ``df`` has it; None for no status column.

    Returns:
        a :class:`Table` (``header, rows = format_table(df)`` unpacks it).

    Raises:
        TypeError: if ``df`` is not a DataFrame.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"format_table needs a DataFrame, got {type(df).__name__}")
    header = [str(c) for c in df.columns]
    rows = [[cell_text(v) for v in rec] for rec in df.itertuples(index=False, name=None)]
    idx = header.index(status_col) if status_col is not None and status_col in header else None
    return Table(header=header, rows=rows, status_col=idx)


def status_class(word: str) -> str:
    """The CSS class suffix of a status word: ``"pass"`` -> ``"pass"``,
    ``"skipped (no bundle)"`` -> ``"skipped"`` (first word, lower case, ``[a-z0-9-]`` only)."""
    first = (str(word).strip().split() or [""])[0].lower()
    return re.sub(r"[^a-z0-9-]+", "", first) or "none"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``df``, cells from :func:`format_table` (``|`` escaped)."""
    t = format_table(df, None)
    lines = [
        "| " + " | ".join(_md_escape(h) for h in t.header) + " |",
        "|" + "|".join("---" for _ in t.header) + "|",
    ]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)

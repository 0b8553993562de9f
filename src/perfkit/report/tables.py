"""One table formatter for the report page, the Markdown summary and the notebooks
(:func:`format_table`; :func:`markdown_table` and :func:`styled` render from it). The rules:
docs/suite.md, "The report page".
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from perfkit.common.numfmt import number_text
from perfkit.common.slugs import md_text

#: what a missing value reads as
MISSING = "–"

#: ``transpose="auto"`` turns a table with more columns than this (and fewer rows than
#: columns) on its side
WIDE_COLUMNS = 8

#: column-name suffix -> unit shown in the header
_UNIT_WORDS = {"ms": "ms", "s": "s", "mib": "MiB", "gib": "GiB", "mb": "MiB", "gb": "GiB", "pct": "%"}
#: strings that mean "not measured" when they reach a table (a ``str(None)`` upstream)
_MISSING_WORDS = {"None", "nan", "NaN", "<NA>", "NaT", "null"}


def cell_text(v: Any) -> str:
    """The display string of one cell value (the module doc's rules); never raises."""
    if v is None or v is pd.NA or v is pd.NaT:
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if bool(v) else "no"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        f = float(v)
        if math.isnan(f):
            return MISSING
        if math.isinf(f):
            return "∞" if f > 0 else "-∞"
        return number_text(f)
    if isinstance(v, str):
        if v.strip() in _MISSING_WORDS:
            return MISSING
        return v.replace("\r\n", " ").replace("\n", " ")
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={cell_text(x)}" for k, x in v.items()) or MISSING
    if isinstance(v, (list, tuple, set, np.ndarray)):
        return ", ".join(cell_text(x) for x in v) or MISSING
    try:
        if pd.api.types.is_scalar(v) and pd.isna(v):
            return MISSING
    except (TypeError, ValueError):
        pass
    return str(v).replace("\n", " ")


def column_label(name: Any) -> str:
    """A column's header, words and unit: ``peak_reserved_mib`` -> ``peak reserved (MiB)``,
    ``ms`` -> ``time (ms)``, ``host_anon_slope_mib_per_request`` -> ``host anon slope
    (MiB/request)``; a label with a space or brackets is kept."""
    s = str(name)
    if " " in s or "(" in s or "_" not in s and s.lower() not in _UNIT_WORDS:
        return s
    words = s.split("_")
    per = ""
    if "per" in words[1:-1]:
        i = len(words) - 1 - words[::-1].index("per")
        per, words = "/" + " ".join(words[i + 1 :]), words[:i]
    unit = _UNIT_WORDS.get(words[-1].lower()) if words else None
    if unit is not None:
        words = words[:-1] or ["time" if unit in ("ms", "s") else "memory"]
        return f"{' '.join(words)} ({unit}{per})"
    return " ".join(words) + (f" (per {per[1:]})" if per else "")


@dataclass(frozen=True)
class Table:
    """``header`` (labels), ``rows`` (display strings, ``len(header)`` each), ``status_col`` (index of
    the status column the page colours, or None), ``transposed`` (first column: the labels)."""

    header: list[str]
    rows: list[list[str]]
    status_col: int | None = None
    transposed: bool = False

    def __iter__(self):
        """Unpacks as ``header, rows``."""
        return iter((self.header, self.rows))

    @property
    def empty(self) -> bool:
        """True when the table has no rows."""
        return not self.rows

    @property
    def wide(self) -> bool:
        """More than :data:`WIDE_COLUMNS` columns (the page wraps its cells tighter)."""
        return len(self.header) > WIDE_COLUMNS


def format_table(
    df: pd.DataFrame,
    status_col: str | None = "status",
    *,
    labels: bool = True,
    transpose: bool | str = False,
) -> Table:
    """``df`` as a :class:`Table` (index dropped; headers through :func:`column_label` with
    ``labels``); ``transpose`` True: one row per column, headed by the first column's cells;
    ``"auto"``: so for a wide table with few rows.

    Raises:
        TypeError: if ``df`` is not a DataFrame."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"format_table needs a DataFrame, got {type(df).__name__}")
    header = [column_label(c) if labels else str(c) for c in df.columns]
    rows = [[cell_text(v) for v in rec] for rec in df.itertuples(index=False, name=None)]
    names = [str(c) for c in df.columns]
    idx = names.index(status_col) if status_col is not None and status_col in names else None
    if transpose == "auto":
        transpose = df.shape[1] > WIDE_COLUMNS and 0 < df.shape[0] < df.shape[1]
    if transpose and header:
        t_header = [header[0], *(r[0] for r in rows)]
        t_rows = [[header[j], *(r[j] for r in rows)] for j in range(1, len(header))]
        return Table(header=t_header, rows=t_rows, status_col=None, transposed=True)
    return Table(header=header, rows=rows, status_col=idx)


def status_class(word: str) -> str:
    """The CSS class suffix of a status word: ``"pass"`` -> ``"pass"``,
    ``"skipped (no bundle)"`` -> ``"skipped"`` (first word, lower case, ``[a-z0-9-]`` only)."""
    first = (str(word).strip().split() or [""])[0].lower()
    return re.sub(r"[^a-z0-9-]+", "", first) or "none"


def markdown_table(df: pd.DataFrame, *, labels: bool = True, own_markdown: bool = False) -> str:
    """A GitHub Markdown table of ``df`` (:func:`format_table`), cells through
    :func:`perfkit.common.slugs.md_text`; ``own_markdown`` keeps the cells' Markdown (the
    project's own text), escaping only ``|`` and line breaks.

    Raises:
        TypeError: if ``df`` is not a DataFrame."""
    t = format_table(df, None, labels=labels)

    def cell(c: str) -> str:
        return " ".join(c.replace("|", "\\|").splitlines()) if own_markdown else md_text(c, cell=True)

    lines = [
        "| " + " | ".join(cell(h) for h in t.header) + " |",
        "|" + "|".join("---" for _ in t.header) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


#: inline style of a status word by its class (notebooks have no report stylesheet)
_STATUS_STYLE = {
    **dict.fromkeys(("pass", "ok", "ran"), "color:#1a7f37;font-weight:600"),
    **dict.fromkeys(("fail", "error", "regression", "failed"), "color:#cf222e;font-weight:600"),
    "improved": "color:#0969da;font-weight:600",
}
_CELL_STYLE = [
    {"selector": "", "props": "border-collapse:collapse;margin:.4em 0;font-size:.9em;max-width:100%"},
    {
        "selector": "th, td",
        "props": "border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top",
    },
    {"selector": "td", "props": "overflow-wrap:break-word"},
    {"selector": "th", "props": "background:#f6f8fa;overflow-wrap:normal;word-break:normal"},
]


def styled(
    df: pd.DataFrame,
    status_col: str | None = "status",
    *,
    labels: bool = True,
    transpose: bool | str = "auto",
    caption: str | None = None,
) -> Any:
    """A pandas ``Styler`` of ``df`` (:func:`format_table`; a labelled index becomes the first
    column, headed by its name or "row"), status words coloured, text HTML-escaped.

    Raises:
        TypeError: if ``df`` is not a DataFrame."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"styled needs a DataFrame, got {type(df).__name__}")
    if not _default_index(df):  # a labelled index (a transposed frame) is a column of its own
        df = df.reset_index()
        if str(df.columns[0]) in ("index", "level_0"):
            df = df.rename(columns={df.columns[0]: "row"})
    t = format_table(df, status_col, labels=labels, transpose=transpose)
    shown = pd.DataFrame(t.rows, columns=pd.Index(_unique(t.header)))
    # cells and headers are text (reasons hold "<=" and engine messages): HTML-escaped
    st = shown.style.format(escape="html").format_index(escape="html", axis=1)
    st = st.hide(axis="index").set_table_styles(_CELL_STYLE)
    if t.status_col is not None and not shown.empty:
        col = shown.columns[t.status_col]
        st = st.map(lambda w: _STATUS_STYLE.get(status_class(w), "color:#6e7781"), subset=[col])
    if caption:
        st = st.set_caption(caption)
    return st


def _default_index(df: pd.DataFrame) -> bool:
    """True when the index is unnamed integers (not shown); a named or labelled index is data."""
    idx = df.index
    return idx.nlevels == 1 and idx.name is None and (len(idx) == 0 or idx.dtype.kind in "iu")


def _unique(header: list[str]) -> list[str]:
    """Column labels made unique (a Styler needs them so): repeats get `` (2)``, ..."""
    seen: dict[str, int] = {}
    out = []
    for h in header:
        n = seen.get(h, 0) + 1
        seen[h] = n
        out.append(h if n == 1 else f"{h} ({n})")
    return out


def use_in_notebook() -> bool:
    """Render every DataFrame a notebook cell displays through :func:`styled` (HTML output).
    False outside IPython (nothing done), else True; safe to call twice."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, lambda df: styled(df).to_html())
    return True

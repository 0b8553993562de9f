"""One table formatter for the page, summary.md and notebooks (:func:`format_table`), and the
notebooks' tables beside the plots (requests, first-request costs, verdicts). Rules: docs/suite.md."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from perfkit.bundle import WARMUP_INDEX
from perfkit.checks import NOT_REPORTED, Check, check_table, is_reported, overall_status, reported_count
from perfkit.common.frames import align_frames, latent_frames
from perfkit.common.numfmt import number_text
from perfkit.common.slugs import md_text
from perfkit.gate.verdicts import check_counts
from perfkit.investigations import registry
from perfkit.investigations.common import first_vs_warm
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP
from perfkit.roles import request_roles as plot_roles

#: what a missing value reads as
MISSING = "–"

#: ``transpose="auto"`` turns a table with more columns than this (and fewer rows than
#: columns) on its side
_WIDE_COLUMNS = 8

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
    """A column's header: ``peak_reserved_mib`` -> ``peak reserved (MiB)``, ``ms`` -> ``time (ms)``,
    ``x_mib_per_request`` -> ``x (MiB/request)``; a label with a space or brackets is kept."""
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
    """``rows``: display strings; ``status_col``: the column the page colours; ``transposed``: labels first."""

    header: list[str]
    rows: list[list[str]]
    status_col: int | None = None
    transposed: bool = False

    def __iter__(self):
        return iter((self.header, self.rows))

    @property
    def empty(self) -> bool:
        """True when the table has no rows."""
        return not self.rows

    @property
    def wide(self) -> bool:
        """More than :data:`_WIDE_COLUMNS` columns (the page wraps its cells tighter)."""
        return len(self.header) > _WIDE_COLUMNS


def format_table(
    df: pd.DataFrame,
    status_col: str | None = "status",
    *,
    labels: bool = True,
    transpose: bool | str = False,
) -> Table:
    """``df`` as a :class:`Table` (headers :func:`column_label` with ``labels``; ``transpose``: a row
    per column, ``"auto"`` for a wide table). Raises TypeError: ``df`` is not a DataFrame."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"format_table needs a DataFrame, got {type(df).__name__}")
    header = [column_label(c) if labels else str(c) for c in df.columns]
    rows = [[cell_text(v) for v in rec] for rec in df.itertuples(index=False, name=None)]
    names = [str(c) for c in df.columns]
    idx = names.index(status_col) if status_col is not None and status_col in names else None
    if transpose == "auto":
        transpose = df.shape[1] > _WIDE_COLUMNS and 0 < df.shape[0] < df.shape[1]
    if transpose and header:
        t_header = [header[0], *(r[0] for r in rows)]
        t_rows = [[header[j], *(r[j] for r in rows)] for j in range(1, len(header))]
        return Table(header=t_header, rows=t_rows, status_col=None, transposed=True)
    return Table(header=header, rows=rows, status_col=idx)


def status_class(word: str) -> str:
    """The CSS class suffix of a status word: its first word, lower case, ``[a-z0-9-]`` only."""
    first = (str(word).strip().split() or [""])[0].lower()
    return re.sub(r"[^a-z0-9-]+", "", first) or "none"


#: an HTML tag's start: ``<`` before a letter, ``/``, ``!`` or ``?`` (``<= 1`` stays as written)
_TAG = re.compile(r"<(?=[A-Za-z/!?])")


def _check_cell(v: Any, name: bool) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.2f}"
    if name:  # case ids and metric names (stage names) come from outside
        return md_text(v)
    t = _TAG.sub("&lt;", str(v).replace("\\", "&#92;")).replace("\r", " ").replace("\n", " ")
    return t.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")


def markdown_table(
    df: pd.DataFrame, *, labels: bool = True, own_markdown: bool = False, checks: bool = False
) -> str:
    """A GitHub Markdown table of ``df``, cells through ``md_text`` (``own_markdown``: kept, ``|`` escaped;
    ``checks``: as ``perfkit compare`` prints it). Raises TypeError: ``df`` is not a DataFrame."""
    if checks:
        header = [str(c) for c in df.columns]
        rows = [
            [_check_cell(v, c in ("case", "metric")) for v, c in zip(rec, header)]
            for rec in df.itertuples(index=False)
        ]
    else:
        t = format_table(df, None, labels=labels)

        def cell(c: str) -> str:
            return " ".join(c.replace("|", "\\|").splitlines()) if own_markdown else md_text(c, cell=True)

        header, rows = [cell(h) for h in t.header], [[cell(c) for c in row] for row in t.rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


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
    """A pandas ``Styler`` of ``df`` (:func:`format_table`; a labelled index a first column), status
    words coloured, text HTML-escaped. Raises TypeError: ``df`` is not a DataFrame."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"styled needs a DataFrame, got {type(df).__name__}")
    if not _default_index(df):  # a labelled index (a transposed frame) is a column of its own
        df = df.reset_index()
        if str(df.columns[0]) in ("index", "level_0"):
            df = df.rename(columns={df.columns[0]: "row"})
    t = format_table(df, status_col, labels=labels, transpose=transpose)
    shown = pd.DataFrame(t.rows, columns=pd.Index(_unique(t.header)))
    st = shown.style.format(escape="html").format_index(escape="html", axis=1)
    st = st.hide(axis="index").set_table_styles(_CELL_STYLE)
    if t.status_col is not None and not shown.empty:
        col = shown.columns[t.status_col]
        st = st.map(lambda w: _STATUS_STYLE.get(status_class(w), "color:#6e7781"), subset=[col])
    if caption:
        st = st.set_caption(caption)
    return st


def _default_index(df: pd.DataFrame) -> bool:
    idx = df.index
    return idx.nlevels == 1 and idx.name is None and (len(idx) == 0 or idx.dtype.kind in "iu")


def _unique(header: list[str]) -> list[str]:
    """Repeats get `` (2)``, ... (a Styler needs unique labels)."""
    seen: dict[str, int] = {}
    out = []
    for h in header:
        n = seen.get(h, 0) + 1
        seen[h] = n
        out.append(h if n == 1 else f"{h} ({n})")
    return out


def use_in_notebook() -> bool:
    """Render every DataFrame a notebook cell displays through :func:`styled`; False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    ip.display_formatter.formatters["text/html"].for_type(pd.DataFrame, lambda df: styled(df).to_html())
    return True


#: request roles (:func:`perfkit.roles.request_roles`', the cold one split by its shape's warmup)
_COLD_NEW_SHAPE = "cold, new shape"
#: the roles of a request that ran its shape first in its launch
_FIRST_OF_SHAPE = (ROLE_COLD, _COLD_NEW_SHAPE, ROLE_NEW_SHAPE)


def show_table(df: pd.DataFrame, caption: str | None = None, transpose: bool | str = "auto") -> None:
    """Display ``df`` through :func:`styled`. Raises TypeError: ``df`` is not a DataFrame."""
    from IPython.display import display

    display(styled(df, caption=caption, transpose=transpose))


def _int(v: Any) -> int | None:
    try:
        return None if pd.isna(v) else int(v)
    except (TypeError, ValueError):
        return None


def _shape_text(row: Mapping[str, Any]) -> str:
    """``"24→25 frames (4 latent), 512x768, 30 steps"``."""
    nf, eff = _int(row.get("num_frames")), _int(row.get("effective_num_frames"))
    if eff is None and nf is not None:
        eff = align_frames(nf)
    frames = "–" if nf is None else (f"{nf}→{eff}" if eff is not None and eff != nf else f"{nf}")
    lat = _int(row.get("latent_frames"))
    if lat is None and eff is not None:
        lat = latent_frames(eff)
    h, w, steps = _int(row.get("height")), _int(row.get("width")), _int(row.get("steps"))
    parts = [f"{frames} frames" + (f" ({lat} latent)" if lat is not None else "")]
    if h is not None and w is not None:
        parts.append(f"{h}x{w}")
    if steps is not None:
        parts.append(f"{steps} steps")
    return ", ".join(parts)


def request_roles(requests: pd.DataFrame, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """``requests`` with ``role``, ``shape`` (``"24→25 frames (4 latent), 512x768, 30 steps"``) and
    ``request``. Raises ValueError: ``requests`` lacks the ``launch`` or ``index`` column."""
    if missing := [c for c in ("launch", "index") if c not in requests.columns]:
        raise ValueError(f"request_roles: the requests table has no {', '.join(missing)} column")
    df = requests.reset_index(drop=True)
    # each row's roles by position (request_id: the row number), ROLE_WARM where none came back
    roles = plot_roles(df.assign(request_id=df.index), launches).set_index("request_id").reindex(df.index)
    cold_new = (roles["role"] == ROLE_COLD) & roles["new_shape"].fillna(False).astype(bool)
    df["role"] = roles["role"].fillna(ROLE_WARM).mask(cold_new, _COLD_NEW_SHAPE).tolist()
    df["shape"] = [_shape_text(r) for _, r in df.iterrows()]
    df["request"] = [
        f"{r['launch']} " + ("warmup" if r["role"] == ROLE_WARMUP else f"#{_int(r['index'])} {r['role']}")
        for _, r in df.iterrows()
    ]
    return df


def request_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """Every request for display (e2e and compile times in ms)."""
    if requests is None or requests.empty:
        return pd.DataFrame(columns=["launch", "#", "role", "shape", "e2e (ms)", "status"])
    df = request_roles(requests)
    out = pd.DataFrame(
        {
            "launch": df["launch"],
            "#": [("warmup" if _int(i) == WARMUP_INDEX else _int(i)) for i in df["index"]],
            "role": df["role"],
            "shape": df["shape"],
            "e2e (ms)": df.get("e2e_ms"),
            "compiles": _told(df.get("compiles", [None] * len(df)), count=True),
            "compiling (ms)": _told(df.get("compile_ms", [None] * len(df))),
            "recompile reason": [_reason(v) for v in df.get("recompile_reasons", [None] * len(df))],
            "status": df.get("status"),
        }
    )
    if out["recompile reason"].isna().all():
        out = out.drop(columns=["recompile reason"])
    return out.reset_index(drop=True)


def _told(values: Iterable[Any], count: bool = False) -> list[Any]:
    """Each value as reported (an int for a ``count``), else "not reported"."""
    return [
        NOT_REPORTED if not is_reported(v) else (reported_count(v) if count else float(v)) for v in values
    ]


def _reason(v: Any) -> str | None:
    return (str(v).strip() or None) if is_reported(v) else None


def first_request_costs(requests: pd.DataFrame, stages: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cold or first-of-a-new-shape request: its penalty (ms) over the warm median."""
    cols = ["launch", "request", "shape", "first (ms)", "warm median (ms)", "penalty (ms)", "penalty stage"]
    cols += ["stage penalty (ms)", "compiles", "compiling (ms)", "recompile reason"]
    if requests is None or requests.empty:
        return pd.DataFrame(columns=cols)
    df = request_roles(requests)
    ok = df[df.get("status", "completed").astype("string").fillna("completed") == "completed"]
    out = []
    for i, r in ok.iterrows():
        if r["role"] not in _FIRST_OF_SHAPE:
            continue
        warm = ok[(ok["launch"] == r["launch"]) & (ok["role"] == ROLE_WARM)]
        warm = warm[warm["shape"] == r["shape"]]  # the roles' shape: one rule for both
        wmed = float(warm["e2e_ms"].median()) if not warm.empty else math.nan
        first = float(r["e2e_ms"]) if pd.notna(r.get("e2e_ms")) else math.nan
        stage, stage_ms = penalty_stage(stages, r, warm)
        out.append(
            {
                "launch": r["launch"],
                "request": f"#{_int(r['index'])} {r['role']}",
                "shape": r["shape"],
                "first (ms)": first,
                "warm median (ms)": wmed,
                "penalty (ms)": first - wmed,
                "penalty stage": stage,
                "stage penalty (ms)": stage_ms,
                "compiles": _told([r.get("compiles")], count=True)[0],
                "compiling (ms)": _told([r.get("compile_ms")])[0],
                "recompile reason": _reason(r.get("recompile_reasons")),
            }
        )
    return pd.DataFrame(out, columns=cols)


def penalty_stage(stages: pd.DataFrame | None, first: Mapping[str, Any], warm: pd.DataFrame) -> tuple:
    """(stage, ms) holding most of ``first``'s excess over the ``warm`` median; (None, nan) when none."""
    if stages is None or warm.empty or "request_id" not in stages.columns:
        return None, math.nan
    ids = pd.concat([pd.Series([first.get("request_id")]), warm["request_id"]], ignore_index=True)
    *_, pen, top = first_vs_warm(pd.DataFrame({"request_id": ids, "e2e_ms": math.nan}), stages)
    return (top, pen[top]) if top is not None else (None, math.nan)


def verdict_markdown(rows: Iterable[Check | Mapping[str, Any]], what: str = "Gate") -> str:
    """The verdict in sentences: status and counts, then the checks by status with reasons."""
    df = check_table(list(rows))
    if df.empty:
        return f"**{what}: nothing gated** (no invariant of this investigation has a limit)."
    status = overall_status(df)
    lines = [f"**{what}: {status}.** {check_counts(df['status'])}."]

    def listed(sub: pd.DataFrame) -> str:
        return ", ".join(
            md_text(m, code=True) + (f" ({md_text(r)})" if r else "")
            for m, r in zip(sub["metric"], sub["reason"])
        )

    clean = not df["status"].isin(("fail", "inconclusive")).any()
    for statuses, word in (
        (("fail",), "Failed"),
        (("inconclusive",), "Inconclusive (over the limit within the run's noise)"),
        (("skipped",), "Not measured, so not judged"),
        (("pass", "improved", "new"), "Every measured check passed" if clean else "Passed"),
    ):
        sub = df[df["status"].isin(statuses)]
        if not sub.empty:
            lines.append(f"{word}: {listed(sub)}.")
    return " ".join(lines)


def check_frame(rows: Iterable[Check | Mapping[str, Any]], with_case: bool = False) -> pd.DataFrame:
    """The check rows: metric, limit (bound, else expected), measured, status, reason."""
    df = check_table(list(rows))
    df = df.assign(
        limit=pd.to_numeric(df["bound"], errors="coerce").fillna(
            pd.to_numeric(df["expected"], errors="coerce")
        )
    )
    cols = ["case"] * with_case + ["metric", "limit", "measured", "status", "reason"]
    return df.rename(columns={"actual": "measured"})[cols].reset_index(drop=True)


def invariants_frame(investigation: str, given: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Each invariant of ``investigation``: default, ``given``, in effect. Raises KeyError (unknown
    investigation), ValueError (an unknown invariant in ``given``)."""
    s = registry.get(investigation)
    merged = registry.merged_invariants(given)
    defaults = s.invariant_defaults()
    given = dict(given or {})
    rows = [(k, d, given.get(k), merged.get(k)) for k, d in defaults.items()]
    return pd.DataFrame(rows, columns=["invariant", "default", "given", "in effect"])


def _comparable(given: Any, recorded: Any) -> Any:
    """``recorded`` reduced to what ``given`` states; a cap without limits reads as None."""
    if given is None and isinstance(recorded, Mapping) and "label" in recorded:
        if recorded.get("device_gib") is None and recorded.get("host_gib") is None:
            return None
    if isinstance(given, Mapping) and isinstance(recorded, Mapping):
        return {k: _comparable(given[k], recorded.get(k)) for k in given if given[k] is not None}
    if (
        isinstance(given, (list, tuple))
        and isinstance(recorded, (list, tuple))
        and len(given) == len(recorded)
    ):
        return [_comparable(g, r) for g, r in zip(given, recorded)]
    return recorded


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _value_text(v: Any) -> str:
    """A params value in plain words: ``[{'label': 'x', 'device_gib': 12}]`` -> ``[x (device_gib 12)]``."""
    if isinstance(v, Mapping):
        items = {k: x for k, x in v.items() if x is not None}
        label = items.pop("label", None)
        inner = ", ".join(f"{k} {_value_text(x)}" for k, x in items.items())
        if label is not None:
            return f"{label}" + (f" ({inner})" if inner else "")
        return inner or "{}"
    if isinstance(v, (list, tuple)):
        return "[" + "; ".join(_value_text(x) for x in v) + "]"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return number_text(float(v)) if isinstance(v, float) else str(v)
    return str(v)


def replay_markdown(recorded_params: Mapping[str, Any] | None, given: Mapping[str, Any], source: str) -> str:
    """What a replay of ``source`` re-applies, and each ``given`` param the bundle was not measured with."""
    lines = [
        f"Replayed from {md_text(source, code=True)}: the measurements are the recorded ones; the checks are judged "
        "again, here, against the limits below (a verdict recorded in the bundle is not used)."
    ]
    rec = dict(recorded_params or {})
    diffs = []
    for key, value in given.items():
        if key not in rec:
            continue
        want, had = _plain(value), _plain(_comparable(value, rec[key]))
        if want != had:
            diffs.append(
                f"{md_text(key, code=True)}: given {md_text(_value_text(want))}, "
                f"measured with {md_text(_value_text(_plain(rec[key])))}"
            )
    if diffs:
        lines.append(
            "These params differ from what the bundle was measured with and cannot apply to a "
            "replay (the table and plots show what was measured): " + "; ".join(diffs) + "."
        )
    return " ".join(lines)

"""Helpers the figure modules share: bundle unpacking, launch names, ms ticks, the figure, its PNG
and alt text, and the colours (stages by class, request roles). Times in ms, memory in MiB."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd

from perfkit.bundle_schema import WARMUP_INDEX
from perfkit.common.numfmt import json_float
from perfkit.readings import stages as _stages
from perfkit.readings.stages import order_stages as ordered_stages  # noqa: F401 (the plots' name)
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP, is_finite, launches_of  # noqa: F401

if TYPE_CHECKING:  # annotations only: matplotlib is imported where a figure is drawn (new_figure)
    from matplotlib.figure import Figure
else:
    Figure = Any  # what the figure modules import to annotate, without importing matplotlib


def launch_names(launches: pd.DataFrame | None) -> dict[Any, str]:
    """Launch label -> legend name: its caps (``"12 GiB GPU + 32 GiB host"``, ``"unlimited"``
    beside capped ones), else ``"warmup 17 frames"`` when warmups differ, else the label."""
    if launches is None or launches.empty or "launch" not in launches.columns:
        return {}
    rows = [r for _, r in launches.iterrows()]
    capped = any(json_float(r.get("device_cap_gib")) or json_float(r.get("host_cap_gib")) for r in rows)
    wf = {json_float(r.get("warmup_frames")) for r in rows}
    out: dict[Any, str] = {}
    for r in rows:
        lk = r.get("launch")
        dev, host, frames = (
            json_float(r.get(k)) for k in ("device_cap_gib", "host_cap_gib", "warmup_frames")
        )
        if capped:
            parts = ([f"{dev:g} GiB GPU"] if dev else []) + ([f"{host:g} GiB host"] if host else [])
            out[lk] = " + ".join(parts) or "unlimited"
        elif len(wf) > 1 and frames is not None:
            out[lk] = f"warmup {frames:g} frames"
        else:
            out[lk] = str(lk)
    return out


def unbundle(obj: Any, main: str, **given: Any) -> tuple[Any, dict[str, Any]]:
    """(the ``main`` table, ``given`` with each None filled from the bundle, plus ``meta``) of
    ``obj``: a ResultBundle passed where a table is expected, or that table itself."""
    if not (hasattr(obj, "tables") and hasattr(obj, "requests")) or isinstance(obj, pd.DataFrame):
        return obj, {**given, "meta": {}}
    filled = {k: v if v is not None else getattr(obj, k) for k, v in given.items()}
    return getattr(obj, main), {**filled, "meta": dict(getattr(obj, "meta", {}) or {})}


def ms_text(v: float) -> str:
    """``"827 ms"``, ``"57.4 s"``, ``"2.31 ms"``."""
    if not is_finite(v):
        return "–"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v / 1000:,.1f} s"
    if abs(v) >= 10:
        return f"{v:.0f} ms"
    return f"{v:.2g} ms" if abs(v) >= 0.01 else "0 ms"


def use_log(values: Iterable[float], spread: float = 30.0) -> bool:
    """A log axis when the positive values span more than ``spread`` x."""
    v = np.asarray([float(x) for x in values if is_finite(x) and float(x) > 0])
    return bool(v.size >= 2 and v.max() / v.min() > spread)


def drop_warmup(df: pd.DataFrame, include_warmup: bool) -> pd.DataFrame:
    """Rows that are not the startup warmup (``index == WARMUP_INDEX``), unless ``include_warmup``."""
    if include_warmup or df.empty or "index" not in df.columns:
        return df
    keep = pd.Series(pd.to_numeric(df["index"], errors="coerce") != WARMUP_INDEX, index=df.index)
    return df[keep.fillna(True).to_numpy(bool)]


def of_launch(df: pd.DataFrame | None, launch: Any) -> pd.DataFrame | None:
    """The rows of ``launch`` (all when ``launch`` is None or ``df`` has no launch column)."""
    if df is None or launch is None or "launch" not in df.columns:
        return df
    return df[df["launch"] == launch]


def empty_note(ax: Any, text: str) -> None:
    """Write ``text`` in grey in the middle of an axis that has nothing to draw."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def x_text(ax: Any, x: float, y: float, text: str, **kw: Any) -> None:
    """``text`` centred at data ``x`` and axes-fraction ``y``, 7 pt."""
    ax.text(x, y, text, transform=ax.get_xaxis_transform(), ha="center", fontsize=7, **kw)


def new_figure(width: float, height: float) -> Figure:
    """A pyplot-free, constrained-layout Figure of ``width`` x ``height`` inches."""
    from matplotlib.figure import Figure  # here: drawing is the only reason to import matplotlib

    return Figure(figsize=(width, height), layout="constrained")


def one_axis(width: float, height: float) -> tuple[Figure, Any]:
    """:func:`new_figure` with its one axis."""
    fig = new_figure(width, height)
    return fig, fig.add_subplot()


def figure_to_png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG and return the bytes (for embedding in an HTML report)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def alt_text(fig: Figure) -> str:
    """The ``img`` alt text of ``fig``: its title and each axis (``"y label vs x label"``)."""
    parts = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        parts.append(sup.get_text())
    for ax in fig.get_axes():
        if not ax.get_visible() or (not ax.has_data() and not ax.get_title()):
            continue
        t, y, x = ax.get_title(), ax.get_ylabel(), ax.get_xlabel()
        desc = f"{y} vs {x}" if y and x else (y or x)
        parts.append(f"{t}: {desc}" if t and desc else (t or desc))
    text = "; ".join(p.replace("\n", " ") for p in parts if p)
    return text or "perfkit figure"


def ms_axis(ax: Any, axis: str = "y") -> None:
    """Log-scale an axis in ms with readable tick labels (``10 ms``, ``1 s``, ``60 s``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    a = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a.set_major_locator(LogLocator(base=10))
    a.set_major_formatter(FuncFormatter(lambda v, _pos: ms_text(v).replace(".0 s", " s")))


def ms_y(ax: Any, what: str, log: bool) -> None:
    """Label the y axis ``what (ms)``, log-scaled (:func:`ms_axis`) with ``log``, else from 0."""
    if log:
        ms_axis(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{what} ({'ms, s; log scale' if log else 'ms'})")


def integer_xticks(ax: Any) -> None:
    """Integer ticks on the x axis (request and step indices)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


#: Pipeline stage order; stages not listed are drawn after these, in order of appearance.
STAGE_ORDER = _stages.PIPELINE_ORDER

#: Stage colours by class: the n-th stage of a class in one figure takes the n-th shade; others
#: from :data:`OTHER_STAGE_COLORS` in pipeline order.
STAGE_CLASS_COLORS = {
    _stages.DENOISING: ("tab:blue", "#6baed6", "#08519c", "#c6dbef"),
    _stages.REFINEMENT: ("tab:purple", "#9e9ac8", "#54278f", "#dadaeb"),
    _stages.DECODING: ("tab:green", "#74c476", "#006d2c", "#c7e9c0"),
}
OTHER_STAGE_COLORS = (
    "tab:orange",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
    "#ffbb78",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#c7c7c7",
)


#: Colour of the cold request (index 0) in every figure.
COLD_COLOR = "tab:red"

#: Request role (:mod:`perfkit.roles`) -> colour in every figure.
ROLE_COLORS = {
    ROLE_COLD: COLD_COLOR,
    ROLE_NEW_SHAPE: "tab:orange",
    ROLE_WARMUP: "tab:gray",
    ROLE_WARM: "tab:blue",
}
#: a request's role from its :func:`perfkit.roles.request_label` (others: warm)
LABEL_ROLES = {"cold": ROLE_COLD, "warmup": ROLE_WARMUP}


def stage_colors(stage_cols: list[str]) -> dict[str, Any]:
    """Stage -> colour: by stage class (see :data:`STAGE_CLASS_COLORS`)."""
    out: dict[str, Any] = {}
    used = {c: 0 for c in STAGE_CLASS_COLORS}
    j = 0
    for s in stage_cols:
        cls = _stages.stage_class(s)
        if cls in STAGE_CLASS_COLORS:
            shades = STAGE_CLASS_COLORS[cls]
            out[s] = shades[used[cls] % len(shades)]
            used[cls] += 1
        else:
            out[s] = OTHER_STAGE_COLORS[j % len(OTHER_STAGE_COLORS)]
            j += 1
    return out

"""Matplotlib figures for perfkit bundles: one function per figure, each returns a Figure.

Every function takes the DataFrames of a :class:`perfkit.bundle.ResultBundle` (columns as in
:mod:`perfkit.bundle_schema`: times in ms, memory in MiB, ``t*_s`` in epoch seconds) and returns a
:class:`matplotlib.figure.Figure`. Nothing here calls ``plt.show``; figures are built with
``matplotlib.figure.Figure`` directly, not through pyplot, so they work under any backend
(Agg included), are not kept alive by pyplot's global figure list (no leak in long loops,
no double display in Jupyter when a cell returns one) and need no closing; ``plt.close(fig)``
on them is a harmless no-op. In a notebook, show one with ``display(fig)`` or by returning
it as the cell's value; :func:`figure_to_png_bytes` renders one to PNG for reports.

Words follow the design doc: cold request (index 0), warm request (index >= 1), startup
warmup (``index == WARMUP_INDEX``, -1; excluded by default), first-request penalty, covered
shape; stage names are sglang's.
"""

from __future__ import annotations

import io
import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from perfkit.bundle import WARMUP_INDEX
from perfkit.readings import stages as _stages

__all__ = [
    "STAGE_ORDER",
    "STATUS_COLORS",
    "request_label",
    "request_roles",
    "launch_names",
    "alt_text",
    "stage_breakdown",
    "e2e_per_request",
    "step_times",
    "coverage_heatmap",
    "memory_timeline",
    "baseline_vs_actual",
    "offload_memory_latency",
    "ab_forest",
    "step_timeline",
    "figure_to_png_bytes",
]

#: Pipeline stage order (:data:`perfkit.readings.stages.PIPELINE_ORDER`: the reference engine's and
#: sglang's stage names, LTX-2 included); stages not listed are drawn after these, in order of
#: appearance.
STAGE_ORDER = _stages.PIPELINE_ORDER

#: Stage colours by class (:func:`perfkit.readings.stages.stage_class`): denoising in blues, refinement in
#: purples, decoding in greens (the n-th stage of a class in one figure takes the n-th shade),
#: every other stage from :data:`OTHER_STAGE_COLORS` in pipeline order.
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

#: Colour per verdict status in :func:`baseline_vs_actual`.
STATUS_COLORS = {"pass": "tab:green", "fail": "tab:red", "improved": "tab:blue", "new": "tab:grey"}

COLD_COLOR = "tab:red"


# --------------------------------------------------------------------------- helpers


def request_label(index: Any) -> str:
    """``"cold"`` for index 0, ``"warm #i"`` for index i >= 1, ``"warmup"`` for the startup
    warmup (``WARMUP_INDEX``, -1). Index only; :func:`request_roles` also knows the shape."""
    try:
        i = int(index)
    except (TypeError, ValueError):
        return str(index)
    if i == 0:
        return "cold"
    if i == WARMUP_INDEX:
        return "warmup"
    return f"warm #{i}"


#: request roles (:func:`request_roles`)
ROLE_WARMUP = "startup warmup"
ROLE_COLD = "cold"
ROLE_NEW_SHAPE = "first of a new shape"
ROLE_WARM = "warm"

_ROLE_KEYS = ("launch", "request_id", "index")


def _frames_of(r: Mapping[str, Any]) -> int | None:
    for k in ("effective_num_frames", "num_frames"):
        v = r.get(k)
        if _finite(v):
            return int(float(v))
    return None


def _shape_key(r: Mapping[str, Any]) -> str:
    ls = r.get("latent_shape")
    if isinstance(ls, str) and ls:
        return ls
    return f"{_frames_of(r)}x{r.get('height')}x{r.get('width')}"


def request_roles(requests: pd.DataFrame | None, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """The role and shape of every request, in the design doc's words, per launch.

    Within a launch (requests in index order): the startup warmup (``index == WARMUP_INDEX``)
    is ``startup warmup``; index 0 is ``cold`` (the first request after ready); a later request
    whose latent shape neither the warmup nor an earlier request ran is ``first of a new
    shape``; every other request is ``warm``, numbered per shape (``warm #2`` is the second warm
    request of that shape). The shape is the latent shape when recorded, else frames x height x
    width; frames are the frames generated (``effective_num_frames``, else ``num_frames``).

    Args:
        requests: the bundle's requests table (launch, request_id, index, num_frames, ...).
        launches: the launches table; its ``warmup_latent_shape`` counts as run by the warmup
            when the warmup request itself is not in ``requests``.

    Returns:
        one row per request with ``launch``, ``request_id``, ``index``, ``frames`` (Int64),
        ``shape``, ``role``, ``new_shape`` (bool: the warmup and earlier requests had not run
        its shape), ``label`` (``"warm #3 · 25 frames"``, ``"first of a new shape · 25
        frames"``, ``"cold · 17 frames"``) and ``short`` (the role alone: ``"warm #3"``,
        ``"new shape"``, ``"cold"``, ``"warmup"``); empty (same columns) for no requests.
    """
    cols = ["launch", "request_id", "index", "frames", "shape", "role", "new_shape", "label", "short"]
    if requests is None or requests.empty or "index" not in requests.columns:
        return pd.DataFrame(columns=cols)
    warm_shapes: dict[Any, set[str]] = {}
    if launches is not None and not launches.empty and "warmup_latent_shape" in launches.columns:
        for _, lr in launches.iterrows():
            ws = lr.get("warmup_latent_shape")
            if isinstance(ws, str) and ws:
                warm_shapes.setdefault(lr.get("launch"), set()).add(ws)
    req = requests.assign(_i=pd.to_numeric(requests["index"], errors="coerce"))
    if "launch" not in req.columns:
        req = req.assign(launch=None)
    out = []
    for lk in _launches(req):
        sub = req[req["launch"] == lk] if lk is not None else req
        sub = sub.sort_values("_i", kind="stable")
        seen = set(warm_shapes.get(lk, set()))
        n_warm: dict[str, int] = {}
        for _, r in sub.iterrows():
            rd = r.to_dict()
            frames = _frames_of(rd)
            shape = _shape_key(rd)
            i = r["_i"]
            new = shape not in seen
            if _finite(i) and int(i) == WARMUP_INDEX:
                role, short, new = ROLE_WARMUP, "warmup", False
            elif _finite(i) and int(i) == 0:
                role, short = ROLE_COLD, "cold"
            elif new:
                role, short = ROLE_NEW_SHAPE, "new shape"
            else:
                n_warm[shape] = n_warm.get(shape, 0) + 1
                role, short = ROLE_WARM, f"warm #{n_warm[shape]}"
            seen.add(shape)
            fr = f" · {frames} frames" if frames is not None else ""
            label = f"{role if role != ROLE_WARM else short}{fr}"
            if role == ROLE_COLD and new:
                label += " (new shape)"
            out.append(
                {
                    "launch": lk,
                    "request_id": rd.get("request_id"),
                    "index": rd.get("index"),
                    "frames": frames,
                    "shape": shape,
                    "role": role,
                    "new_shape": bool(new),
                    "label": label,
                    "short": short,
                }
            )
    df = pd.DataFrame(out, columns=cols)
    df["frames"] = df["frames"].astype("Int64")
    return df


def launch_names(launches: pd.DataFrame | None) -> dict[Any, str]:
    """A readable name per launch label, for legends and titles.

    With memory caps in the table: ``"12 GiB GPU + 32 GiB host"``, ``"8 GiB host"``,
    ``"unlimited"`` (a launch without caps beside capped ones); else, when the launches differ
    in startup warmup frames: ``"warmup 17 frames"``; else the launch label itself.
    """
    if launches is None or launches.empty or "launch" not in launches.columns:
        return {}

    def num(v: Any) -> float | None:
        return float(v) if _finite(v) else None

    rows = [r for _, r in launches.iterrows()]
    capped = any(num(r.get("device_cap_gib")) or num(r.get("host_cap_gib")) for r in rows)
    wf = {num(r.get("warmup_frames")) for r in rows}
    out: dict[Any, str] = {}
    for r in rows:
        lk = r.get("launch")
        if capped:
            parts = []
            if num(r.get("device_cap_gib")):
                parts.append(f"{num(r.get('device_cap_gib')):g} GiB GPU")
            if num(r.get("host_cap_gib")):
                parts.append(f"{num(r.get('host_cap_gib')):g} GiB host")
            out[lk] = " + ".join(parts) or "unlimited"
        elif len(wf) > 1 and num(r.get("warmup_frames")) is not None:
            out[lk] = f"warmup {num(r.get('warmup_frames')):g} frames"
        else:
            out[lk] = str(lk)
    return out


def _unbundle(obj: Any) -> tuple[Any, dict[str, Any]]:
    """(first argument, tables and meta) of a ResultBundle passed where a table is expected."""
    if hasattr(obj, "tables") and hasattr(obj, "requests") and not isinstance(obj, pd.DataFrame):
        return obj, {
            "requests": obj.requests,
            "stages": obj.stages,
            "steps": obj.steps,
            "memory": obj.memory,
            "launches": obj.launches,
            "meta": dict(getattr(obj, "meta", {}) or {}),
        }
    return obj, {}


def _ms_text(v: float) -> str:
    """``"827 ms"``, ``"57.4 s"``, ``"2.31 ms"``."""
    if not _finite(v):
        return "–"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v / 1000:,.1f} s"
    if abs(v) >= 10:
        return f"{v:.0f} ms"
    return f"{v:.2g} ms" if abs(v) >= 0.01 else "0 ms"


def _use_log(values: Iterable[float], spread: float = 30.0) -> bool:
    """A log axis when the positive values span more than ``spread`` x."""
    v = np.asarray([float(x) for x in values if _finite(x) and float(x) > 0])
    return bool(v.size >= 2 and v.max() / v.min() > spread)


def _drop_warmup(df: pd.DataFrame, include_warmup: bool) -> pd.DataFrame:
    """Rows that are not the startup warmup (``index == WARMUP_INDEX``), unless asked to keep
    them."""
    if include_warmup or df.empty or "index" not in df.columns:
        return df
    keep = pd.Series(pd.to_numeric(df["index"], errors="coerce") != WARMUP_INDEX, index=df.index)
    return df[keep.fillna(True).to_numpy(bool)]


def _ordered_stages(names: Iterable[str]) -> list[str]:
    return _stages.order_stages(names)


def _launches(df: pd.DataFrame) -> list[Any]:
    if "launch" not in df.columns or df.empty:
        return [None]
    return list(dict.fromkeys(df["launch"].tolist()))


def _of_launch(df: pd.DataFrame, launch: Any) -> pd.DataFrame:
    if launch is None or "launch" not in df.columns:
        return df
    return df[df["launch"] == launch]


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _empty_note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def figure_to_png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG and return the bytes (for embedding in an HTML report)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def alt_text(fig: Figure) -> str:
    """A one-sentence description of ``fig`` for an ``img`` alt attribute: its title, then
    each titled or labelled axis (``"y label vs x label"``). Never empty."""
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


def _ms_axis(ax: Any, axis: str = "y") -> None:
    """Log-scale an axis in ms with readable tick labels (``10 ms``, ``1 s``, ``60 s``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    a = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a.set_major_locator(LogLocator(base=10))
    a.set_major_formatter(FuncFormatter(lambda v, _pos: _ms_text(v).replace(".0 s", " s")))


def _integer_xticks(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# --------------------------------------------------------------------------- stage breakdown


def _stage_pivot(stages: pd.DataFrame) -> pd.DataFrame:
    """(launch, request_id, index) x stage -> ms summed, in launch and index order."""
    df = stages
    if "launch" not in df.columns:
        df = df.assign(launch=None)
    df = df.assign(ms=pd.to_numeric(df["ms"], errors="coerce"))
    df = df[df["ms"].notna()]
    if df.empty:
        return pd.DataFrame()
    if "request_id" not in df.columns:
        df = df.assign(request_id=df["index"].astype(str))
    keys = ["launch", "request_id", "index"]
    pv = df.groupby([*keys, "stage"], sort=False, dropna=False)["ms"].sum().unstack("stage")
    return pv[_ordered_stages(pv.columns)]


def stage_breakdown(
    stages: Any,
    *,
    requests: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
    include_warmup: bool = False,
    launch: Any = None,
    title: str | None = None,
) -> Figure:
    """Per-stage latency (ms): for each stage, the cold request beside the warm median.

    One panel per launch (its name from :func:`launch_names`). In a panel the x axis holds the
    stages in sglang's pipeline order; at each stage, per request shape, one bar for the first
    request of that shape (the cold request, or the first of a new shape; red/orange) and one
    for the median of its warm requests (blue, with a min–max whisker). Each bar is labelled
    with its value; the y axis is logarithmic when the bars span more than 30x (a 60 s cold
    denoise beside 20 ms warm stages stays readable). Repeated rows of one stage in one request
    are summed.

    Args:
        stages: the bundle's stages table (launch, request_id, index, stage, ms, ...), or a
            :class:`~perfkit.bundle.ResultBundle` (its requests and launches are used too).
        requests: the requests table, for shapes and roles (:func:`request_roles`); without it
            index 0 is the cold request and the rest are warm.
        launches: the launches table, for launch names.
        include_warmup: also draw the startup warmup request (grey).
        launch: only this launch (default: all).
        title: figure title (default names the figure in the field's terms).

    Returns:
        Figure with one axis per launch; each bar container is one series (its label says
        the role and shape, e.g. ``"cold · 25 frames"``, ``"warm median · 25 frames (n=4)"``)
        with one bar per stage.
    """
    obj, b = _unbundle(stages)
    stages = b.get("stages", obj)
    requests = requests if requests is not None else b.get("requests")
    launches = launches if launches is not None else b.get("launches")
    df = stages if stages is not None else pd.DataFrame()
    if launch is not None:
        df = _of_launch(df, launch)
    pv = _stage_pivot(df) if not df.empty and {"stage", "ms", "index"} <= set(df.columns) else pd.DataFrame()
    names = launch_names(launches)
    if requests is not None and not requests.empty:
        roles = request_roles(_of_launch(requests, launch) if launch is not None else requests, launches)
    else:
        roles = pd.DataFrame()
    launch_keys = list(dict.fromkeys(pv.index.get_level_values(0))) if not pv.empty else []
    n_panels = max(1, len(launch_keys))
    stage_cols = list(pv.columns) if not pv.empty else []
    fig = _new_figure(max(8.0, 2.2 + 1.9 * max(1, len(stage_cols))), 1.2 + 3.4 * n_panels)
    if pv.empty:
        ax = fig.add_subplot()
        _empty_note(ax, "no stage records")
        ax.set_ylabel("stage latency (ms)")
        ax.set_xlabel("pipeline stage")
        ax.set_title(title or "Per-stage latency: cold request vs warm median")
        return fig
    role_of: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    for _, r in roles.iterrows():
        role_of[(r["launch"], r["request_id"])] = r.to_dict()
    all_vals = pv.to_numpy(dtype=float).ravel()
    log = _use_log(all_vals)
    first_ax = None
    for p, lk in enumerate(launch_keys):
        ax = fig.add_subplot(n_panels, 1, p + 1, sharey=first_ax)
        first_ax = first_ax or ax
        sub = pv.xs(lk, level=0, drop_level=False) if lk is not None or len(launch_keys) == 1 else pv
        # series: (shape, kind) -> rows
        series: dict[tuple[str, str], list[tuple[str, np.ndarray, Mapping[str, Any]]]] = {}
        for key, vals in sub.iterrows():
            _, rid, idx = key
            info = role_of.get((lk, rid)) or {
                "role": ROLE_WARMUP
                if _finite(idx) and int(idx) == WARMUP_INDEX
                else (ROLE_COLD if _finite(idx) and int(idx) == 0 else ROLE_WARM),
                "frames": None,
                "shape": "",
            }
            if info["role"] == ROLE_WARMUP and not include_warmup:
                continue
            kind = "warm" if info["role"] == ROLE_WARM else info["role"]
            series.setdefault((str(info.get("shape") or ""), kind), []).append(
                (rid, vals.to_numpy(dtype=float), info)
            )
        order = {ROLE_WARMUP: 0, ROLE_COLD: 1, ROLE_NEW_SHAPE: 1, "warm": 2}
        shapes = list(dict.fromkeys(s for s, _ in series))
        keys = sorted(series, key=lambda sk: (shapes.index(sk[0]), order.get(sk[1], 3)))
        n_series = max(1, len(keys))
        width = min(0.8 / n_series, 0.35)
        x = np.arange(len(stage_cols))
        for j, sk in enumerate(keys):
            shape, kind = sk
            items = series[sk]
            frames = items[0][2].get("frames")
            fr = f" · {frames} frames" if frames is not None and not pd.isna(frames) else ""
            shade = shapes.index(shape) % 2
            arr = np.vstack([v for _, v, _ in items])
            if kind == "warm":
                med = np.nanmedian(arr, axis=0)
                lo, hi = np.nanmin(arr, axis=0), np.nanmax(arr, axis=0)
                yerr = np.vstack([med - lo, hi - med]) if len(items) > 1 else None
                color = ("tab:blue", "#6baed6")[shade]
                label = f"warm median{fr} (n={len(items)})"
                vals = med
            else:
                vals = arr[0]
                yerr = None
                color = {
                    ROLE_WARMUP: ("tab:gray", "#c7c7c7"),
                    ROLE_COLD: (COLD_COLOR, "#fc9272"),
                    ROLE_NEW_SHAPE: ("tab:orange", "#fdae6b"),
                }.get(kind, ("tab:gray", "#c7c7c7"))[shade]
                label = items[0][2].get("label") or kind
                if len(items) > 1:
                    label += f" (+{len(items) - 1} more)"
            off = (j - (n_series - 1) / 2) * width
            plot_vals = np.where(np.isfinite(vals) & (vals > 0), vals, np.nan) if log else np.nan_to_num(vals)
            ax.bar(
                x + off,
                plot_vals,
                width,
                color=color,
                label=label,
                yerr=yerr,
                ecolor="black",
                capsize=2 if yerr is not None else 0,
                error_kw={"lw": 0.8},
            )
            tops = vals if yerr is None else np.fmax(vals, hi)
            for xi, v, top in zip(x + off, vals, tops):
                if _finite(v) and (not log or v > 0):
                    ax.annotate(
                        _ms_text(v),
                        (xi, top),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        fontsize=7 if n_series > 3 else 8,
                        rotation=90 if n_series > 3 else 0,
                    )
        ax.set_xticks(x, stage_cols, rotation=15 if len(stage_cols) > 5 else 0)
        if log:
            _ms_axis(ax)
            ax.set_ylabel("stage latency (ms, s; log scale)")
        else:
            ax.set_ylabel("stage latency (ms)")
            ax.set_ylim(bottom=0)
        ax.margins(y=0.25)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        name = names.get(lk, str(lk)) if lk is not None else ""
        if n_panels > 1:
            ax.set_title(f"launch: {name}", fontsize="medium")
        if p == n_panels - 1:
            ax.set_xlabel("pipeline stage")
    fig.suptitle(title or "Per-stage latency: cold request vs warm median (per request shape)")
    return fig


def _stage_colors(stage_cols: list[str]) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- e2e per request

_ROLE_MARKERS = {
    ROLE_COLD: ("*", COLD_COLOR, 170),
    ROLE_NEW_SHAPE: ("D", "tab:orange", 60),
    ROLE_WARMUP: ("s", "tab:gray", 40),
}


def e2e_per_request(
    requests: Any,
    *,
    metric: str = "e2e_ms",
    include_warmup: bool = False,
    launches: pd.DataFrame | None = None,
    title: str | None = None,
) -> Figure:
    """End-to-end latency (ms) per request, one line per launch; the cold request and each
    first request of a new shape marked and labelled with their role and frames.

    The x axis is the request index (integer ticks, 0 = the cold request); the y axis is
    logarithmic when the requests span more than 30x. Launches are named by
    :func:`launch_names`.

    Args:
        requests: the bundle's requests table (launch, index, e2e_ms, client_ms, num_frames,
            ...), or a :class:`~perfkit.bundle.ResultBundle`.
        metric: column to draw (``e2e_ms`` server side, or ``client_ms`` as seen by the client).
        include_warmup: also draw startup warmup rows (``WARMUP_INDEX``).
        launches: the launches table, for launch names.
        title: figure title.

    Returns:
        Figure with one axis: one line per launch (``ax.lines``) plus one marker collection per
        launch and role drawn (cold, first of a new shape, startup warmup).
    """
    obj, b = _unbundle(requests)
    requests = b.get("requests", obj)
    launches = launches if launches is not None else b.get("launches")
    names = launch_names(launches)
    df = _drop_warmup(requests, include_warmup) if requests is not None else pd.DataFrame()
    fig = _new_figure(8.5, 4.6)
    ax = fig.add_subplot()
    drew = False
    if not df.empty and metric in df.columns and "index" in df.columns:
        roles = request_roles(requests, launches)
        df = df.assign(
            _v=pd.to_numeric(df[metric], errors="coerce"), _i=pd.to_numeric(df["index"], errors="coerce")
        )
        if "request_id" in df.columns and not roles.empty:
            df = df.merge(roles[["request_id", "role", "label", "short"]], on="request_id", how="left")
        else:
            df = df.assign(role=None, label=None, short=None)
        df = df[df["_v"].notna() & df["_i"].notna()]
        log = _use_log(df["_v"])
        labelled: set[str] = set()
        launch_list = _launches(df)
        for lk in launch_list:
            sub = _of_launch(df, lk).sort_values("_i")
            if sub.empty:
                continue
            name = names.get(lk, str(lk)) if len(launch_list) > 1 else "requests of one launch"
            (line,) = ax.plot(sub["_i"], sub["_v"], marker="o", ms=4, label=name)
            for role, (mk, color, size) in _ROLE_MARKERS.items():
                pts = sub[sub["role"] == role] if "role" in sub else sub.iloc[0:0]
                if role == ROLE_COLD and pts.empty and "role" in sub and sub["role"].isna().all():
                    pts = sub[sub["_i"] == 0]
                if pts.empty:
                    continue
                ax.scatter(
                    pts["_i"],
                    pts["_v"],
                    s=size,
                    marker=mk,
                    color=color,
                    zorder=5,
                    label=None if role in labelled else (role if role != ROLE_COLD else "cold request"),
                )
                labelled.add(role)
                for _, r in pts.iterrows():
                    text = r.get("label") if isinstance(r.get("label"), str) else role
                    ax.annotate(
                        f"{text}\n{_ms_text(r['_v'])}",
                        (r["_i"], r["_v"]),
                        xytext=(6, -4),
                        textcoords="offset points",
                        fontsize=7,
                        color=line.get_color(),
                    )
            drew = True
        if drew:
            _integer_xticks(ax)
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
            if log:
                _ms_axis(ax)
            else:
                ax.set_ylim(bottom=0)
            ax.margins(x=0.08, y=0.15)
    if not drew:
        _empty_note(ax, f"no {metric} values")
    ax.set_xlabel("request index (0 = cold request, the first after ready)")
    what = "end-to-end" if metric == "e2e_ms" else "client-side"
    ax.set_ylabel(f"{what} latency ({'ms, s; log scale' if ax.get_yscale() == 'log' else 'ms'})")
    ax.set_title(title or "End-to-end latency per request")
    return fig


# --------------------------------------------------------------------------- step times


def step_times(
    steps: Any,
    *,
    stage: str | None = "DenoisingStage",
    include_warmup: bool = False,
    requests: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
    title: str | None = None,
) -> Figure:
    """Denoising step time (ms) vs step index, one line per request.

    The cold request is red and each first request of a new shape orange (both named in the
    legend with their shape: ``"cold · 25 frames"``); warm requests are thin blue lines under
    one legend entry. Step ticks are integers; the y axis is logarithmic when the steps span
    more than 30x (one 57 s compile step beside 27 ms steps).

    Args:
        steps: the bundle's steps table (launch, request_id, index, stage, step, ms), or a
            :class:`~perfkit.bundle.ResultBundle`.
        stage: only steps of this stage (default ``DenoisingStage``); when the table has no
            row of it (or no ``stage`` column) all rows are used; ``None`` uses all rows.
        include_warmup: also draw startup warmup requests.
        requests: the requests table, for roles and shapes (:func:`request_roles`).
        launches: the launches table, for launch names.
        title: figure title.

    Returns:
        Figure with one axis and one line per (launch, request) in ``ax.lines``; a line's label
        is its role and shape (warm lines after the first are unlabelled: ``_child``).
    """
    obj, b = _unbundle(steps)
    steps = b.get("steps", obj)
    requests = requests if requests is not None else b.get("requests")
    launches = launches if launches is not None else b.get("launches")
    names = launch_names(launches)
    df = _drop_warmup(steps, include_warmup) if steps is not None else pd.DataFrame()
    if stage is not None and "stage" in df.columns and (df["stage"] == stage).any():
        df = df[df["stage"] == stage]
    fig = _new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    launch_keys = _launches(df)
    multi = len(launch_keys) > 1
    roles = request_roles(requests, launches) if requests is not None else pd.DataFrame()
    role_of = {(r["launch"], r["request_id"]): r for _, r in roles.iterrows()}
    n_lines = 0
    if not df.empty and {"step", "ms"} <= set(df.columns):
        df = df.assign(ms=pd.to_numeric(df["ms"], errors="coerce"), step=pd.to_numeric(df["step"]))
        group_keys = [k for k in ("launch", "request_id") if k in df.columns] or ["index"]
        groups = list(df.groupby(group_keys, sort=False))
        groups.sort(
            key=lambda kv: (
                launch_keys.index(kv[1]["launch"].iloc[0]) if "launch" in kv[1] else 0,
                float(pd.to_numeric(kv[1]["index"], errors="coerce").min()) if "index" in kv[1] else 0.0,
            )
        )
        warm_labelled = False
        for _, g in groups:
            g = g.sort_values("step")
            idx = g["index"].iloc[0] if "index" in g else None
            lk = g["launch"].iloc[0] if "launch" in g else None
            info = role_of.get((lk, g["request_id"].iloc[0])) if "request_id" in g else None
            if info is not None:
                role, lab = info["role"], info["label"]
            else:
                lab = request_label(idx) if idx is not None else str(g[group_keys[0]].iloc[0])
                role = ROLE_COLD if lab == "cold" else (ROLE_WARMUP if lab == "warmup" else ROLE_WARM)
            if multi:
                lab = f"{names.get(lk, lk)}: {lab}"
            if role == ROLE_WARM:
                ax.plot(
                    g["step"],
                    g["ms"],
                    color="tab:blue",
                    lw=0.9,
                    alpha=0.45,
                    marker=".",
                    ms=3,
                    label="_child" if warm_labelled else "warm requests (one line each)",
                )
                warm_labelled = True
            else:
                color = {ROLE_COLD: COLD_COLOR, ROLE_NEW_SHAPE: "tab:orange"}.get(role, "tab:gray")
                ls = ("-", "--", ":", "-.")[launch_keys.index(lk) % 4 if lk in launch_keys else 0]
                ax.plot(g["step"], g["ms"], color=color, ls=ls, lw=2, marker="o", ms=4, label=lab, zorder=4)
            n_lines += 1
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        _integer_xticks(ax)
        if _use_log(df["ms"]):
            _ms_axis(ax)
        else:
            ax.set_ylim(bottom=0)
    if n_lines == 0:
        _empty_note(ax, "no step records")
    ax.set_xlabel("denoising step index")
    ax.set_ylabel(f"step time ({'ms, s; log scale' if ax.get_yscale() == 'log' else 'ms'})")
    ax.set_title(title or f"Per-step time{f' ({stage})' if stage else ''}: cold vs warm requests")
    return fig


# --------------------------------------------------------------------------- coverage


def coverage_heatmap(coverage: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Heatmap of the first-request penalty (ms) by startup warmup frames x request frames.

    Each cell is annotated with the penalty in ms, the ratio (when finite) and whether the
    request shape is ``covered`` (same latent shape as the startup warmup) or ``not covered``.
    Repeated (warmup_frames, request_frames) rows are reduced with the median penalty.

    Args:
        coverage: columns warmup_frames, request_frames, covered (bool), penalty_ms (ms),
            ratio (unitless, e.g. cold/warm).
        title: figure title.

    Returns:
        Figure: heatmap axis plus a colour bar labelled in ms; one text per non-empty cell.
    """
    df = coverage.copy()
    fig = _new_figure(7.0, 4.5)
    ax = fig.add_subplot()
    ax.set_xlabel("request num_frames")
    ax.set_ylabel("startup warmup num_frames")
    ax.set_title(title or "First-request penalty by warmup shape and request shape")
    if df.empty or not {"warmup_frames", "request_frames", "penalty_ms"} <= set(df.columns):
        _empty_note(ax, "no coverage results")
        return fig
    df["penalty_ms"] = pd.to_numeric(df["penalty_ms"], errors="coerce")
    if "ratio" not in df.columns:
        df["ratio"] = np.nan
    if "covered" not in df.columns:
        df["covered"] = np.nan
    agg = df.groupby(["warmup_frames", "request_frames"], sort=True).agg(
        penalty_ms=("penalty_ms", "median"),
        ratio=("ratio", lambda s: pd.to_numeric(s, errors="coerce").median()),
        covered=("covered", lambda s: s.dropna().iloc[0] if s.notna().any() else None),
    )
    rows = sorted(agg.index.get_level_values(0).unique())
    cols = sorted(agg.index.get_level_values(1).unique())
    grid = np.full((len(rows), len(cols)), np.nan)
    for (wf, rf), rec in agg.iterrows():
        grid[rows.index(wf), cols.index(rf)] = rec["penalty_ms"]
    masked = np.ma.masked_invalid(grid)
    import matplotlib

    cmap = matplotlib.colormaps["Reds"].with_extremes(bad="#eeeeee")
    finite = grid[np.isfinite(grid)]
    vmin = min(0.0, float(finite.min())) if finite.size else 0.0
    vmax = float(finite.max()) if finite.size else 1.0
    im = ax.imshow(
        masked, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1.0, origin="lower"
    )
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("first-request penalty (ms)")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    thresh = vmin + 0.6 * (vmax - vmin)
    for (wf, rf), rec in agg.iterrows():
        i, j = rows.index(wf), cols.index(rf)
        pen = rec["penalty_ms"]
        cov = rec["covered"]
        cov_s = "?" if cov is None else ("covered" if bool(cov) else "not covered")
        lines = [f"{pen:,.0f} ms" if _finite(pen) else "n/a"]
        if _finite(rec["ratio"]):
            lines.append(f"x{float(rec['ratio']):.2f}")
        lines.append(cov_s)
        dark = _finite(pen) and pen > thresh
        ax.text(
            j,
            i,
            "\n".join(lines),
            ha="center",
            va="center",
            fontsize="small",
            color="white" if dark else "black",
            fontweight="normal" if cov_s == "covered" else "bold",
        )
    return fig


# --------------------------------------------------------------------------- memory timeline


def _launch_phases(launch_row: Mapping[str, Any] | None, req: pd.DataFrame | None) -> dict[str, float]:
    """Epoch seconds of a launch's phases: ``start``, ``loaded`` (models loaded), ``ready``;
    whichever can be placed from the launch's cold-start parts and its startup warmup request
    (its end is ready) or, without one, the first request (ready just before it)."""
    lr = dict(launch_row or {})
    ready_s = lr.get("ready_s")
    t_ready = None
    if req is not None and not req.empty and {"t_start_s", "t_end_s", "index"} <= set(req.columns):
        idx = pd.to_numeric(req["index"], errors="coerce")
        wu = req[idx == WARMUP_INDEX]
        if not wu.empty and _finite(wu["t_end_s"].iloc[0]):
            t_ready = float(wu["t_end_s"].iloc[0])
        else:
            ts = pd.to_numeric(req["t_start_s"], errors="coerce")
            if ts.notna().any():
                t_ready = float(ts.min())
    if t_ready is None or not _finite(ready_s):
        return {"ready": t_ready} if t_ready is not None else {}
    start = t_ready - float(ready_s)
    out = {"start": start, "ready": t_ready}
    if _finite(lr.get("models_loaded_s")):
        out["loaded"] = start + float(lr["models_loaded_s"])
    if _finite(lr.get("process_start_s")):
        out["process"] = start + float(lr["process_start_s"])
    return out


def memory_timeline(
    memory: Any,
    requests: pd.DataFrame | None = None,
    stages: pd.DataFrame | None = None,
    caps: Mapping[str, Any] | None = None,
    *,
    launch: Any = None,
    launches: pd.DataFrame | None = None,
    device_name: str | None = None,
    include_warmup: bool = True,
    stage_marks: bool | None = None,
    title: str | None = None,
) -> Figure:
    """Device and host memory (MiB) over time since the engine's launch, with what happened.

    Panels: device used MiB (top, only when ``device_used_mib`` has a finite value; a CPU host
    draws the host panel only) and host memory of the engine's process tree (PSS, cgroup
    memory.current, RSS, anonymous). On every panel the launch's phases are shaded and
    labelled (model load, startup warmup: placed from the launches table's cold-start parts,
    so they show even where the sampler had not started yet), each request span is shaded and
    labelled with its role (:func:`request_roles`: cold red, first of a new shape orange, warm
    blue), compile events are marked (a triangle at the top of a request that compiled, with
    the compile time), and the device panel draws the load and warmup peaks the engine
    recorded. Caps draw dashed horizontal lines (``device_cap_gib`` on the device panel,
    ``host_cap_gib`` on the host panel, converted to MiB x1024; None/NaN skipped). Stage starts
    are dotted lines when ``stage_marks`` (default: when at most 4 requests are drawn).

    Artists carry gids for inspection: ``"cap:device"``, ``"cap:host"``, ``"request-span"``,
    ``"phase-span"``, ``"compile-mark"``, ``"stage-mark"``, ``"peak:load"``, ``"peak:warmup"``.

    Args:
        memory: the bundle's memory table (launch, t_s epoch s, device_used_mib, host_*_mib),
            or a :class:`~perfkit.bundle.ResultBundle` (requests, stages, launches and the GPU
            name come with it).
        requests: requests table (t_start_s, t_end_s epoch s, index, compiles, compile_ms).
        stages: stages table (stage, t_start_s epoch s) for stage marks.
        caps: e.g. ``{"device_cap_gib": 12, "host_cap_gib": 32}``.
        launch: only this launch (applied to all tables that have a launch column).
        launches: the launches table (cold-start parts, peaks, names).
        device_name: the accelerator's name for the device panel (``"NVIDIA H200"``).
        include_warmup: shade the startup warmup phase and request too.
        stage_marks: draw stage starts (None: when at most 4 requests are drawn).
        title: figure title (default names the launch).

    Returns:
        Figure with one or two axes sharing the time axis (s since launch; since the first
        sample when the launch cannot be placed).
    """
    obj, b = _unbundle(memory)
    mem = b.get("memory", obj)
    requests = requests if requests is not None else b.get("requests")
    stages = stages if stages is not None else b.get("stages")
    launches = launches if launches is not None else b.get("launches")
    device_name = device_name or (b.get("meta") or {}).get("gpu_name")
    mem = mem if mem is not None else pd.DataFrame()
    names = launch_names(launches)  # before selecting one: "unlimited" beside capped ones
    if launch is not None:
        mem = _of_launch(mem, launch)
        requests = _of_launch(requests, launch) if requests is not None else None
        stages = _of_launch(stages, launch) if stages is not None else None
        launches = _of_launch(launches, launch) if launches is not None else None
    caps = dict(caps or {})

    def _col(name: str) -> pd.Series:
        return (
            pd.to_numeric(mem[name], errors="coerce")
            if name in mem.columns
            else pd.Series(np.nan, index=mem.index, dtype=float)
        )

    launch_rows = [r.to_dict() for _, r in launches.iterrows()] if launches is not None else []
    one_launch = launch_rows[0] if len(launch_rows) == 1 else None
    phases = _launch_phases(one_launch, requests) if one_launch is not None or not launch_rows else {}
    t = _col("t_s")
    t0_candidates = [phases["start"]] if "start" in phases else []
    if not t0_candidates and t.notna().any():
        t0_candidates = [float(t.min())]
    if not t0_candidates:  # no samples: fall back to the earliest request/stage time
        for df in (requests, stages):
            if df is not None and "t_start_s" in df.columns:
                ts = pd.to_numeric(df["t_start_s"], errors="coerce")
                if ts.notna().any():
                    t0_candidates.append(float(ts.min()))
    t0 = min(t0_candidates) if t0_candidates else 0.0
    from_launch = "start" in phases

    dev = _col("device_used_mib")
    has_device = bool(dev.notna().any())
    fig = _new_figure(10.0, 6.8 if has_device else 4.4)
    if has_device:
        ax_dev = fig.add_subplot(2, 1, 1)
        ax_host = fig.add_subplot(2, 1, 2, sharex=ax_dev)
        axes = [ax_dev, ax_host]
    else:
        ax_dev = None
        ax_host = fig.add_subplot()
        axes = [ax_host]

    mem_launches = _launches(mem) if not mem.empty else [None]
    multi = len(mem_launches) > 1

    def _series(ax: Any, col: str, label: str, **kw: Any) -> bool:
        drew = False
        for lk in mem_launches:
            sub = _of_launch(mem, lk)
            y = pd.to_numeric(sub[col], errors="coerce") if col in sub.columns else None
            if y is None or not y.notna().any():
                continue
            x = pd.to_numeric(sub["t_s"], errors="coerce") - t0
            order = np.argsort(x.to_numpy())
            lab = f"{label} ({names.get(lk, lk)})" if multi else label
            ax.plot(x.to_numpy()[order], y.to_numpy()[order], label=lab, **kw)
            drew = True
        return drew

    name = (
        names.get(launch, None)
        if launch is not None
        else (names.get(one_launch["launch"]) if one_launch else None)
    )
    if name is not None and len(names) == 1 and name == str(next(iter(names))):
        name = None  # one launch with only its label ("session"): nothing to tell apart
    default_title = "Memory timeline" + (f" · {name}" if name else "") + " (device and host, from launch)"
    if ax_dev is not None:
        _series(ax_dev, "device_used_mib", f"device used ({device_name})" if device_name else "device used")
        ax_dev.set_ylabel("device memory (MiB)")
        ax_dev.set_title(title or default_title)
        _cap_line(ax_dev, caps.get("device_cap_gib"), "device cap", "cap:device")
        if one_launch is not None:
            for key, lab, a, z in (
                ("load_peak_mib", "load peak", "process", "loaded"),
                ("warmup_peak_mib", "warmup peak", "loaded", "ready"),
            ):
                v = one_launch.get(key)
                if _finite(v) and a in phases and z in phases:
                    ax_dev.hlines(
                        float(v),
                        phases[a] - t0,
                        phases[z] - t0,
                        colors="black",
                        lw=2,
                        gid=f"peak:{key.split('_')[0]}",
                    )
                    ax_dev.annotate(
                        f"{lab} {float(v):,.0f} MiB",
                        ((phases[a] + phases[z]) / 2 - t0, float(v)),
                        xytext=(0, 3),
                        textcoords="offset points",
                        ha="center",
                        fontsize=7,
                    )
    host_drew = _series(ax_host, "host_pss_mib", "host PSS (process tree)")
    host_drew |= _series(ax_host, "cgroup_current_mib", "cgroup memory.current", ls="-.")
    host_drew |= _series(ax_host, "host_rss_mib", "host RSS", ls=":")
    host_drew |= _series(ax_host, "host_anon_mib", "host anonymous", ls="--")
    _cap_line(ax_host, caps.get("host_cap_gib"), "host cap", "cap:host")
    ax_host.set_ylabel("host memory (MiB)")
    ax_host.set_xlabel("time since launch (s)" if from_launch else "time since first sample (s)")
    if ax_dev is None:
        ax_host.set_title(title or default_title.replace("device and host", "host; no device samples"))
    if not host_drew and not has_device:
        _empty_note(ax_host, "no memory samples")

    handles: dict[str, Any] = {}
    # launch phases
    if include_warmup and from_launch:
        spans = [("model load", phases.get("process", phases["start"]), phases.get("loaded"), "#fee391")]
        spans.append(("startup warmup", phases.get("loaded"), phases.get("ready"), "#d9d9d9"))
        for lab, a, z, color in spans:
            if a is None or z is None or z <= a:
                continue
            for k, ax in enumerate(axes):
                ax.axvspan(a - t0, z - t0, color=color, alpha=0.5, lw=0, gid="phase-span")
                if k == len(axes) - 1:
                    ax.text(
                        (a + z) / 2 - t0,
                        0.03,
                        lab,
                        transform=ax.get_xaxis_transform(),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
            handles.setdefault(lab, Patch(color=color, alpha=0.5, label=lab))
        if t.notna().any() and float(t.min()) > phases["ready"] - 0.5:
            axes[-1].text(
                (phases["ready"] - t0) / 2,
                0.5,
                "no memory samples\nbefore ready",
                transform=axes[-1].get_xaxis_transform(),
                ha="center",
                va="center",
                fontsize=7,
                color="dimgray",
            )
    # request spans, labelled by role
    req = requests
    if req is not None and not req.empty and {"t_start_s", "t_end_s"} <= set(req.columns):
        roles = request_roles(req, launches)
        role_of = {r["request_id"]: r for _, r in roles.iterrows()} if "request_id" in req.columns else {}
        req = _drop_warmup(req, include_warmup)
        # the startup warmup request is the warmup phase when the phases are drawn (its
        # compile is still marked)
        n_req = len(_drop_warmup(req, not from_launch))
        t_end = pd.to_numeric(req["t_end_s"], errors="coerce")
        x_span = max(
            1e-9,
            float(np.nanmax([t_end.max() if t_end.notna().any() else t0, t.max() if t.notna().any() else t0]))
            - t0,
        )
        for _, r in req.iterrows():
            if not (_finite(r["t_start_s"]) and _finite(r["t_end_s"])):
                continue
            info = role_of.get(r.get("request_id"))
            role = (
                info["role"]
                if info is not None
                else (
                    {"cold": ROLE_COLD, "warmup": ROLE_WARMUP}.get(request_label(r.get("index")), ROLE_WARM)
                )
            )
            short = info["short"] if info is not None else request_label(r.get("index"))
            color = {ROLE_COLD: COLD_COLOR, ROLE_NEW_SHAPE: "tab:orange", ROLE_WARMUP: "tab:grey"}.get(
                role, "tab:blue"
            )
            a, z = float(r["t_start_s"]) - t0, float(r["t_end_s"]) - t0
            phase = role == ROLE_WARMUP and from_launch
            for ax in axes if not phase else []:
                ax.axvspan(a, z, color=color, alpha=0.15, gid="request-span", lw=0)
            if role != ROLE_WARMUP and (z - a) > 0.012 * x_span:
                axes[0].text(
                    (a + z) / 2,
                    0.9,
                    short,
                    transform=axes[0].get_xaxis_transform(),
                    ha="center",
                    va="top",
                    rotation=90,
                    fontsize=7,
                    color=color,
                )
            key = {ROLE_WARM: "warm requests", ROLE_WARMUP: "startup warmup request"}.get(role, role)
            if role == ROLE_COLD:
                key = "cold request"
            if not phase:
                handles.setdefault(key, Patch(color=color, alpha=0.3, label=key))
            # compile events
            nc = r.get("compiles")
            if _finite(nc) and float(nc) > 0:
                cms = r.get("compile_ms")
                for ax in axes:
                    ax.plot(
                        [a],
                        [1.0],
                        marker="v",
                        color="black",
                        ms=7,
                        transform=ax.get_xaxis_transform(),
                        clip_on=False,
                        gid="compile-mark",
                        zorder=6,
                    )
                axes[0].annotate(
                    f"compile {_ms_text(cms)}" if _finite(cms) else "compile",
                    (a, 1.0),
                    xycoords=axes[0].get_xaxis_transform(),
                    xytext=(4, -10),
                    textcoords="offset points",
                    fontsize=7,
                )
                handles.setdefault(
                    "compile",
                    Line2D([], [], marker="v", color="black", ls="", label="torch.compile ran (time)"),
                )
        if stage_marks is None:
            stage_marks = n_req <= 4
    # stage marks
    if (
        stage_marks
        and stages is not None
        and not stages.empty
        and {"stage", "t_start_s"} <= set(stages.columns)
    ):
        st = _drop_warmup(stages, include_warmup)
        st = st[pd.to_numeric(st["t_start_s"], errors="coerce").notna()]
        colors = _stage_colors(_ordered_stages(st["stage"]))
        for _, r in st.iterrows():
            c = colors[str(r["stage"])]
            for ax in axes:
                ax.axvline(float(r["t_start_s"]) - t0, color=c, ls=":", lw=0.8, gid="stage-mark")
            handles.setdefault(
                f"stage:{r['stage']}", Line2D([], [], color=c, ls=":", label=f"{r['stage']} start")
            )
    for i, ax in enumerate(axes):
        h, _ = ax.get_legend_handles_labels()
        extra = list(handles.values()) if i == 0 else []
        if h or extra:
            ax.legend(handles=h + extra, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if ax.has_data():
            ax.set_ylim(bottom=0)
        if from_launch:
            ax.set_xlim(left=0)
    return fig


def _cap_line(ax: Any, cap_gib: Any, label: str, gid: str) -> None:
    if cap_gib is None or not _finite(cap_gib):
        return
    mib = float(cap_gib) * 1024.0
    ax.axhline(
        mib, color="black", ls="--", lw=1.2, gid=gid, label=f"{label} {float(cap_gib):g} GiB ({mib:,.0f} MiB)"
    )


# --------------------------------------------------------------------------- baseline gate


def _metric_unit(metric: str) -> str:
    m = metric.lower()
    return "MiB" if any(k in m for k in ("vram", "_mb", "mib", "memory", "peak_alloc")) else "ms"


def baseline_vs_actual(verdicts: pd.DataFrame, *, xscale: str = "auto", title: str | None = None) -> Figure:
    """Actual vs expected per metric, with the tolerance band, coloured by verdict status.

    One horizontal bar per (case, metric) row: the bar is the actual value coloured by status
    (pass green, fail red, improved blue, new/other grey), the black tick is the expected
    value and the shaded band spans expected..bound (the allowed regression). Rows with a NaN
    expected value (nothing to compare) are skipped. Metrics are split by unit into a ms
    panel and a MiB panel (names containing ``vram``/``_mb``/``mib``/``memory`` are MiB).

    Args:
        verdicts: columns case, metric, expected, actual, bound, status.
        xscale: ``"linear"``, ``"log"`` or ``"auto"`` (log when a panel's values span more
            than 50x).
        title: figure title.

    Returns:
        Figure with one axis per unit present; on each, the first bar container holds the
        tolerance bands and the second the actual-value bars (one bar per row).
    """
    df = verdicts.copy() if verdicts is not None else pd.DataFrame()
    for c in ("expected", "actual", "bound"):
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df.columns else np.nan
    df = df[df["expected"].notna()] if not df.empty else df
    if df.empty:
        fig = _new_figure(7.0, 3.0)
        ax = fig.add_subplot()
        _empty_note(ax, "no metrics with an expected value")
        ax.set_xlabel("value (ms)")
        ax.set_title(title or "Baseline vs actual")
        return fig
    df["metric"] = df["metric"].astype(str)
    df["_unit"] = df["metric"].map(_metric_unit)
    units = [u for u in ("ms", "MiB") if (df["_unit"] == u).any()]
    multi_case = "case" in df.columns and df["case"].nunique() > 1
    counts = [int((df["_unit"] == u).sum()) for u in units]
    fig = _new_figure(9.0, max(3.0, 1.2 + 0.38 * sum(counts) + 0.8 * len(units)))
    gs = fig.add_gridspec(len(units), 1, height_ratios=[max(1, c) for c in counts])
    for k, unit in enumerate(units):
        ax = fig.add_subplot(gs[k, 0])
        sub = df[df["_unit"] == unit].reset_index(drop=True)
        y = np.arange(len(sub))[::-1]
        exp = sub["expected"].to_numpy(float)
        act = sub["actual"].to_numpy(float)
        bnd = sub["bound"].to_numpy(float)
        bnd = np.where(np.isfinite(bnd), bnd, exp)
        status = (
            sub["status"].astype(str).str.lower()
            if "status" in sub.columns
            else pd.Series("new", index=sub.index)
        )
        colors = [STATUS_COLORS.get(s, "tab:grey") for s in status]
        ax.barh(
            y,
            bnd - exp,
            left=exp,
            height=0.8,
            color="gold",
            alpha=0.35,
            label="tolerance band (expected..bound)",
        )
        ax.barh(y, np.nan_to_num(act, nan=0.0), height=0.4, color=colors)
        ax.scatter(exp, y, marker="|", s=300, color="black", zorder=5, label="expected")
        vals = np.concatenate([exp, act[np.isfinite(act)], bnd])
        pos = vals[vals > 0]
        log = xscale == "log" or (
            xscale == "auto"
            and pos.size
            and pos.min() > 0
            and pos.max() / pos.min() > 50
            and (vals > 0).all()
        )
        if log:
            ax.set_xscale("log")
        for yi, a, s in zip(y, act, status):
            if np.isfinite(a):
                ax.text(a, yi, f" {a:.4g} ({s})", va="center", fontsize="x-small")
        labels = [
            f"{c} · {m}" if multi_case else m for c, m in zip(sub.get("case", sub["metric"]), sub["metric"])
        ]
        ax.set_yticks(y, labels, fontsize="small")
        ax.set_xlabel(f"value ({unit})")
        present = list(dict.fromkeys(status))
        handles, _ = ax.get_legend_handles_labels()
        handles += [Patch(color=STATUS_COLORS.get(s, "tab:grey"), label=f"actual: {s}") for s in present]
        ax.legend(handles=handles, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if k == 0:
            case_s = "" if multi_case or "case" not in df.columns else f" ({df['case'].iloc[0]})"
            ax.set_title(title or f"Baseline vs actual{case_s}: bar = actual, | = expected, band = tolerance")
    return fig


# --------------------------------------------------------------------------- offload modes


def offload_memory_latency(modes: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Per offload mode: peak device memory reserved and host memory peak (MiB, left) and warm
    end-to-end latency (ms, right); modes that did not run are labelled with their status.

    Args:
        modes: one row per mode with ``mode``, ``status`` (``ran`` / ``not applicable`` /
            ``failed``), ``peak_reserved_mib``, ``host_pss_peak_mib``, ``warm_ms`` (the offload
            investigation's summary table).
        title: figure title.

    Returns:
        Figure with two axes: grouped bars (device reserved, host) per mode, and one bar of warm
        e2e per mode; a mode without a value gets its status written in place of the bar.
    """
    fig = _new_figure(10.0, 4.2)
    ax_mem, ax_lat = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if modes is None or modes.empty or "mode" not in modes.columns:
        _empty_note(ax_mem, "no offload modes")
        _empty_note(ax_lat, "no offload modes")
        return fig
    names = [str(m) for m in modes["mode"]]
    status = [str(s) for s in modes.get("status", pd.Series(["ran"] * len(modes)))]
    x = np.arange(len(names))

    def col(name: str) -> list[float]:
        if name not in modes.columns:
            return [math.nan] * len(modes)
        return [float(v) if _finite(v) else math.nan for v in pd.to_numeric(modes[name], errors="coerce")]

    dev, host, warm = col("peak_reserved_mib"), col("host_pss_peak_mib"), col("warm_ms")
    w = 0.38
    ax_mem.bar(x - w / 2, np.nan_to_num(dev), w, label="device peak reserved", color="tab:blue")
    ax_mem.bar(x + w / 2, np.nan_to_num(host), w, label="host PSS peak (engine tree)", color="tab:orange")
    ax_lat.bar(x, np.nan_to_num(warm), 0.6, color="tab:green", label="warm e2e")
    top_mem = max([v for v in dev + host if _finite(v)] or [1.0])
    top_lat = max([v for v in warm if _finite(v)] or [1.0])
    for i, st in enumerate(status):
        if st != "ran":
            ax_mem.text(
                i, top_mem * 0.05, st, rotation=90, ha="center", va="bottom", color="grey", fontsize=8
            )
            ax_lat.text(
                i, top_lat * 0.05, st, rotation=90, ha="center", va="bottom", color="grey", fontsize=8
            )
        elif not _finite(dev[i]):
            ax_mem.text(
                i - w / 2,
                top_mem * 0.05,
                "no device",
                rotation=90,
                ha="center",
                va="bottom",
                color="grey",
                fontsize=8,
            )
    for ax in (ax_mem, ax_lat):
        ax.set_xticks(x, names)
        ax.set_xlabel("offload mode")
        ax.set_ylim(bottom=0)
    ax_mem.set_ylabel("memory (MiB)")
    ax_mem.legend(fontsize="small")
    ax_mem.set_title("Device vs host memory per mode")
    ax_lat.set_ylabel("warm end-to-end latency (ms)")
    ax_lat.set_title("Warm e2e per mode")
    if title:
        fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------- A/B

#: colour per A/B decision in :func:`ab_forest`
AB_DECISION_COLORS = {
    "regression": "tab:red",
    "improvement": "tab:blue",
    "no change": "tab:green",
    "inconclusive": "tab:orange",
}


def ab_forest(table: pd.DataFrame, launch_means: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Forest plot of an A/B: per metric the ratio B/A (point) with its interval (line), each
    launch's median divided by A's geometric mean behind it (A grey above the line, B coloured
    below), the ±threshold band shaded, a line at 1. The x axis is the ratio in per cent change.

    Args:
        table: :attr:`perfkit.ab.decide.AbResult.table` (metric, ratio, low, high, threshold,
            decision, a). Metrics "not measured" are left out (named in the title's note).
        launch_means: :attr:`perfkit.ab.decide.AbResult.launch_means` (side, metric, value).
        title: figure title.

    Returns:
        Figure with one axis; one row per measured metric, top to bottom in table order.
    """
    df = table.copy() if table is not None else pd.DataFrame()
    if not df.empty:
        for c in ("ratio", "low", "high", "threshold", "a"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        skipped = df[df["decision"] == "not measured"]["metric"].tolist()
        df = df[df["decision"] != "not measured"].reset_index(drop=True)
    else:
        skipped = []
    fig = _new_figure(9.0, max(3.0, 1.4 + 0.42 * len(df)))
    ax = fig.add_subplot()
    title = title or "B/A per metric: interval on launch medians, dots = launches (grey A, coloured B)"
    if df.empty:
        _empty_note(ax, "no metric measured on both sides")
        ax.set_title(title)
        return fig
    y = np.arange(len(df))[::-1].astype(float)
    pct = lambda v: (np.asarray(v, dtype=float) - 1.0) * 100.0  # noqa: E731
    for yi, r in zip(y, df.to_dict("records")):
        thr = r["threshold"] if _finite(r["threshold"]) else 0.0
        ax.fill_between([-thr * 100, thr * 100], yi - 0.4, yi + 0.4, color="gold", alpha=0.3, lw=0)
        color = AB_DECISION_COLORS.get(r["decision"], "tab:grey")
        if _finite(r["low"]) and _finite(r["high"]):
            ax.plot(pct([r["low"], r["high"]]), [yi, yi], color=color, lw=2.5, solid_capstyle="butt")
        ax.scatter(pct([r["ratio"]]), [yi], color=color, s=40, zorder=5, edgecolor="black")
        lm = launch_means[launch_means["metric"] == r["metric"]] if not launch_means.empty else launch_means
        if _finite(r["a"]) and not lm.empty:
            for side, dy, c in (("A", 0.22, "grey"), ("B", -0.22, color)):
                v = pd.to_numeric(lm[lm["side"] == side]["value"], errors="coerce").to_numpy(float)
                ax.scatter(pct(v / r["a"]), np.full(v.size, yi + dy), s=10, color=c, alpha=0.7, zorder=4)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{m} ({d})" for m, d in zip(df["metric"], df["decision"])], fontsize="small")
    ax.set_xlabel("B vs A (% change; band = ±threshold)")
    handles = [Patch(color=AB_DECISION_COLORS[d], label=d) for d in AB_DECISION_COLORS]
    ax.legend(handles=handles, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    note = f"\nnot measured: {', '.join(skipped)}" if skipped else ""
    ax.set_title(title + note, fontsize="small")
    return fig


def step_timeline(
    events: pd.DataFrame, *, step: int | None = None, lanes: int = 8, title: str | None = None
) -> Figure:
    """One denoising step of a profiled request over time: its top-level ops as bars, one lane
    per op (the ``lanes`` ops with most time in the step; the rest in one lane "other ops").

    Args:
        events: :func:`perfkit.readings.traces.op_events` of one trace (``ts_us`` µs, ``dur_ms``).
        step: the denoising step (default: the first recorded one).
        lanes: ops drawn in lanes of their own.
        title: figure title.

    Returns:
        Figure with one axis: x is ms from the step's first op, y the ops (most time at the
        top); an empty note when the trace holds no step.
    """
    ev = (
        events[(events["cat"] != "kernel") & events["top"] & (events["step"] >= 0)]
        if not events.empty
        else events
    )
    fig = _new_figure(8.5, 3.8)
    ax = fig.add_subplot()
    if ev.empty:
        ax.set_title(title or "One denoising step: top-level ops over time")
        _empty_note(ax, "no denoising step in this trace")
        return fig
    step = int(ev["step"].min()) if step is None else step
    ev = ev[ev["step"] == step]
    ev = ev[ev["tid"] == ev.groupby("tid")["dur_ms"].sum().idxmax()]  # the thread doing the work
    t0 = float(ev["ts_us"].min())
    order = list(ev.groupby("op")["dur_ms"].sum().sort_values(ascending=False).index)
    shown = order[:lanes]
    names = shown + (["other ops"] if len(order) > lanes else [])
    colours = [f"C{i % 10}" for i in range(len(names))]
    for lane, name in enumerate(names):
        sel = ev[ev["op"] == name] if name != "other ops" else ev[~ev["op"].isin(shown)]
        bars = [((float(ts) - t0) / 1000.0, float(d)) for ts, d in zip(sel["ts_us"], sel["dur_ms"])]
        ax.broken_barh(bars, (len(names) - 1 - lane - 0.4, 0.8), color=colours[lane])
    ax.set_yticks(range(len(names)), list(reversed(names)), fontsize="small")
    ax.set_xlabel("time from the step's first op (ms)")
    ax.set_ylabel("op")
    ax.set_title(title or f"Denoising step {step}: top-level ops over time")
    return fig

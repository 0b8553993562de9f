"""The stage breakdown figure (:func:`stage_breakdown`, ms) and the warmup coverage heatmap of
first-request penalties (:func:`coverage_heatmap`)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from perfkit.bundle_schema import WARMUP_INDEX
from perfkit.report.plots.base import (
    ROLE_COLORS,
    Figure,
    empty_note,
    is_finite,
    launch_names,
    ms_text,
    ms_y,
    new_figure,
    of_launch,
    one_axis,
    ordered_stages,
    unbundle,
    use_log,
)
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP, request_roles

#: (stage values per request, role info) of one series: a (shape, kind) of one launch
_Items = list[tuple[Any, np.ndarray, Mapping[str, Any]]]

#: bar colour of a series of the second shape, by role (the first shape's: :data:`ROLE_COLORS`)
_LIGHT_COLORS = {
    ROLE_WARMUP: "#c7c7c7",
    ROLE_COLD: "#fc9272",
    ROLE_NEW_SHAPE: "#fdae6b",
    ROLE_WARM: "#6baed6",
}

#: series order within a shape
_KIND_ORDER = {ROLE_WARMUP: 0, ROLE_COLD: 1, ROLE_NEW_SHAPE: 1, "warm": 2}


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
    return pv[ordered_stages(pv.columns)]


def stage_breakdown(
    stages: Any,
    *,
    requests: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
    include_warmup: bool = False,
    launch: Any = None,
    title: str | None = None,
) -> Figure:
    """Per-stage latency (ms), the cold request beside the warm median, one axis per launch
    (``stages``: the table or a ResultBundle; without ``requests`` index 0 is cold; docs/suite.md)."""
    stages, b = unbundle(stages, "stages", requests=requests, launches=launches)
    requests, launches = b["requests"], b["launches"]
    df = of_launch(stages, launch) if stages is not None else pd.DataFrame()
    pv = _stage_pivot(df) if not df.empty and {"stage", "ms", "index"} <= set(df.columns) else pd.DataFrame()
    names = launch_names(launches)
    roles = request_roles(of_launch(requests, launch), launches)
    launch_keys = list(dict.fromkeys(pv.index.get_level_values(0))) if not pv.empty else []
    n_panels = max(1, len(launch_keys))
    stage_cols = list(pv.columns) if not pv.empty else []
    fig = new_figure(max(8.0, 2.2 + 1.9 * max(1, len(stage_cols))), 1.2 + 3.4 * n_panels)
    if pv.empty:
        ax = fig.add_subplot()
        empty_note(ax, "no stage records")
        ax.set_ylabel("stage latency (ms)")
        ax.set_xlabel("pipeline stage")
        ax.set_title(title or "Per-stage latency: cold request vs warm median")
        return fig
    role_of = {(r["launch"], r["request_id"]): r for r in roles.to_dict("records")}
    log = use_log(pv.to_numpy(dtype=float).ravel())
    first_ax = None
    for p, lk in enumerate(launch_keys):
        ax = fig.add_subplot(n_panels, 1, p + 1, sharey=first_ax)
        first_ax = first_ax or ax
        sub = pv.xs(lk, level=0, drop_level=False) if lk is not None or len(launch_keys) == 1 else pv
        _draw_series(ax, _panel_series(sub, lk, role_of, include_warmup), len(stage_cols), log)
        _label_panel(ax, stage_cols, log)
        name = names.get(lk, str(lk)) if lk is not None else ""
        if n_panels > 1:
            ax.set_title(f"launch: {name}", fontsize="medium")
        if p == n_panels - 1:
            ax.set_xlabel("pipeline stage")
    fig.suptitle(title or "Per-stage latency: cold request vs warm median (per request shape)")
    return fig


def _panel_series(
    sub: pd.DataFrame, lk: Any, role_of: Mapping[tuple[Any, Any], Mapping[str, Any]], include_warmup: bool
) -> dict[tuple[str, str], _Items]:
    """(shape, kind: ``warm`` or a first request's role) -> the requests of one launch's rows."""
    series: dict[tuple[str, str], _Items] = {}
    for key, vals in sub.iterrows():
        _, rid, idx = key
        info = role_of.get((lk, rid)) or {
            "role": ROLE_WARMUP
            if is_finite(idx) and int(idx) == WARMUP_INDEX
            else (ROLE_COLD if is_finite(idx) and int(idx) == 0 else ROLE_WARM),
            "frames": None,
            "shape": "",
        }
        if info["role"] == ROLE_WARMUP and not include_warmup:
            continue
        kind = "warm" if info["role"] == ROLE_WARM else info["role"]
        series.setdefault((str(info.get("shape") or ""), kind), []).append(
            (rid, vals.to_numpy(dtype=float), info)
        )
    return series


def _series_bars(kind: str, items: _Items, shade: int) -> tuple[np.ndarray, Any, Any, str, str]:
    """(values, yerr, whisker tops, colour, label): the warm median and min–max, or a first request."""
    frames = items[0][2].get("frames")
    fr = f" · {frames} frames" if frames is not None and not pd.isna(frames) else ""
    arr = np.vstack([v for _, v, _ in items])
    colors = (ROLE_COLORS, _LIGHT_COLORS)[shade]
    color = colors.get(kind, colors[ROLE_WARMUP])
    if kind == "warm":
        med = np.nanmedian(arr, axis=0)
        lo, hi = np.nanmin(arr, axis=0), np.nanmax(arr, axis=0)
        yerr = np.vstack([med - lo, hi - med]) if len(items) > 1 else None
        tops = med if yerr is None else np.fmax(med, hi)
        return med, yerr, tops, color, f"warm median{fr} (n={len(items)})"
    label = items[0][2].get("label") or kind
    if len(items) > 1:
        label += f" (+{len(items) - 1} more)"
    return arr[0], None, arr[0], color, label


def _draw_series(ax: Any, series: dict[tuple[str, str], _Items], n_stages: int, log: bool) -> None:
    shapes = list(dict.fromkeys(s for s, _ in series))
    keys = sorted(series, key=lambda sk: (shapes.index(sk[0]), _KIND_ORDER.get(sk[1], 3)))
    n_series = max(1, len(keys))
    width = min(0.8 / n_series, 0.35)
    x = np.arange(n_stages)
    for j, (shape, kind) in enumerate(keys):
        vals, yerr, tops, color, label = _series_bars(kind, series[(shape, kind)], shapes.index(shape) % 2)
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
        for xi, v, top in zip(x + off, vals, tops):
            if is_finite(v) and (not log or v > 0):
                ax.annotate(
                    ms_text(v),
                    (xi, top),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7 if n_series > 3 else 8,
                    rotation=90 if n_series > 3 else 0,
                )


def _label_panel(ax: Any, stage_cols: list[str], log: bool) -> None:
    ax.set_xticks(np.arange(len(stage_cols)), stage_cols, rotation=15 if len(stage_cols) > 5 else 0)
    ms_y(ax, "stage latency", log)
    ax.margins(y=0.25)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def coverage_heatmap(coverage: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Heatmap of the first-request penalty (ms, median of repeats) by startup warmup frames x
    request frames, one text per cell: penalty, ratio when finite, ``covered``/``not covered``."""
    df = coverage.copy()
    fig, ax = one_axis(7.0, 4.5)
    ax.set_xlabel("request num_frames")
    ax.set_ylabel("startup warmup num_frames")
    ax.set_title(title or "First-request penalty by warmup shape and request shape")
    if df.empty or not {"warmup_frames", "request_frames", "penalty_ms"} <= set(df.columns):
        empty_note(ax, "no coverage results")
        return fig
    df["penalty_ms"] = pd.to_numeric(df["penalty_ms"], errors="coerce")
    df = df.reindex(columns=[*df.columns, *({"ratio", "covered"} - set(df.columns))])  # NaN when absent
    agg = df.groupby(["warmup_frames", "request_frames"], sort=True).agg(
        penalty_ms=("penalty_ms", "median"),
        ratio=("ratio", lambda s: pd.to_numeric(s, errors="coerce").median()),
        covered=("covered", lambda s: s.dropna().iloc[0] if s.notna().any() else None),
    )
    wide = agg["penalty_ms"].unstack()  # warmup frames x request frames, both sorted
    rows, cols, grid = list(wide.index), list(wide.columns), wide.to_numpy(dtype=float)
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
        lines = [f"{pen:,.0f} ms" if is_finite(pen) else "n/a"]
        if is_finite(rec["ratio"]):
            lines.append(f"x{float(rec['ratio']):.2f}")
        lines.append(cov_s)
        dark = is_finite(pen) and pen > thresh
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

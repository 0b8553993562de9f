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
from matplotlib.patches import Patch

from perfkit.bundle import WARMUP_INDEX
from perfkit.readings import stages as _stages

__all__ = [
    "STAGE_ORDER",
    "STATUS_COLORS",
    "request_label",
    "stage_breakdown",
    "e2e_per_request",
    "step_times",
    "coverage_heatmap",
    "memory_timeline",
    "baseline_vs_actual",
    "offload_memory_latency",
    "ab_forest",
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
    warmup (``WARMUP_INDEX``, -1)."""
    try:
        i = int(index)
    except (TypeError, ValueError):
        return str(index)
    if i == 0:
        return "cold"
    if i == WARMUP_INDEX:
        return "warmup"
    return f"warm #{i}"


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
    return Figure(figsize=(width, height), layout="tight")


def figure_to_png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG and return the bytes (for embedding in an HTML report)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# --------------------------------------------------------------------------- stage breakdown


def stage_breakdown(
    stages: pd.DataFrame, *, include_warmup: bool = False, launch: Any = None, title: str | None = None
) -> Figure:
    """Stacked per-stage latency bars (ms), one bar per request.

    Bars are labelled ``cold`` (index 0) and ``warm #i`` (index i); with several launches in
    the table the label is prefixed by the launch. Startup warmup rows (``index ==
    WARMUP_INDEX``) are excluded unless ``include_warmup``. Stage segments are stacked in sglang's
    pipeline order (:data:`STAGE_ORDER`); repeated rows of one stage in one request are summed.

    Args:
        stages: the bundle's stages table (launch, request_id, index, stage, ms, ...).
        include_warmup: also draw startup warmup requests.
        launch: only this launch (default: all).
        title: figure title (default names the figure in the field's terms).

    Returns:
        Figure with one axis; one bar container per stage, each with one bar per request.
    """
    df = _drop_warmup(stages, include_warmup)
    if launch is not None:
        df = _of_launch(df, launch)
    if not df.empty and "ms" in df.columns:
        df = df[pd.to_numeric(df["ms"], errors="coerce").notna()]
    launches = _launches(df)
    multi = len(launches) > 1

    # one row per request, in launch order then request index order
    keys = [k for k in ("launch", "index", "request_id") if k in df.columns]
    if not df.empty and keys and "stage" in df.columns:
        lorder = {lk: i for i, lk in enumerate(launches)}
        df = df.assign(
            ms=pd.to_numeric(df["ms"], errors="coerce"),
            _lo=df["launch"].map(lorder) if "launch" in df.columns else 0,
            _io=pd.to_numeric(df["index"], errors="coerce") if "index" in df.columns else 0,
        )
        df = df.sort_values(["_lo", "_io"], kind="stable")
        order = list(dict.fromkeys(zip(*[df[k] for k in keys])))
        pivot = df.pivot_table(index=keys, columns="stage", values="ms", aggfunc="sum", sort=False)
        if len(keys) == 1:
            order = [o[0] for o in order]
        pivot = pivot.reindex(order)
        stage_cols = _ordered_stages(pivot.columns)
        pivot = pivot[stage_cols].fillna(0.0)
    else:
        pivot = pd.DataFrame()
        stage_cols = []

    n = len(pivot)
    fig = _new_figure(max(6.0, min(16.0, 2.0 + 0.8 * n)), 4.5)
    ax = fig.add_subplot()
    if n == 0:
        _empty_note(ax, "no stage records")
    else:
        labels = []
        for key in pivot.index:
            kd = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            lab = request_label(kd.get("index"))
            labels.append(f"{kd['launch']}\n{lab}" if multi else lab)
        x = np.arange(n)
        bottom = np.zeros(n)
        cmap = _stage_colors(stage_cols)
        for st in stage_cols:
            vals = pivot[st].to_numpy(dtype=float)
            ax.bar(x, vals, bottom=bottom, label=st, color=cmap[st], width=0.7)
            bottom += vals
        ax.set_xticks(x, labels)
        for tick, lab in zip(ax.get_xticklabels(), labels):
            if lab.endswith("cold"):
                tick.set_color(COLD_COLOR)
                tick.set_fontweight("bold")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("request (cold = first after ready, warm #i = later, same session)")
    ax.set_ylabel("stage latency (ms)")
    ax.set_title(title or "Per-stage latency: cold request vs warm requests")
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


def e2e_per_request(
    requests: pd.DataFrame, *, metric: str = "e2e_ms", include_warmup: bool = False, title: str | None = None
) -> Figure:
    """End-to-end latency (ms) per request index, one line per launch; cold request highlighted.

    Args:
        requests: the bundle's requests table (launch, index, e2e_ms, client_ms, ...).
        metric: column to draw (``e2e_ms`` server side, or ``client_ms`` as seen by the client).
        include_warmup: also draw startup warmup rows (``WARMUP_INDEX``).
        title: figure title.

    Returns:
        Figure with one axis: one line per launch (``ax.lines``) plus one highlighted cold
        marker per launch that has a cold request (a scatter collection).
    """
    df = _drop_warmup(requests, include_warmup)
    fig = _new_figure(7.5, 4.5)
    ax = fig.add_subplot()
    drew = False
    if not df.empty and metric in df.columns and "index" in df.columns:
        df = df.assign(
            _v=pd.to_numeric(df[metric], errors="coerce"), _i=pd.to_numeric(df["index"], errors="coerce")
        )
        df = df[df["_v"].notna() & df["_i"].notna()]
        launches = _launches(df)
        cold_labelled = False
        for lk in launches:
            sub = _of_launch(df, lk).sort_values("_i")
            if sub.empty:
                continue
            ax.plot(sub["_i"], sub["_v"], marker="o", label=str(lk) if lk is not None else metric)
            cold = sub[sub["_i"] == 0]
            if not cold.empty:
                ax.scatter(
                    cold["_i"],
                    cold["_v"],
                    s=140,
                    marker="*",
                    color=COLD_COLOR,
                    zorder=5,
                    label=None if cold_labelled else "cold request",
                )
                cold_labelled = True
            drew = True
        if drew:
            idx = sorted(df["_i"].unique().astype(int))
            ax.set_xticks(idx, [request_label(i) for i in idx])
            ax.legend(fontsize="small")
            ax.set_ylim(bottom=0)
    if not drew:
        _empty_note(ax, f"no {metric} values")
    ax.set_xlabel("request index (0 = cold request)")
    ax.set_ylabel(f"{'end-to-end' if metric == 'e2e_ms' else metric} latency (ms)")
    ax.set_title(title or "End-to-end latency per request (cold vs warm)")
    return fig


# --------------------------------------------------------------------------- step times


def step_times(
    steps: pd.DataFrame,
    *,
    stage: str | None = "DenoisingStage",
    include_warmup: bool = False,
    title: str | None = None,
) -> Figure:
    """Denoising step time (ms) vs step index, one line per request; the cold request in red.

    Args:
        steps: the bundle's steps table (launch, request_id, index, stage, step, ms).
        stage: only steps of this stage (default ``DenoisingStage``); when the table has no
            row of it (or no ``stage`` column) all rows are used; ``None`` uses all rows.
        include_warmup: also draw startup warmup requests.
        title: figure title.

    Returns:
        Figure with one axis and one line per (launch, request) in ``ax.lines``.
    """
    df = _drop_warmup(steps, include_warmup)
    if stage is not None and "stage" in df.columns and (df["stage"] == stage).any():
        df = df[df["stage"] == stage]
    fig = _new_figure(7.5, 4.5)
    ax = fig.add_subplot()
    launches = _launches(df)
    multi = len(launches) > 1
    n_lines = 0
    if not df.empty and {"step", "ms"} <= set(df.columns):
        group_keys = [k for k in ("launch", "request_id") if k in df.columns] or ["index"]
        groups = list(df.groupby(group_keys, sort=False))
        groups.sort(
            key=lambda kv: (
                launches.index(kv[1]["launch"].iloc[0]) if "launch" in kv[1] else 0,
                float(pd.to_numeric(kv[1]["index"], errors="coerce").min()) if "index" in kv[1] else 0.0,
            )
        )
        warm_n = sum(1 for _, g in groups if "index" not in g or int(g["index"].iloc[0]) != 0)
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        wi = 0
        for _, g in groups:
            g = g.sort_values("step")
            idx = g["index"].iloc[0] if "index" in g else None
            lab = request_label(idx) if idx is not None else str(g[group_keys[0]].iloc[0])
            if multi:
                lab = f"{g['launch'].iloc[0]}: {lab}"
            is_cold = idx is not None and _finite(idx) and int(idx) == 0
            if is_cold:
                ax.plot(g["step"], g["ms"], color=COLD_COLOR, lw=2.5, marker="o", label=lab, zorder=4)
            else:
                ax.plot(
                    g["step"],
                    g["ms"],
                    color=cmap(wi / max(1, warm_n - 1) * 0.85),
                    lw=1.2,
                    marker=".",
                    alpha=0.85,
                    label=lab,
                )
                wi += 1
            n_lines += 1
        ax.legend(fontsize="small", ncol=1 if n_lines <= 10 else 2)
        ax.set_ylim(bottom=0)
    if n_lines == 0:
        _empty_note(ax, "no step records")
    ax.set_xlabel("denoising step index")
    ax.set_ylabel("step time (ms)")
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
        lines = [f"{pen:.0f} ms" if _finite(pen) else "n/a"]
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


def memory_timeline(
    memory: pd.DataFrame,
    requests: pd.DataFrame | None = None,
    stages: pd.DataFrame | None = None,
    caps: Mapping[str, Any] | None = None,
    *,
    launch: Any = None,
    include_warmup: bool = True,
    title: str | None = None,
) -> Figure:
    """Device and host memory (MiB) over time (s since the first sample), with context.

    Panels: device used MiB (top, only when ``device_used_mib`` has a finite value; a CPU
    host draws the host panel only) and host RSS / anonymous MiB. On every panel, request
    spans (``t_start_s``..``t_end_s``) are shaded (cold request red, warm blue, startup warmup
    grey) and stage starts are marked with dotted vertical lines (one colour per stage).
    Caps draw horizontal dashed lines: ``device_cap_gib`` on the device panel,
    ``host_cap_gib`` on the host panel, converted to MiB (x1024). ``None``/NaN caps are skipped.

    Artists carry gids for inspection: ``"cap:device"``, ``"cap:host"``, ``"request-span"``,
    ``"stage-mark"``.

    Args:
        memory: the bundle's memory table (launch, t_s epoch s, device_used_mib, host_rss_mib,
            host_anon_mib, ...).
        requests: requests table (t_start_s, t_end_s epoch s, index) for spans, optional.
        stages: stages table (stage, t_start_s epoch s) for stage marks, optional.
        caps: e.g. ``{"device_cap_gib": 12, "host_cap_gib": 32}``.
        launch: only this launch (applied to all tables that have a launch column).
        include_warmup: shade startup warmup spans too (grey).
        title: figure title.

    Returns:
        Figure with one or two axes sharing the time axis.
    """
    mem = memory if memory is not None else pd.DataFrame()
    if launch is not None:
        mem = _of_launch(mem, launch)
        requests = _of_launch(requests, launch) if requests is not None else None
        stages = _of_launch(stages, launch) if stages is not None else None
    caps = dict(caps or {})

    def _col(name: str) -> pd.Series:
        return (
            pd.to_numeric(mem[name], errors="coerce")
            if name in mem.columns
            else pd.Series(np.nan, index=mem.index, dtype=float)
        )

    t = _col("t_s")
    t0_candidates = [float(t.min())] if t.notna().any() else []
    if not t0_candidates:  # no samples: fall back to the earliest request/stage time
        for df in (requests, stages):
            if df is not None and "t_start_s" in df.columns:
                ts = pd.to_numeric(df["t_start_s"], errors="coerce")
                if ts.notna().any():
                    t0_candidates.append(float(ts.min()))
    t0 = min(t0_candidates) if t0_candidates else 0.0

    dev = _col("device_used_mib")
    has_device = bool(dev.notna().any())
    fig = _new_figure(9.0, 6.5 if has_device else 4.2)
    if has_device:
        ax_dev = fig.add_subplot(2, 1, 1)
        ax_host = fig.add_subplot(2, 1, 2, sharex=ax_dev)
        axes = [ax_dev, ax_host]
    else:
        ax_dev = None
        ax_host = fig.add_subplot()
        axes = [ax_host]

    launches = _launches(mem) if not mem.empty else [None]
    multi = len(launches) > 1

    def _series(ax: Any, col: str, label: str, **kw: Any) -> bool:
        drew = False
        for lk in launches:
            sub = _of_launch(mem, lk)
            y = pd.to_numeric(sub[col], errors="coerce") if col in sub.columns else None
            if y is None or not y.notna().any():
                continue
            x = pd.to_numeric(sub["t_s"], errors="coerce") - t0
            order = np.argsort(x.to_numpy())
            ax.plot(
                x.to_numpy()[order], y.to_numpy()[order], label=f"{label} ({lk})" if multi else label, **kw
            )
            drew = True
        return drew

    if ax_dev is not None:
        _series(ax_dev, "device_used_mib", "device used")
        ax_dev.set_ylabel("device memory (MiB)")
        ax_dev.set_title(title or "Memory timeline: device and host (MiB) with request spans")
        _cap_line(ax_dev, caps.get("device_cap_gib"), "device cap", "cap:device")
    # PSS of the engine's process tree is what the host cap is judged on (shared pages counted
    # once); RSS summed over the tree counts them once per process, anon leaves pinned pages out
    host_drew = _series(ax_host, "host_pss_mib", "host PSS (tree)")
    host_drew |= _series(ax_host, "cgroup_current_mib", "cgroup memory.current", ls="-.")
    host_drew |= _series(ax_host, "host_rss_mib", "host RSS", ls=":")
    host_drew |= _series(ax_host, "host_anon_mib", "host anon", ls="--")
    _cap_line(ax_host, caps.get("host_cap_gib"), "host cap", "cap:host")
    ax_host.set_ylabel("host memory (MiB)")
    ax_host.set_xlabel("time since first sample (s)")
    if ax_dev is None:
        ax_host.set_title(title or "Memory timeline: host (MiB) with request spans (no device samples)")
    if not host_drew and not has_device:
        _empty_note(ax_host, "no memory samples")

    # request spans
    span_handles: dict[str, Any] = {}
    if requests is not None and not requests.empty and {"t_start_s", "t_end_s"} <= set(requests.columns):
        req = _drop_warmup(requests, include_warmup)
        for _, r in req.iterrows():
            if not (_finite(r["t_start_s"]) and _finite(r["t_end_s"])):
                continue
            kind = request_label(r.get("index")) if "index" in r else "request"
            color = {"cold": COLD_COLOR, "warmup": "tab:grey"}.get(kind, "tab:blue")
            key = kind if kind in ("cold", "warmup") else "warm"
            for ax in axes:
                ax.axvspan(
                    float(r["t_start_s"]) - t0,
                    float(r["t_end_s"]) - t0,
                    color=color,
                    alpha=0.12,
                    gid="request-span",
                    lw=0,
                )
            span_handles.setdefault(
                key,
                Patch(
                    color=color, alpha=0.25, label=f"{key} request" if key != "warmup" else "startup warmup"
                ),
            )
    # stage marks
    stage_handles: dict[str, Any] = {}
    if stages is not None and not stages.empty and {"stage", "t_start_s"} <= set(stages.columns):
        st = _drop_warmup(stages, include_warmup)
        st = st[pd.to_numeric(st["t_start_s"], errors="coerce").notna()]
        colors = _stage_colors(_ordered_stages(st["stage"]))
        for _, r in st.iterrows():
            c = colors[str(r["stage"])]
            for ax in axes:
                ax.axvline(float(r["t_start_s"]) - t0, color=c, ls=":", lw=1.0, gid="stage-mark")
            if str(r["stage"]) not in stage_handles:
                from matplotlib.lines import Line2D

                stage_handles[str(r["stage"])] = Line2D([], [], color=c, ls=":", label=str(r["stage"]))
    for ax in axes:
        h, _ = ax.get_legend_handles_labels()
        extra = list(span_handles.values()) + (list(stage_handles.values()) if ax is axes[0] else [])
        if h or extra:
            ax.legend(handles=h + extra, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if ax.has_data():
            ax.set_ylim(bottom=0)
    return fig


def _cap_line(ax: Any, cap_gib: Any, label: str, gid: str) -> None:
    if cap_gib is None or not _finite(cap_gib):
        return
    mib = float(cap_gib) * 1024.0
    ax.axhline(
        mib, color="black", ls="--", lw=1.2, gid=gid, label=f"{label} {float(cap_gib):g} GiB ({mib:.0f} MiB)"
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

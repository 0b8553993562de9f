"""The warmup coverage figure: first-request penalty (ms) by startup warmup frames x request frames
(:func:`coverage_heatmap`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfkit.report.plots.base import Figure, empty_note, is_finite, new_figure


def coverage_heatmap(coverage: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Heatmap of the first-request penalty (ms) by startup warmup frames x request frames, each
    cell annotated with the penalty, the ratio (when finite) and ``covered``/``not covered``;
    repeated cells take the median penalty.

    Args:
        coverage: warmup_frames, request_frames, covered (bool), penalty_ms, ratio.

    Returns:
        Figure: the heatmap axis and a colour bar in ms; one text per non-empty cell."""
    df = coverage.copy()
    fig = new_figure(7.0, 4.5)
    ax = fig.add_subplot()
    ax.set_xlabel("request num_frames")
    ax.set_ylabel("startup warmup num_frames")
    ax.set_title(title or "First-request penalty by warmup shape and request shape")
    if df.empty or not {"warmup_frames", "request_frames", "penalty_ms"} <= set(df.columns):
        empty_note(ax, "no coverage results")
        return fig
    df["penalty_ms"] = pd.to_numeric(df["penalty_ms"], errors="coerce")
    for c in ("ratio", "covered"):
        if c not in df.columns:
            df[c] = np.nan
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

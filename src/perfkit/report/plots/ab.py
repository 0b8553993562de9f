"""The A/B figure: a forest plot of B/A per metric with its interval and the launches behind it
(:func:`ab_forest`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfkit.report.plots.base import Figure, empty_note, is_finite, new_figure

#: colour per A/B decision in :func:`ab_forest`
AB_DECISION_COLORS = {
    "regression": "tab:red",
    "improvement": "tab:blue",
    "no change": "tab:green",
    "inconclusive": "tab:orange",
}


def ab_forest(table: pd.DataFrame, launch_means: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Forest plot of an A/B: per metric B/A with its interval, each launch's median over A's
    geometric mean behind it (A grey, B coloured), the ±threshold band, x in per cent change.

    Args:
        table: :attr:`perfkit.ab.decide.AbResult.table`; metrics "not measured" are left out
            (named in the title's note).
        launch_means: :attr:`perfkit.ab.decide.AbResult.launch_means` (side, metric, value).

    Returns:
        Figure with one axis; one row per measured metric in table order."""
    from matplotlib.patches import Patch  # here: drawing is the only reason to import matplotlib

    df = table.copy() if table is not None else pd.DataFrame()
    if not df.empty:
        for c in ("ratio", "low", "high", "threshold", "a"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        skipped = df[df["decision"] == "not measured"]["metric"].tolist()
        df = df[df["decision"] != "not measured"].reset_index(drop=True)
    else:
        skipped = []
    fig = new_figure(9.0, max(3.0, 1.4 + 0.42 * len(df)))
    ax = fig.add_subplot()
    title = title or "B/A per metric: interval on launch medians, dots = launches (grey A, coloured B)"
    if df.empty:
        empty_note(ax, "no metric measured on both sides")
        ax.set_title(title)
        return fig
    y = np.arange(len(df))[::-1].astype(float)
    pct = lambda v: (np.asarray(v, dtype=float) - 1.0) * 100.0  # noqa: E731
    for yi, r in zip(y, df.to_dict("records")):
        thr = r["threshold"] if is_finite(r["threshold"]) else 0.0
        ax.fill_between([-thr * 100, thr * 100], yi - 0.4, yi + 0.4, color="gold", alpha=0.3, lw=0)
        color = AB_DECISION_COLORS.get(r["decision"], "tab:grey")
        if is_finite(r["low"]) and is_finite(r["high"]):
            ax.plot(pct([r["low"], r["high"]]), [yi, yi], color=color, lw=2.5, solid_capstyle="butt")
        ax.scatter(pct([r["ratio"]]), [yi], color=color, s=40, zorder=5, edgecolor="black")
        lm = launch_means[launch_means["metric"] == r["metric"]] if not launch_means.empty else launch_means
        if is_finite(r["a"]) and not lm.empty:
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

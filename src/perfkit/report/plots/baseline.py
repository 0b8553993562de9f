"""The verdict figures: the baseline gate's actual vs expected (:func:`baseline_vs_actual`) and the
A/B forest plot (:func:`ab_forest`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfkit.report.plots.base import Figure, empty_note, is_finite, new_figure, one_axis

#: Colour per verdict status in :func:`baseline_vs_actual`.
STATUS_COLORS = {"pass": "tab:green", "fail": "tab:red", "improved": "tab:blue", "new": "tab:grey"}


def _metric_unit(metric: str) -> str:
    m = metric.lower()
    return "MiB" if any(k in m for k in ("vram", "_mb", "mib", "memory", "peak_alloc")) else "ms"


def baseline_vs_actual(verdicts: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Actual vs expected per verdict row with an expected value, bars coloured by status, a band to
    bound; one axis per unit (ms, MiB)."""
    from matplotlib.patches import Patch  # here: drawing is the only reason to import matplotlib

    df = verdicts.copy() if verdicts is not None else pd.DataFrame()
    for c in ("expected", "actual", "bound"):
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df.columns else np.nan
    df = df[df["expected"].notna()] if not df.empty else df
    if df.empty:
        fig, ax = one_axis(7.0, 3.0)
        empty_note(ax, "no metrics with an expected value")
        ax.set_xlabel("value (ms)")
        ax.set_title(title or "Baseline vs actual")
        return fig
    df["metric"] = df["metric"].astype(str)
    df["_unit"] = df["metric"].map(_metric_unit)
    units = [u for u in ("ms", "MiB") if (df["_unit"] == u).any()]
    multi_case = "case" in df.columns and df["case"].nunique() > 1
    counts = [int((df["_unit"] == u).sum()) for u in units]
    fig = new_figure(9.0, max(3.0, 1.2 + 0.38 * sum(counts) + 0.8 * len(units)))
    gs = fig.add_gridspec(len(units), 1, height_ratios=[max(1, c) for c in counts])
    for k, unit in enumerate(units):
        ax = fig.add_subplot(gs[k, 0])
        sub = df[df["_unit"] == unit].reset_index(drop=True)
        y = np.arange(len(sub))[::-1]
        exp = sub["expected"].to_numpy(float)
        act = sub["actual"].to_numpy(float)
        bnd = sub["bound"].to_numpy(float)
        bnd = np.where(np.isfinite(bnd), bnd, exp)
        status = sub.get("status", pd.Series("new", index=sub.index)).astype(str).str.lower()
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
        if (vals > 0).all() and vals.max() / vals.min() > 50:
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


#: colour per A/B decision in :func:`ab_forest`
AB_DECISION_COLORS = {
    "regression": "tab:red",
    "improvement": "tab:blue",
    "no change": "tab:green",
    "inconclusive": "tab:orange",
}


def ab_forest(table: pd.DataFrame, launch_means: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Forest plot of an A/B: per measured metric B/A (% change) with its interval and each launch
    (A grey, B coloured), the ±threshold band; "not measured" metrics named in the title."""
    from matplotlib.patches import Patch  # here: drawing is the only reason to import matplotlib

    df = table.copy() if table is not None else pd.DataFrame()
    if not df.empty:
        for c in ("ratio", "low", "high", "threshold", "a"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        skipped = df[df["decision"] == "not measured"]["metric"].tolist()
        df = df[df["decision"] != "not measured"].reset_index(drop=True)
    else:
        skipped = []
    fig, ax = one_axis(9.0, max(3.0, 1.4 + 0.42 * len(df)))
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

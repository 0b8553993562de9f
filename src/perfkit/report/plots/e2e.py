"""End-to-end latency (ms) per request, one line per launch, the cold request and the first
request of each new shape marked (:func:`e2e_per_request`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from perfkit.report.plots.base import (
    ROLE_COLORS,
    Figure,
    drop_warmup,
    empty_note,
    integer_xticks,
    launch_names,
    launches_of,
    ms_axis,
    ms_text,
    new_figure,
    of_launch,
    unbundle,
    use_log,
)
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARMUP, request_roles

_ROLE_MARKERS = {ROLE_COLD: ("*", 170), ROLE_NEW_SHAPE: ("D", 60), ROLE_WARMUP: ("s", 40)}


def e2e_per_request(
    requests: Any,
    *,
    metric: str = "e2e_ms",
    include_warmup: bool = False,
    launches: pd.DataFrame | None = None,
    title: str | None = None,
) -> Figure:
    """End-to-end latency (ms) per request index, one line per launch (:func:`launch_names`); the
    cold request and each first of a new shape marked with role and frames; log y when the
    requests span more than 30x.

    Args:
        requests: the requests table (launch, index, e2e_ms, client_ms, num_frames), or a
            :class:`~perfkit.bundle.ResultBundle`.
        metric: ``e2e_ms`` (server side) or ``client_ms``.

    Returns:
        Figure with one axis: a line per launch plus a marker collection per launch and role drawn."""
    requests, b = unbundle(requests, "requests", launches=launches)
    launches = b["launches"]
    names = launch_names(launches)
    df = drop_warmup(requests, include_warmup) if requests is not None else pd.DataFrame()
    fig = new_figure(8.5, 4.6)
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
        log = use_log(df["_v"])
        labelled: set[str] = set()
        launch_list = launches_of(df)
        for lk in launch_list:
            sub = of_launch(df, lk).sort_values("_i")
            if sub.empty:
                continue
            name = names.get(lk, str(lk)) if len(launch_list) > 1 else "requests of one launch"
            (line,) = ax.plot(sub["_i"], sub["_v"], marker="o", ms=4, label=name)
            for role, (mk, size) in _ROLE_MARKERS.items():
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
                    color=ROLE_COLORS[role],
                    zorder=5,
                    label=None if role in labelled else (role if role != ROLE_COLD else "cold request"),
                )
                labelled.add(role)
                for _, r in pts.iterrows():
                    text = r.get("label") if isinstance(r.get("label"), str) else role
                    ax.annotate(
                        f"{text}\n{ms_text(r['_v'])}",
                        (r["_i"], r["_v"]),
                        xytext=(6, -4),
                        textcoords="offset points",
                        fontsize=7,
                        color=line.get_color(),
                    )
            drew = True
        if drew:
            integer_xticks(ax)
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
            if log:
                ms_axis(ax)
            else:
                ax.set_ylim(bottom=0)
            ax.margins(x=0.08, y=0.15)
    if not drew:
        empty_note(ax, f"no {metric} values")
    ax.set_xlabel("request index (0 = cold request, the first after ready)")
    what = "end-to-end" if metric == "e2e_ms" else "client-side"
    ax.set_ylabel(f"{what} latency ({'ms, s; log scale' if ax.get_yscale() == 'log' else 'ms'})")
    ax.set_title(title or "End-to-end latency per request")
    return fig

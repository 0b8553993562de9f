"""Per-request figures: e2e latency per request, step time per step, and one profiled step's
top-level ops over time (ms)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from perfkit.report.plots.base import (
    LABEL_ROLES,
    ROLE_COLORS,
    Figure,
    drop_warmup,
    empty_note,
    integer_xticks,
    launch_names,
    launches_of,
    ms_text,
    ms_y,
    of_launch,
    one_axis,
    unbundle,
    use_log,
)
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP, request_label, request_roles

_ROLE_MARKERS = {ROLE_COLD: ("*", 170), ROLE_NEW_SHAPE: ("D", 60), ROLE_WARMUP: ("s", 40)}


def e2e_per_request(
    requests: Any,
    *,
    include_warmup: bool = False,
    launches: pd.DataFrame | None = None,
    title: str | None = None,
) -> Figure:
    """End-to-end latency (ms) per request index, a line per launch, the cold and first-of-a-shape
    requests marked (``requests``: the table or a ResultBundle); log y past 30x."""
    requests, b = unbundle(requests, "requests", launches=launches)
    launches = b["launches"]
    names = launch_names(launches)
    df = drop_warmup(requests, include_warmup) if requests is not None else pd.DataFrame()
    fig, ax = one_axis(8.5, 4.6)
    drew = False
    if not df.empty and "e2e_ms" in df.columns and "index" in df.columns:
        roles = request_roles(requests, launches)
        df = df.assign(
            _v=pd.to_numeric(df["e2e_ms"], errors="coerce"), _i=pd.to_numeric(df["index"], errors="coerce")
        )
        if "request_id" in df.columns and not roles.empty:
            df = df.merge(roles[["request_id", "role", "label"]], on="request_id", how="left")
        else:
            df = df.assign(role=None, label=None)
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
                pts = sub[sub["role"] == role]
                if role == ROLE_COLD and pts.empty and sub["role"].isna().all():
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
            ms_y(ax, "end-to-end latency", log)
            ax.margins(x=0.08, y=0.15)
    if not drew:
        empty_note(ax, "no e2e_ms values")
        ax.set_ylabel("end-to-end latency (ms)")
    ax.set_xlabel("request index (0 = cold request, the first after ready)")
    ax.set_title(title or "End-to-end latency per request")
    return fig


def step_times(
    steps: Any,
    *,
    requests: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
    title: str | None = None,
) -> Figure:
    """DenoisingStage step time (ms) per step, a line per (launch, request) labelled with role and
    shape (``steps``: the table or a ResultBundle; docs/suite.md)."""
    steps, b = unbundle(steps, "steps", requests=requests, launches=launches)
    requests, launches = b["requests"], b["launches"]
    names = launch_names(launches)
    df = drop_warmup(steps, False) if steps is not None else pd.DataFrame()
    if "stage" in df.columns and (df["stage"] == "DenoisingStage").any():
        df = df[df["stage"] == "DenoisingStage"]
    fig, ax = one_axis(8.5, 5.2)
    launch_keys = launches_of(df)
    multi = len(launch_keys) > 1
    roles = request_roles(requests, launches) if requests is not None else pd.DataFrame()
    role_of = {(r["launch"], r["request_id"]): r for _, r in roles.iterrows()}
    n_lines = 0
    if not df.empty and {"step", "ms"} <= set(df.columns):
        df = df.assign(
            ms=pd.to_numeric(df["ms"], errors="coerce"),
            step=pd.to_numeric(df["step"]),
            _o=df["launch"].map(launch_keys.index) if "launch" in df else 0,
            _n=pd.to_numeric(df["index"], errors="coerce") if "index" in df else 0.0,
        )
        group_keys = [k for k in ("launch", "request_id") if k in df.columns] or ["index"]
        warm_labelled = False  # requests in launch order, then by index
        for _, g in df.sort_values(["_o", "_n"], kind="stable").groupby(group_keys, sort=False):
            g = g.sort_values("step")
            idx = g["index"].iloc[0] if "index" in g else None
            lk = g["launch"].iloc[0] if "launch" in g else None
            info = role_of.get((lk, g["request_id"].iloc[0])) if "request_id" in g else None
            if info is not None:
                role, lab = info["role"], info["label"]
            else:
                lab = request_label(idx) if idx is not None else str(g[group_keys[0]].iloc[0])
                role = LABEL_ROLES.get(lab, ROLE_WARM)
            if multi:
                lab = f"{names.get(lk, lk)}: {lab}"
            if role == ROLE_WARM:
                ax.plot(
                    g["step"],
                    g["ms"],
                    color=ROLE_COLORS[ROLE_WARM],
                    lw=0.9,
                    alpha=0.45,
                    marker=".",
                    ms=3,
                    label="_child" if warm_labelled else "warm requests (one line each)",
                )
                warm_labelled = True
            else:
                color = ROLE_COLORS.get(role, ROLE_COLORS[ROLE_WARMUP])
                ls = ("-", "--", ":", "-.")[launch_keys.index(lk) % 4 if lk in launch_keys else 0]
                ax.plot(g["step"], g["ms"], color=color, ls=ls, lw=2, marker="o", ms=4, label=lab, zorder=4)
            n_lines += 1
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        integer_xticks(ax)
        ms_y(ax, "step time", use_log(df["ms"]))
    if n_lines == 0:
        empty_note(ax, "no step records")
        ax.set_ylabel("step time (ms)")
    ax.set_xlabel("denoising step index")
    ax.set_title(title or "Per-step time (DenoisingStage): cold vs warm requests")
    return fig


def step_timeline(events: pd.DataFrame, *, title: str | None = None) -> Figure:
    """The first denoising step of ``events`` that is not sglang's ``warmup_step``: its 8 costliest
    top-level ops as bars over ms, the rest "other ops" (``full_stages``: the denoising stage)."""
    top = events[(events["cat"] != "kernel") & events["top"]] if not events.empty else events
    ev = top[top["step"] >= 0] if not top.empty else top
    fig, ax = one_axis(8.5, 3.8)
    what = None
    if not ev.empty:
        warm = ev["warmup_step"] if "warmup_step" in ev else pd.Series(False, index=ev.index)
        step = int(ev.loc[~warm, "step"].min()) if (~warm).any() else int(ev["step"].min())
        ev = ev[ev["step"] == step]
        what = f"Denoising step {step}"
    elif not top.empty:  # full_stages: no step ranges; the denoising stage whole
        if den := [s for s in dict.fromkeys(top["stage"]) if "denoising" in str(s).lower()]:
            ev = top[top["stage"] == den[0]]
            what = f"{den[0]} (no step ranges in a full_stages trace)"
    if ev.empty or what is None:
        ax.set_title(title or "One denoising step: top-level ops over time")
        empty_note(ax, "no denoising step in this trace")
        return fig
    ev = ev[ev["tid"] == ev.groupby("tid")["dur_ms"].sum().idxmax()]  # the thread doing the work
    t0 = float(ev["ts_us"].min())
    order = list(ev.groupby("op")["dur_ms"].sum().sort_values(ascending=False).index)
    shown = order[:8]
    names = shown + (["other ops"] if len(order) > 8 else [])
    colours = [f"C{i % 10}" for i in range(len(names))]
    for lane, name in enumerate(names):
        sel = ev[ev["op"] == name] if name != "other ops" else ev[~ev["op"].isin(shown)]
        bars = [((float(ts) - t0) / 1000.0, float(d)) for ts, d in zip(sel["ts_us"], sel["dur_ms"])]
        ax.broken_barh(bars, (len(names) - 1 - lane - 0.4, 0.8), color=colours[lane])
    ax.set_yticks(range(len(names)), list(reversed(names)), fontsize="small")
    ax.set_xlabel("time from the first op shown (ms)")
    ax.set_ylabel("op")
    ax.set_title(title or f"{what}: top-level ops over time")
    return fig

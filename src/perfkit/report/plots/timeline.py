"""The memory timeline (:func:`memory_timeline`): device and host memory (MiB) since the engine's
launch, with its phases, requests, compiles and stage starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from perfkit.bundle_schema import WARMUP_INDEX
from perfkit.report.plots.base import (
    LABEL_ROLES,
    ROLE_COLORS,
    Figure,
    drop_warmup,
    empty_note,
    is_finite,
    launch_names,
    launches_of,
    ms_text,
    new_figure,
    of_launch,
    ordered_stages,
    stage_colors,
    unbundle,
    x_text,
)
from perfkit.roles import ROLE_COLD, ROLE_WARM, ROLE_WARMUP, request_label, request_roles


@dataclass
class _Timeline:
    mem: pd.DataFrame
    names: dict[Any, str]
    t0: float
    phases: dict[str, float]
    axes: list[Any]
    handles: dict[str, Any] = field(default_factory=dict)

    @property
    def from_launch(self) -> bool:
        return "start" in self.phases


def _draw_phases(tl: _Timeline, t: pd.Series) -> None:
    from matplotlib.patches import Patch  # here: drawing is the only reason to import matplotlib

    phases, axes, t0 = tl.phases, tl.axes, tl.t0
    for lab, a, z, color in (
        ("model load", phases.get("process", phases["start"]), phases.get("loaded"), "#fee391"),
        ("startup warmup", phases.get("loaded"), phases.get("ready"), "#d9d9d9"),
    ):
        if a is None or z is None or z <= a:
            continue
        for ax in axes:
            ax.axvspan(a - t0, z - t0, color=color, alpha=0.5, lw=0, gid="phase-span")
        x_text(axes[-1], (a + z) / 2 - t0, 0.03, lab, va="bottom")
        tl.handles.setdefault(lab, Patch(color=color, alpha=0.5, label=lab))
    if t.notna().any() and float(t.min()) > phases["ready"] - 0.5:
        x_text(
            axes[-1],
            (phases["ready"] - t0) / 2,
            0.5,
            "no memory samples\nbefore ready",
            va="center",
            color="dimgray",
        )


def _draw_requests(tl: _Timeline, req: pd.DataFrame, launches: pd.DataFrame | None, t: pd.Series) -> int:
    """Shade each request's span by role and mark its compiles; returns how many are drawn."""
    roles = request_roles(req, launches)
    role_of = {r["request_id"]: r for _, r in roles.iterrows()} if "request_id" in req.columns else {}
    # with the phases drawn, the startup warmup request is the warmup phase
    n_req = len(drop_warmup(req, not tl.from_launch))
    t_end = pd.to_numeric(req["t_end_s"], errors="coerce").max()
    x_span = max(1e-9, float(np.nanmax([t_end, t.max(), tl.t0])) - tl.t0)
    for _, r in req.iterrows():
        if not (is_finite(r["t_start_s"]) and is_finite(r["t_end_s"])):
            continue
        info = role_of.get(r.get("request_id"))
        short = info["short"] if info is not None else request_label(r.get("index"))
        role = info["role"] if info is not None else LABEL_ROLES.get(short, ROLE_WARM)
        _draw_request(tl, r, role, short, x_span)
    return n_req


def _draw_request(tl: _Timeline, r: Mapping[str, Any], role: str, short: str, x_span: float) -> None:
    """One request's span, role and compile marks (no span for the warmup when phases are drawn)."""
    from matplotlib.lines import Line2D  # here: drawing is the only reason to import matplotlib
    from matplotlib.patches import Patch

    axes = tl.axes
    color = ROLE_COLORS.get(role, ROLE_COLORS[ROLE_WARM])
    a, z = float(r["t_start_s"]) - tl.t0, float(r["t_end_s"]) - tl.t0
    phase = role == ROLE_WARMUP and tl.from_launch
    for ax in axes if not phase else []:
        ax.axvspan(a, z, color=color, alpha=0.15, gid="request-span", lw=0)
    if role != ROLE_WARMUP and (z - a) > 0.012 * x_span:
        x_text(axes[0], (a + z) / 2, 0.9, short, va="top", rotation=90, color=color)
    key = {ROLE_WARM: "warm requests", ROLE_WARMUP: "startup warmup request", ROLE_COLD: "cold request"}.get(
        role, role
    )
    if not phase:
        tl.handles.setdefault(key, Patch(color=color, alpha=0.3, label=key))
    nc = r.get("compiles")
    if not (is_finite(nc) and float(nc) > 0):
        return
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
        f"compile {ms_text(cms)}" if is_finite(cms) else "compile",
        (a, 1.0),
        xycoords=axes[0].get_xaxis_transform(),
        xytext=(4, -10),
        textcoords="offset points",
        fontsize=7,
    )
    tl.handles.setdefault(
        "compile",
        Line2D([], [], marker="v", color="black", ls="", label="torch.compile ran (time)"),
    )


def _draw_stage_marks(tl: _Timeline, stages: pd.DataFrame) -> None:
    from matplotlib.lines import Line2D  # here: drawing is the only reason to import matplotlib

    st = stages[pd.to_numeric(stages["t_start_s"], errors="coerce").notna()]
    colors = stage_colors(ordered_stages(st["stage"]))
    for _, r in st.iterrows():
        c = colors[str(r["stage"])]
        for ax in tl.axes:
            ax.axvline(float(r["t_start_s"]) - tl.t0, color=c, ls=":", lw=0.8, gid="stage-mark")
        tl.handles.setdefault(
            f"stage:{r['stage']}", Line2D([], [], color=c, ls=":", label=f"{r['stage']} start")
        )


def _launch_phases(launch_row: Mapping[str, Any] | None, req: pd.DataFrame | None) -> dict[str, float]:
    """Epoch s of ``start``, ``loaded``, ``ready``: ready is the warmup's end, else the first start."""
    lr = dict(launch_row or {})
    ready_s = lr.get("ready_s")
    t_ready = None
    if req is not None and not req.empty and {"t_start_s", "t_end_s", "index"} <= set(req.columns):
        idx = pd.to_numeric(req["index"], errors="coerce")
        wu = req[idx == WARMUP_INDEX]
        if not wu.empty and is_finite(wu["t_end_s"].iloc[0]):
            t_ready = float(wu["t_end_s"].iloc[0])
        else:
            ts = pd.to_numeric(req["t_start_s"], errors="coerce")
            if ts.notna().any():
                t_ready = float(ts.min())
    if t_ready is None or not is_finite(ready_s):
        return {"ready": t_ready} if t_ready is not None else {}
    start = t_ready - float(ready_s)
    out = {"start": start, "ready": t_ready}
    if is_finite(lr.get("models_loaded_s")):
        out["loaded"] = start + float(lr["models_loaded_s"])
    if is_finite(lr.get("process_start_s")):
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
    title: str | None = None,
) -> Figure:
    """Device and host memory (MiB) over time since the engine's launch (docs/suite.md, "The report
    page"); ``memory`` may be a ResultBundle (its other tables and GPU name come with it)."""
    mem, b = unbundle(memory, "memory", requests=requests, stages=stages, launches=launches)
    requests, stages, launches = b["requests"], b["stages"], b["launches"]
    device_name = device_name or b["meta"].get("gpu_name")
    mem = mem if mem is not None else pd.DataFrame()
    names = launch_names(launches)  # before selecting one: "unlimited" beside capped ones
    mem, requests, stages, launches = (of_launch(d, launch) for d in (mem, requests, stages, launches))
    caps = dict(caps or {})
    launch_rows = [r.to_dict() for _, r in launches.iterrows()] if launches is not None else []
    one_launch = launch_rows[0] if len(launch_rows) == 1 else None
    phases = _launch_phases(one_launch, requests) if one_launch is not None or not launch_rows else {}
    t = _col(mem, "t_s")
    has_device = bool(_col(mem, "device_used_mib").notna().any())
    fig = new_figure(10.0, 6.8 if has_device else 4.4)
    axes = list(fig.subplots(2, 1, sharex=True)) if has_device else [fig.add_subplot()]
    axes[0].tick_params(labelbottom=True)  # the device panel keeps its time ticks
    tl = _Timeline(mem, names, _time_zero(phases, t, requests, stages), phases, axes)
    default_title = _default_title(names, launch, one_launch)
    if has_device:
        _draw_device(tl, device_name, title or default_title, caps.get("device_cap_gib"), one_launch)
    _draw_host(
        tl,
        caps.get("host_cap_gib"),
        title or default_title.replace("device and host", "host; no device samples"),
    )
    if tl.from_launch:
        _draw_phases(tl, t)
    if requests is not None and not requests.empty and {"t_start_s", "t_end_s"} <= set(requests.columns):
        few = _draw_requests(tl, requests, launches, t) <= 4
        if few and stages is not None and not stages.empty and {"stage", "t_start_s"} <= set(stages.columns):
            _draw_stage_marks(tl, stages)
    _finish_axes(tl)
    return fig


def _col(mem: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(mem.get(name, pd.Series(np.nan, index=mem.index, dtype=float)), errors="coerce")


def _time_zero(
    phases: Mapping[str, float], t: pd.Series, requests: pd.DataFrame | None, stages: pd.DataFrame | None
) -> float:
    """The launch's start, else the first sample, else the earliest request or stage start, else 0."""
    if "start" in phases:
        return phases["start"]
    if t.notna().any():
        return float(t.min())
    starts = [
        pd.to_numeric(df["t_start_s"], errors="coerce").min()
        for df in (requests, stages)
        if df is not None and "t_start_s" in df.columns
    ]
    return float(np.nanmin(starts)) if starts and not np.isnan(starts).all() else 0.0


def _default_title(names: Mapping[Any, str], launch: Any, one_launch: Mapping[str, Any] | None) -> str:
    """``"Memory timeline · <launch name> (device and host, from launch)"``, the name if it tells apart."""
    name = names.get(launch if launch is not None else (one_launch or {}).get("launch"))
    if name is not None and len(names) == 1 and name == str(next(iter(names))):
        name = None  # one launch with only its label ("session"): nothing to tell apart
    return "Memory timeline" + (f" · {name}" if name else "") + " (device and host, from launch)"


def _series(tl: _Timeline, ax: Any, col: str, label: str, **kw: Any) -> bool:
    """One line of ``col`` (MiB) per launch on ``ax``; whether any was drawn."""
    mem_launches = launches_of(tl.mem) if not tl.mem.empty else [None]
    multi = len(mem_launches) > 1
    drew = False
    for lk in mem_launches:
        sub = of_launch(tl.mem, lk)
        y = pd.to_numeric(sub[col], errors="coerce") if col in sub.columns else None
        if y is None or not y.notna().any():
            continue
        x = pd.to_numeric(sub["t_s"], errors="coerce") - tl.t0
        keep = (y.notna() & x.notna()).to_numpy()  # PSS is read on some samples only (PSS_DUTY)
        xs, ys = x.to_numpy()[keep], y.to_numpy()[keep]
        order = np.argsort(xs)
        lab = f"{label} ({tl.names.get(lk, lk)})" if multi else label
        sparse = {"marker": "o", "ms": 3} if not keep.all() else {}  # a lone read shows
        ax.plot(xs[order], ys[order], label=lab, **{**sparse, **kw})
        drew = True
    return drew


def _draw_device(
    tl: _Timeline, device_name: str | None, title: str, cap_gib: Any, one_launch: Mapping[str, Any] | None
) -> None:
    ax_dev = tl.axes[0]
    _series(tl, ax_dev, "device_used_mib", f"device used ({device_name})" if device_name else "device used")
    ax_dev.set_ylabel("device memory (MiB)")
    ax_dev.set_title(title)
    _cap_line(ax_dev, cap_gib, "device cap", "cap:device")
    if one_launch is None:
        return
    phases = tl.phases
    for key, lab, a, z in (
        ("load_peak_mib", "load peak", "process", "loaded"),
        ("warmup_peak_mib", "warmup peak", "loaded", "ready"),
    ):
        v = one_launch.get(key)
        if is_finite(v) and a in phases and z in phases:
            ax_dev.hlines(
                float(v),
                phases[a] - tl.t0,
                phases[z] - tl.t0,
                colors="black",
                lw=2,
                gid=f"peak:{key.split('_')[0]}",
            )
            ax_dev.annotate(
                f"{lab} {float(v):,.0f} MiB",
                ((phases[a] + phases[z]) / 2 - tl.t0, float(v)),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )


def _draw_host(tl: _Timeline, cap_gib: Any, title: str) -> None:
    ax_host = tl.axes[-1]
    host_drew = _series(tl, ax_host, "host_pss_mib", "host PSS (process tree)")
    host_drew |= _series(tl, ax_host, "cgroup_current_mib", "cgroup memory.current", ls="-.")
    host_drew |= _series(tl, ax_host, "host_rss_mib", "host RSS", ls=":")
    host_drew |= _series(tl, ax_host, "host_anon_mib", "host anonymous (summed per process)", ls="--")
    _cap_line(ax_host, cap_gib, "host cap", "cap:host")
    ax_host.set_ylabel("host memory (MiB)")
    ax_host.set_xlabel("time since launch (s)" if tl.from_launch else "time since first sample (s)")
    if len(tl.axes) == 1:
        ax_host.set_title(title)
        if not host_drew:
            empty_note(ax_host, "no memory samples")


def _finish_axes(tl: _Timeline) -> None:
    """Legends (the first also lists :attr:`_Timeline.handles`), y from 0, x from the launch."""
    for i, ax in enumerate(tl.axes):
        h, _ = ax.get_legend_handles_labels()
        extra = list(tl.handles.values()) if i == 0 else []
        if h or extra:
            ax.legend(handles=h + extra, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if ax.has_data():
            ax.set_ylim(bottom=0)
        if tl.from_launch:
            ax.set_xlim(left=0)


def _cap_line(ax: Any, cap_gib: Any, label: str, gid: str) -> None:
    if cap_gib is None or not is_finite(cap_gib):
        return
    mib = float(cap_gib) * 1024.0
    ax.axhline(
        mib, color="black", ls="--", lw=1.2, gid=gid, label=f"{label} {float(cap_gib):g} GiB ({mib:,.0f} MiB)"
    )

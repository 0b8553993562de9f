"""What happened on the memory timeline (:mod:`perfkit.report.plots.timeline`): the launch's phases
shaded, each request's span coloured by role (:func:`perfkit.roles.request_roles`), compile events
marked and stage starts drawn as dotted lines; and :class:`Timeline`, what every part draws
against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from perfkit.report.plots.base import drop_warmup, is_finite, ms_text, ordered_stages
from perfkit.report.plots.style import COLD_COLOR, stage_colors
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP, request_label, request_roles


@dataclass
class Timeline:
    """What every part of one memory timeline draws against: the samples, the time origin
    (epoch s), the launch's phases, the axes (device first when drawn) and the legend entries
    that are no series (phases, request roles, compiles, stage marks)."""

    mem: pd.DataFrame
    names: dict[Any, str]
    t0: float
    phases: dict[str, float]
    axes: list[Any]
    handles: dict[str, Any] = field(default_factory=dict)

    @property
    def from_launch(self) -> bool:
        return "start" in self.phases


def draw_phases(tl: Timeline, t: pd.Series) -> None:
    """Shade and label the launch's model load and startup warmup on every panel."""
    from matplotlib.patches import Patch  # here: drawing is the only reason to import matplotlib

    phases, axes, t0 = tl.phases, tl.axes, tl.t0
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
        tl.handles.setdefault(lab, Patch(color=color, alpha=0.5, label=lab))
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


def draw_requests(
    tl: Timeline, req: pd.DataFrame, launches: pd.DataFrame | None, include_warmup: bool, t: pd.Series
) -> int:
    """Shade each request's span coloured by role (:func:`perfkit.roles.request_roles`) and mark
    its compiles; returns how many requests are drawn besides the warmup phase."""
    roles = request_roles(req, launches)
    role_of = {r["request_id"]: r for _, r in roles.iterrows()} if "request_id" in req.columns else {}
    req = drop_warmup(req, include_warmup)
    # the startup warmup request is the warmup phase when the phases are drawn (its
    # compile is still marked)
    n_req = len(drop_warmup(req, not tl.from_launch))
    t_end = pd.to_numeric(req["t_end_s"], errors="coerce")
    t0 = tl.t0
    x_span = max(
        1e-9,
        float(np.nanmax([t_end.max() if t_end.notna().any() else t0, t.max() if t.notna().any() else t0]))
        - t0,
    )
    for _, r in req.iterrows():
        if not (is_finite(r["t_start_s"]) and is_finite(r["t_end_s"])):
            continue
        info = role_of.get(r.get("request_id"))
        role = (
            info["role"]
            if info is not None
            else ({"cold": ROLE_COLD, "warmup": ROLE_WARMUP}.get(request_label(r.get("index")), ROLE_WARM))
        )
        short = info["short"] if info is not None else request_label(r.get("index"))
        _draw_request(tl, r, role, short, x_span)
    return n_req


def _draw_request(tl: Timeline, r: Mapping[str, Any], role: str, short: str, x_span: float) -> None:
    """One request: its span on every panel (not the startup warmup's when the phases are drawn),
    its role written above it when wide enough, and a triangle per panel when it compiled."""
    from matplotlib.lines import Line2D  # here: drawing is the only reason to import matplotlib
    from matplotlib.patches import Patch

    axes = tl.axes
    color = {ROLE_COLD: COLD_COLOR, ROLE_NEW_SHAPE: "tab:orange", ROLE_WARMUP: "tab:grey"}.get(
        role, "tab:blue"
    )
    a, z = float(r["t_start_s"]) - tl.t0, float(r["t_end_s"]) - tl.t0
    phase = role == ROLE_WARMUP and tl.from_launch
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


def draw_stage_marks(tl: Timeline, stages: pd.DataFrame, include_warmup: bool) -> None:
    """A dotted line at each stage start, coloured by stage class, on every panel."""
    from matplotlib.lines import Line2D  # here: drawing is the only reason to import matplotlib

    st = drop_warmup(stages, include_warmup)
    st = st[pd.to_numeric(st["t_start_s"], errors="coerce").notna()]
    colors = stage_colors(ordered_stages(st["stage"]))
    for _, r in st.iterrows():
        c = colors[str(r["stage"])]
        for ax in tl.axes:
            ax.axvline(float(r["t_start_s"]) - tl.t0, color=c, ls=":", lw=0.8, gid="stage-mark")
        tl.handles.setdefault(
            f"stage:{r['stage']}", Line2D([], [], color=c, ls=":", label=f"{r['stage']} start")
        )

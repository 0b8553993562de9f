"""Below the stage: the profiled requests' traces op by op (docs/below-the-stage.md)."""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perfkit.bundle import ResultBundle
from perfkit.readings import traces as tr
from perfkit.report.plots import alt_text, figure_to_png_bytes, step_timeline
from perfkit.report.tables import Table, format_table

log = logging.getLogger(__name__)

DIFF_ROLES = ("profiled cold", "profiled warm")
#: roles of a first request the diff sets against the warm ones
_FIRST_ROLES = (DIFF_ROLES[0], "profiled first of new shape")


@dataclass
class BelowStage:
    """What a bundle's profiled requests say (``kernel_diff``: None on a CPU run)."""

    traces: pd.DataFrame
    stage_top: dict[str, pd.DataFrame] = field(default_factory=dict)
    diff: pd.DataFrame | None = None
    diff_from: str | None = None
    kernel_diff: pd.DataFrame | None = None
    kernel_note: str | None = None
    errors: list[str] = field(default_factory=list)
    events: dict[str, pd.DataFrame] = field(default_factory=dict)
    overhead: dict[str, pd.DataFrame] = field(default_factory=dict)


def below_stage(
    bundle: ResultBundle, top: int = 5, roles: tuple[str, ...] | None = None
) -> BelowStage | None:
    """The profiled requests of ``bundle`` op by op; None when it profiled nothing."""
    t = bundle.table("traces")
    if t.empty:
        return None
    out = BelowStage(traces=t)
    todo: list[tuple[str, Path, list[str] | None]] = []
    for row in t.itertuples(index=False):
        if (
            not bool(row.kept)
            or pd.isna(row.file)
            or (roles is not None and not str(row.role).startswith(roles))
        ):
            continue
        path = bundle.traces.get(Path(str(row.file)).name) or (
            Path(bundle.path) / str(row.file) if bundle.path else None
        )
        if path is None:
            out.errors.append(f"{row.file}: not in the bundle")
        else:
            st = row.stages.split("; ") if isinstance(row.stages, str) else None
            todo.append((str(row.role), Path(path), st))
    for (role, _, _), got in zip(todo, tr.read_many([p for _, p, _ in todo], [s for _, _, s in todo])):
        if got.error is not None:
            out.errors.append(got.error)
        else:
            out.events[role], out.overhead[role] = got.events, got.overhead
    events = out.events
    for role, ev in events.items():
        if role in (*_FIRST_ROLES, DIFF_ROLES[1]):  # the first one and the first warm one
            out.stage_top[role] = tr.stage_top_ops(ev, top)
    warm = warm_events(events)
    first = next((r for r in events if r in _FIRST_ROLES), None)
    if first is not None and warm:
        out.diff_from = first
        out.diff, out.kernel_diff, out.kernel_note = _op_diffs(
            events[first], warm, {first: [events[first]], DIFF_ROLES[1]: warm}
        )
    return out


def _op_diffs(a: Any, b: Any, sides: dict[str, list[pd.DataFrame]]) -> tuple[Any, Any, str | None]:
    """(op diff, kernel diff when every trace of ``sides`` has device kernels, else why not)."""
    with_k = [k for k, evs in sides.items() if evs and all((e["cat"] == "kernel").any() for e in evs)]
    if len(with_k) == len(sides):
        return tr.op_diff(a, b), tr.op_diff(a, b, kernels=True), None
    without = [k for k in sides if k not in with_k]
    note = (
        f"No device-kernel diff: not every trace of {' and '.join(without)} has device kernels (a "
        f"CPU run, or the profiler recorded no CUDA activity), while those of {' and '.join(with_k)} "
        "do; the op diff above compares CPU-side time only."
    )
    return tr.op_diff(a, b), None, note if with_k else None


def warm_events(events: dict[str, pd.DataFrame]) -> list[pd.DataFrame]:
    """The events of the profiled warm requests."""
    return [ev for role, ev in events.items() if role.startswith(DIFF_ROLES[1])]


def timeline(events: pd.DataFrame, who: str) -> dict[str, str]:
    """One denoising step of ``events`` as ``{"png": base64, "alt": …, "who": who}``."""
    fig = step_timeline(events, title=None)
    title = fig.axes[0].get_title()
    fig.axes[0].set_title(f"{title}, {who}")
    return {
        "png": base64.b64encode(figure_to_png_bytes(fig)).decode("ascii"),
        "alt": alt_text(fig),
        "who": who,
    }


#: why an ``N_steps`` trace holds N+1 steps (sglang 0.5.23, ``runtime/utils/profiler.py``)
_WHY_ONE_MORE = (
    "{n} asked + 1: sglang adds its warm-up step to the recorded ones (active = N + 1); "
    "ProfilerStep#1 is that one (warmup_step)"
)


def steps_text(asked: Any, recorded: Any, mode: Any) -> str | None:
    """The count recorded, and why when it is not the count asked; None when not known."""
    if pd.isna(recorded):
        return None
    r = int(recorded)
    if pd.isna(asked):
        return f"{r} (every denoising step; no step ranges)" if mode == "full_stages" else str(r)
    n = int(asked)
    if r == n + 1:
        return f"{r} ({_WHY_ONE_MORE.format(n=n)})"
    if r <= n:
        return f"{r} of {n} asked + 1 (the request ran out of steps; the last holds what followed)"
    return str(r)


def trace_list(bs: BelowStage, link_prefix: str = "") -> pd.DataFrame:
    """The traces table for display (size in MiB, file: ``link_prefix`` + the bundle's path)."""
    t = bs.traces
    asked = t["steps_asked"]
    return pd.DataFrame(
        {
            "role": t["role"],
            "status": t["status"],
            "mode": t["mode"],
            "steps_asked": asked,
            "steps_recorded": [steps_text(a, r, m) for a, r, m in zip(asked, t["steps_recorded"], t["mode"])],
            "size_mib": t["size_mib"],
            "file": [link_prefix + f if isinstance(f, str) else None for f in t["file"].astype(object)],
            "note": t["note"],
        }
    )


def diff_frame(diff: pd.DataFrame, n: int = 8, first: str = "cold", second: str = "warm") -> pd.DataFrame:
    """The ``n`` ops of an op diff whose time changed most: calls, ms, change (ms) and share."""
    d = diff.head(n)
    return pd.DataFrame(
        {
            "op": d["op"],
            f"calls_{first}": d["count_a"],
            f"calls_{second}": d["count_b"],
            f"{first}_ms": d["ms_a"],
            f"{second}_ms": d["ms_b"],
            "change_ms": d["delta_ms"],
            "share_of_change": d["delta_share"],
        }
    )


def first_word(bs: BelowStage) -> str:
    """``cold`` or ``first`` (of a new shape): what the diff's first side is called."""
    return "cold" if bs.diff_from in (None, DIFF_ROLES[0]) else "first"


def diff_title(bs: BelowStage) -> str:
    """The diff's caption: which request against which."""
    return f"{bs.diff_from or DIFF_ROLES[0]} → profiled warm (each op's median over the warm ones)"


def overhead_tables(bs: BelowStage) -> list[tuple[str, pd.DataFrame]]:
    """(role, overhead frame) for the profiled first request and the first warm one."""
    return [
        (role, tr.overhead_frame(t))
        for role, t in bs.overhead.items()
        if role in (*_FIRST_ROLES, DIFF_ROLES[1]) and not t.empty
    ]


def panel(bundle: ResultBundle | Exception | None, link_prefix: str = "") -> dict[str, Any] | None:
    """The report's "below the stage" panel of a bundle or its load error; None when none or
    nothing profiled. Never raises."""
    if bundle is None:
        return None
    if isinstance(bundle, Exception):
        return _panel(pd.DataFrame(), errors=[repr(bundle)])
    try:
        bs = below_stage(bundle)
    except Exception as exc:  # noqa: BLE001 - a broken bundle must not kill the report
        log.warning("report: below the stage of %s: %r", bundle.path, exc)
        return _panel(pd.DataFrame(), errors=[repr(exc)])
    if bs is None:
        return None
    tl = trace_list(bs, link_prefix)
    last = DIFF_ROLES[1] if DIFF_ROLES[1] in bs.events else (list(bs.events)[-1] if bs.events else None)
    return _panel(
        tl,
        diff=_shown(bs.diff, first_word(bs)),
        diff_title=diff_title(bs),
        kernel_diff=_shown(bs.kernel_diff, first_word(bs)),
        kernel_note=bs.kernel_note,
        stage_top=[(role, format_table(t)) for role, t in bs.stage_top.items()],
        cpu_and_idle=[(role, format_table(t)) for role, t in overhead_tables(bs)],
        timeline=timeline(bs.events[last], last) if last is not None else None,
        errors=bs.errors,
    )


def _shown(d: pd.DataFrame | None, first: str, second: str = "warm") -> Table | None:
    return format_table(diff_frame(d, 8, first, second)) if d is not None else None


def _panel(tl: pd.DataFrame, **fields: Any) -> dict[str, Any]:
    return {
        "traces": format_table(tl) if not tl.empty else None,
        "files": [f for f in (tl["file"] if not tl.empty else []) if isinstance(f, str)],
        **fields,
    }


def ab_panel(
    path_a: str | Path | None, path_b: str | Path | None, page_dir: str | Path
) -> dict[str, Any] | None:
    """The A/B page's panel: ops that changed most from A's warm requests to B's; None; never raises."""
    sides: dict[str, BelowStage] = {}
    events: dict[str, pd.DataFrame] = {}
    errors: list[str] = []
    lists = []
    for side, p in (("A", path_a), ("B", path_b)):
        if not p or not (Path(p) / "meta.json").exists():
            continue
        try:
            b = ResultBundle.load(p)
            bs = below_stage(b, roles=(DIFF_ROLES[1],))  # the warm ones only
        except Exception as exc:  # noqa: BLE001 - a broken bundle must not kill the page
            errors.append(f"side {side}: {exc!r}")
            continue
        if bs is None:
            continue
        sides[side] = bs
        errors += [f"side {side}: {e}" for e in bs.errors]
        prefix = os.path.relpath(Path(p), Path(page_dir)).replace(os.sep, "/") + "/"
        lists.append(trace_list(bs, prefix))
        lists[-1].insert(0, "side", side)
        if warm_events(bs.events):
            events[side] = warm_events(bs.events)
    if not sides and not errors:
        return None
    tl = pd.concat(lists, ignore_index=True) if lists else pd.DataFrame()
    diff = kernel_diff = note = None
    stage_diffs: list[tuple[str, Any]] = []
    if "A" in events and "B" in events:
        diff, kernel_diff, note = _op_diffs(
            events["A"], events["B"], {f"side {k}'s profiled warm traces": events[k] for k in "AB"}
        )
        diff, kernel_diff = _shown(diff, "a", "b"), _shown(kernel_diff, "a", "b")
        # per stage: not drowned by another stage's launch-to-launch noise
        ran = (x for side in "AB" for e in events[side] for x in e["stage"].dropna() if isinstance(x, str))
        for st in dict.fromkeys(ran):
            d = tr.op_diff(
                [e[e["stage"] == st] for e in events["A"]], [e[e["stage"] == st] for e in events["B"]]
            )
            if not d.empty:
                stage_diffs.append((st, format_table(diff_frame(d, 5, "a", "b"))))
    stage_top = [
        (f"side {side}, {DIFF_ROLES[1]}", format_table(bs.stage_top[DIFF_ROLES[1]]))
        for side, bs in sides.items()
        if DIFF_ROLES[1] in bs.stage_top
    ]
    return _panel(
        tl,
        diff=diff,
        diff_title="side A's profiled warm requests → side B's (each op's median over them)",
        kernel_diff=kernel_diff,
        kernel_note=note,
        stage_diffs=stage_diffs,
        stage_top=stage_top,
        cpu_and_idle=[
            (f"side {side}, {role}", format_table(t))
            for side, bs in sides.items()
            for role, t in overhead_tables(bs)
        ],
        timeline=timeline(events["B"][0], f"side B, {DIFF_ROLES[1]}") if "B" in events else None,
        errors=errors,
    )

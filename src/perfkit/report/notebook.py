"""What the notebooks show beside the plots, from the same bundle tables and check rows as the
gate, through :func:`perfkit.report.tables.styled`: requests with role and shape, first-request
costs, the verdict in sentences, invariants and, on a replay, :func:`replay_markdown`."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

from perfkit.bundle import WARMUP_INDEX
from perfkit.checks import NOT_REPORTED, Check, check_table, is_reported, overall_status, reported_count
from perfkit.common.frames import align_frames, latent_frames
from perfkit.common.slugs import md_text
from perfkit.gate.verdicts import check_counts
from perfkit.investigations import registry
from perfkit.report.tables import styled
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP
from perfkit.roles import request_roles as plot_roles

#: request roles (:func:`perfkit.roles.request_roles`', the cold one split by its shape's warmup)
COLD_NEW_SHAPE = "cold, new shape"
ROLES = (ROLE_WARMUP, ROLE_COLD, COLD_NEW_SHAPE, ROLE_NEW_SHAPE, ROLE_WARM)
#: the roles of a request that ran its shape first in its launch
FIRST_OF_SHAPE = (ROLE_COLD, COLD_NEW_SHAPE, ROLE_NEW_SHAPE)


def show_table(df: pd.DataFrame, caption: str | None = None, transpose: bool | str = "auto") -> None:
    """Display ``df`` through :func:`perfkit.report.tables.styled` (``transpose`` False for a list
    of items). Raises TypeError: ``df`` is not a DataFrame."""
    from IPython.display import display

    display(styled(df, caption=caption, transpose=transpose))


def _int(v: Any) -> int | None:
    try:
        return None if pd.isna(v) else int(v)
    except (TypeError, ValueError):
        return None


def _shape_text(row: Mapping[str, Any]) -> str:
    """``"24→25 frames (4 latent), 512x768, 30 steps"``."""
    nf, eff = _int(row.get("num_frames")), _int(row.get("effective_num_frames"))
    if eff is None and nf is not None:
        eff = align_frames(nf)
    frames = "–" if nf is None else (f"{nf}→{eff}" if eff is not None and eff != nf else f"{nf}")
    lat = _int(row.get("latent_frames"))
    if lat is None and eff is not None:
        lat = latent_frames(eff)
    h, w, steps = _int(row.get("height")), _int(row.get("width")), _int(row.get("steps"))
    parts = [f"{frames} frames" + (f" ({lat} latent)" if lat is not None else "")]
    if h is not None and w is not None:
        parts.append(f"{h}x{w}")
    if steps is not None:
        parts.append(f"{steps} steps")
    return ", ".join(parts)


def request_roles(requests: pd.DataFrame, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """``requests`` with ``role`` (``cold, new shape`` when the warmup had not run its latent
    shape), ``shape`` (``"24→25 frames (4 latent), 512x768, 30 steps"``) and ``request``
    (``"warmup17 #3 first of a new shape"``).

    Raises:
        ValueError: ``requests`` lacks the ``launch`` or ``index`` column."""
    missing = [c for c in ("launch", "index") if c not in requests.columns]
    if missing:
        raise ValueError(f"request_roles: the requests table has no {', '.join(missing)} column")
    df = requests.reset_index(drop=True)
    roles = plot_roles(df, launches)
    by_key = {
        (r["launch"], r["request_id"], _int(r["index"])): (r["role"], bool(r["new_shape"]))
        for _, r in roles.iterrows()
    }
    role = []
    for _, r in df.iterrows():
        name, new = by_key.get((r["launch"], r.get("request_id"), _int(r["index"])), (ROLE_WARM, False))
        role.append(COLD_NEW_SHAPE if name == ROLE_COLD and new else name)
    df["role"] = role
    df["shape"] = [_shape_text(r) for _, r in df.iterrows()]
    df["request"] = [
        f"{r['launch']} " + ("warmup" if r["role"] == ROLE_WARMUP else f"#{_int(r['index'])} {r['role']}")
        for _, r in df.iterrows()
    ]
    return df


def request_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """Every request of a bundle for display: launch, request index, role, shape, end-to-end
    time (ms), recompilations (count, time in ms, reason) and status."""
    if requests is None or requests.empty:
        return pd.DataFrame(columns=["launch", "#", "role", "shape", "e2e (ms)", "status"])
    df = request_roles(requests)
    out = pd.DataFrame(
        {
            "launch": df["launch"],
            "#": [("warmup" if _int(i) == WARMUP_INDEX else _int(i)) for i in df["index"]],
            "role": df["role"],
            "shape": df["shape"],
            "e2e (ms)": df.get("e2e_ms"),
            "compiles": _told(df.get("compiles", [None] * len(df)), count=True),
            "compiling (ms)": _told(df.get("compile_ms", [None] * len(df))),
            "recompile reason": [_reason(v) for v in df.get("recompile_reasons", [None] * len(df))],
            "status": df.get("status"),
        }
    )
    if out["recompile reason"].isna().all():
        out = out.drop(columns=["recompile reason"])
    return out.reset_index(drop=True)


def _told(values: Iterable[Any], count: bool = False) -> list[Any]:
    """Each value as reported (an int for a ``count``), "not reported" where the engine gave none
    (sglang's records carry no compile counts): a table never shows 0 for what was not measured."""
    return [
        NOT_REPORTED if not is_reported(v) else (reported_count(v) if count else float(v)) for v in values
    ]


def _reason(v: Any) -> str | None:
    return (str(v).strip() or None) if is_reported(v) else None


def first_request_costs(requests: pd.DataFrame, stages: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cold or first-of-a-new-shape request: ``first (ms)``, the ``warm median (ms)``
    of its shape in its launch, ``penalty (ms)``, the ``penalty stage`` holding most of it and
    its recompilations."""
    cols = ["launch", "request", "shape", "first (ms)", "warm median (ms)", "penalty (ms)", "penalty stage"]
    cols += ["stage penalty (ms)", "compiles", "compiling (ms)", "recompile reason"]
    if requests is None or requests.empty:
        return pd.DataFrame(columns=cols)
    df = request_roles(requests)
    ok = df[df.get("status", "completed").astype("string").fillna("completed") == "completed"]
    out = []
    for i, r in ok.iterrows():
        if r["role"] not in FIRST_OF_SHAPE:
            continue
        warm = ok[(ok["launch"] == r["launch"]) & (ok["role"] == ROLE_WARM)]
        warm = warm[warm["shape"] == r["shape"]]  # the roles' shape: one rule for both
        wmed = float(warm["e2e_ms"].median()) if not warm.empty else math.nan
        first = float(r["e2e_ms"]) if pd.notna(r.get("e2e_ms")) else math.nan
        stage, stage_ms = penalty_stage(stages, r, warm)
        out.append(
            {
                "launch": r["launch"],
                "request": f"#{_int(r['index'])} {r['role']}",
                "shape": r["shape"],
                "first (ms)": first,
                "warm median (ms)": wmed,
                "penalty (ms)": first - wmed,
                "penalty stage": stage,
                "stage penalty (ms)": stage_ms,
                "compiles": _told([r.get("compiles")], count=True)[0],
                "compiling (ms)": _told([r.get("compile_ms")])[0],
                "recompile reason": _reason(r.get("recompile_reasons")),
            }
        )
    return pd.DataFrame(out, columns=cols)


def penalty_stage(stages: pd.DataFrame | None, first: Mapping[str, Any], warm: pd.DataFrame) -> tuple:
    """(stage, ms) holding most of request ``first``'s excess over the median of the ``warm``
    requests (per-request sums of each stage: a stage may run twice); (None, nan) when none."""
    if stages is None or stages.empty or warm.empty or "request_id" not in stages.columns:
        return None, math.nan
    mine = stages[stages["request_id"] == first.get("request_id")]
    theirs = stages[stages["request_id"].isin(list(warm["request_id"]))]
    if mine.empty or theirs.empty:
        return None, math.nan
    # a stage may run more than once a request (two-stage pipelines): per-request sums first
    med = theirs.groupby(["request_id", "stage"])["ms"].sum().groupby("stage").median()
    pen = mine.groupby("stage")["ms"].sum() - med
    pen = pen.dropna()
    if pen.empty:
        return None, math.nan
    top = str(pen.idxmax())
    return top, float(pen[top])


def verdict_markdown(rows: Iterable[Check | Mapping[str, Any]], what: str = "Gate") -> str:
    """The verdict in sentences from the gate's check rows: status and counts, then the failed,
    inconclusive, skipped and passed checks with their reasons."""
    df = check_table(list(rows))
    if df.empty:
        return f"**{what}: nothing gated** (no invariant of this investigation has a limit)."
    status = overall_status(df)
    lines = [f"**{what}: {status}.** {check_counts(df['status'])}."]

    def listed(sub: pd.DataFrame) -> str:
        return ", ".join(
            md_text(m, code=True) + (f" ({md_text(r)})" if r else "")
            for m, r in zip(sub["metric"], sub["reason"])
        )

    clean = not df["status"].isin(("fail", "inconclusive")).any()
    for statuses, word in (
        (("fail",), "Failed"),
        (("inconclusive",), "Inconclusive (over the limit within the run's noise)"),
        (("skipped",), "Not measured, so not judged"),
        (("pass", "improved", "new"), "Every measured check passed" if clean else "Passed"),
    ):
        sub = df[df["status"].isin(statuses)]
        if not sub.empty:
            lines.append(f"{word}: {listed(sub)}.")
    return " ".join(lines)


def check_frame(
    rows: Iterable[Check | Mapping[str, Any]], metrics: Iterable[str] | None = None, with_case: bool = False
) -> pd.DataFrame:
    """The check rows (of ``metrics`` when given): metric, limit (the bound with any noise margin,
    else the limit), measured, status, reason; ``case`` first with ``with_case``."""
    df = check_table(list(rows))
    if metrics is not None:
        df = df[df["metric"].isin(list(metrics))]
    df = df.assign(
        limit=pd.to_numeric(df["bound"], errors="coerce").fillna(
            pd.to_numeric(df["expected"], errors="coerce")
        )
    )
    cols = ["case"] * with_case + ["metric", "limit", "measured", "status", "reason"]
    return df.rename(columns={"actual": "measured"})[cols].reset_index(drop=True)


def invariants_frame(investigation: str, given: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Each invariant of ``investigation``: default, ``given``, in effect
    (:func:`perfkit.investigations.registry.merged_invariants`). Raises KeyError (unknown investigation),
    ValueError (an unknown invariant in ``given``)."""
    s = registry.get(investigation)
    merged = registry.merged_invariants(given)
    defaults = s.invariant_defaults()
    given = dict(given or {})
    rows = [(k, d, given.get(k), merged.get(k)) for k, d in defaults.items()]
    return pd.DataFrame(rows, columns=["invariant", "default", "given", "in effect"])


def _comparable(given: Any, recorded: Any) -> Any:
    """``recorded`` reduced to what ``given`` states: dict keys ``given`` has, None values
    dropped (a recorded cap also records its defaults). A cap recorded without a device or host
    limit is what a ``None`` (no cap) means, so it reads as None."""
    if given is None and isinstance(recorded, Mapping) and "label" in recorded:
        if recorded.get("device_gib") is None and recorded.get("host_gib") is None:
            return None
    if isinstance(given, Mapping) and isinstance(recorded, Mapping):
        return {k: _comparable(given[k], recorded.get(k)) for k in given if given[k] is not None}
    if (
        isinstance(given, (list, tuple))
        and isinstance(recorded, (list, tuple))
        and len(given) == len(recorded)
    ):
        return [_comparable(g, r) for g, r in zip(given, recorded)]
    return recorded


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def value_text(v: Any) -> str:
    """A params value in plain words, never a Python repr:
    ``[{'label': 'x', 'device_gib': 12}]`` -> ``[x (device_gib 12)]``."""
    from perfkit.common.numfmt import number_text

    if isinstance(v, Mapping):
        items = {k: x for k, x in v.items() if x is not None}
        label = items.pop("label", None)
        inner = ", ".join(f"{k} {value_text(x)}" for k, x in items.items())
        if label is not None:
            return f"{label}" + (f" ({inner})" if inner else "")
        return inner or "{}"
    if isinstance(v, (list, tuple)):
        return "[" + "; ".join(value_text(x) for x in v) + "]"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return number_text(float(v)) if isinstance(v, float) else str(v)
    return str(v)


def replay_markdown(recorded_params: Mapping[str, Any] | None, given: Mapping[str, Any], source: str) -> str:
    """What a replay of ``source`` re-applies (the checks, against the invariants given) and what
    it cannot (measurement params are the bundle's): each param of ``given`` that differs from
    ``recorded_params`` (the bundle's ``meta["params"]``, None: not recorded) is named with both values."""
    lines = [
        f"Replayed from {md_text(source, code=True)}: the measurements are the recorded ones; the checks are judged "
        "again, here, against the limits below (a verdict recorded in the bundle is not used)."
    ]
    rec = dict(recorded_params or {})
    diffs = []
    for key, value in given.items():
        if key not in rec:
            continue
        want, had = _plain(value), _plain(_comparable(value, rec[key]))
        if want != had:
            diffs.append(
                f"{md_text(key, code=True)}: given {md_text(value_text(want))}, "
                f"measured with {md_text(value_text(_plain(rec[key])))}"
            )
    if diffs:
        lines.append(
            "These params differ from what the bundle was measured with and cannot apply to a "
            "replay (the table and plots show what was measured): " + "; ".join(diffs) + "."
        )
    return " ".join(lines)

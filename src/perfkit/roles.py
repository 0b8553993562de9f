"""Request roles in the design doc's words (startup warmup, cold, first of a new shape, warm) from a
bundle's requests and launches tables: the labels of plots, notebook tables and root-cause panel.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from perfkit.bundle_schema import WARMUP_INDEX
from perfkit.common.numfmt import json_float


def is_finite(v: Any) -> bool:
    """``v`` is a finite number (None, NaN, inf and text are not)."""
    return json_float(v) is not None


def launches_of(df: pd.DataFrame) -> list[Any]:
    """The launch labels of ``df`` in order of appearance; ``[None]`` without a launch column."""
    if "launch" not in df.columns or df.empty:
        return [None]
    return list(dict.fromkeys(df["launch"].tolist()))


def request_label(index: Any) -> str:
    """``cold`` for index 0, ``warm #i`` for i >= 1, ``warmup`` for the startup warmup (index only)."""
    try:
        i = int(index)
    except (TypeError, ValueError):
        return str(index)
    if i == 0:
        return "cold"
    if i == WARMUP_INDEX:
        return "warmup"
    return f"warm #{i}"


ROLE_WARMUP = "startup warmup"
ROLE_COLD = "cold"
ROLE_NEW_SHAPE = "first of a new shape"
ROLE_WARM = "warm"


def _frames_of(r: Mapping[str, Any]) -> int | None:
    for k in ("effective_num_frames", "num_frames"):
        v = r.get(k)
        if is_finite(v):
            return int(float(v))
    return None


def _shape_key(r: Mapping[str, Any]) -> str:
    ls = r.get("latent_shape")
    if isinstance(ls, str) and ls:
        return ls
    return f"{_frames_of(r)}x{r.get('height')}x{r.get('width')}"


def request_roles(requests: pd.DataFrame | None, launches: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per request, per launch in index order: ``launch``, ``request_id``, ``index``,
    ``frames`` (Int64), ``shape`` (latent, else frames x height x width), ``role`` (``startup
    warmup``, ``cold``, ``first of a new shape`` when neither the warmup (or ``launches``'
    ``warmup_latent_shape``) nor an earlier request ran it, else ``warm``), ``new_shape``,
    ``label`` (``"warm #3 · 25 frames"``) and ``short`` (``"warm #3"``, ``"new shape"``)."""
    cols = ["launch", "request_id", "index", "frames", "shape", "role", "new_shape", "label", "short"]
    if requests is None or requests.empty or "index" not in requests.columns:
        return pd.DataFrame(columns=cols)
    warm_shapes: dict[Any, set[str]] = {}
    if launches is not None and not launches.empty and "warmup_latent_shape" in launches.columns:
        for _, lr in launches.iterrows():
            ws = lr.get("warmup_latent_shape")
            if isinstance(ws, str) and ws:
                warm_shapes.setdefault(lr.get("launch"), set()).add(ws)
    req = requests.assign(_i=pd.to_numeric(requests["index"], errors="coerce"))
    if "launch" not in req.columns:
        req = req.assign(launch=None)
    out = []
    for lk in launches_of(req):
        sub = req[req["launch"] == lk] if lk is not None else req
        sub = sub.sort_values("_i", kind="stable")
        seen = set(warm_shapes.get(lk, set()))
        n_warm: dict[str, int] = {}
        for _, r in sub.iterrows():
            rd = r.to_dict()
            frames = _frames_of(rd)
            shape = _shape_key(rd)
            i = r["_i"]
            new = shape not in seen
            if is_finite(i) and int(i) == WARMUP_INDEX:
                role, short, new = ROLE_WARMUP, "warmup", False
            elif is_finite(i) and int(i) == 0:
                role, short = ROLE_COLD, "cold"
            elif new:
                role, short = ROLE_NEW_SHAPE, "new shape"
            else:
                n_warm[shape] = n_warm.get(shape, 0) + 1
                role, short = ROLE_WARM, f"warm #{n_warm[shape]}"
            seen.add(shape)
            fr = f" · {frames} frames" if frames is not None else ""
            label = f"{role if role != ROLE_WARM else short}{fr}"
            if role == ROLE_COLD and new:
                label += " (new shape)"
            out.append(
                (lk, rd.get("request_id"), rd.get("index"), frames, shape, role, bool(new), label, short)
            )
    df = pd.DataFrame(out, columns=cols)
    df["frames"] = df["frames"].astype("Int64")
    return df

"""JSON that stays JSON (RFC 8259): no ``NaN``/``Infinity`` literals, which strict readers
(``JSON.parse``, jq) refuse. :func:`finite` turns non-finite floats into ``null`` ("not measured";
the reason lives beside it); :func:`dumps` writes with ``allow_nan=False``, so one that slipped
through is an error, never a bad file.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(v: Any) -> Any:
    """``v`` with every NaN/±inf float replaced by None, recursively (dict keys become str,
    tuples lists, numpy scalars Python numbers)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            return finite(v.item())
        except (TypeError, ValueError):
            pass
    return v


def non_finite_paths(v: Any, prefix: str = "") -> list[str]:
    """Dotted paths (``results.warm.median_ms``, ``rows[2].actual``) of the non-finite floats in
    ``v``: what :func:`finite` turns into null."""
    out: list[str] = []
    if isinstance(v, float):
        if not math.isfinite(v):
            out.append(prefix or "<value>")
    elif isinstance(v, dict):
        for k, x in v.items():
            out += non_finite_paths(x, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            out += non_finite_paths(x, f"{prefix}[{i}]")
    elif hasattr(v, "item") and not isinstance(v, (str, bytes)):
        try:
            out += non_finite_paths(v.item(), prefix)
        except (TypeError, ValueError):
            pass
    return out


def dumps(obj: Any, **kw: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(obj)`` with ``allow_nan=False`` (other keyword
    arguments passed on, e.g. ``indent``, ``sort_keys``, ``default``)."""
    return json.dumps(finite(obj), allow_nan=False, **kw)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict; a key given twice raises
    ValueError naming it (``json`` alone keeps the last one silently: a second ``"scenarios"``
    would drop every case of the first)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} given twice in one object")
        out[k] = v
    return out

"""JSON that stays JSON (RFC 8259): no ``NaN``/``Infinity`` literals, which strict readers refuse;
:func:`finite` makes them ``null`` ("not measured"), :func:`dumps` refuses any left."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any


def _walk(v: Any, prefix: str, bad: list[tuple[str, float]]) -> Any:
    """``v`` with non-finite floats as None; (dotted path, value) of each appended to ``bad``."""
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        bad.append((prefix or "<value>", v))
        return None
    if isinstance(v, dict):
        return {str(k): _walk(x, f"{prefix}.{k}" if prefix else str(k), bad) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_walk(x, f"{prefix}[{i}]", bad) for i, x in enumerate(v)]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        with contextlib.suppress(TypeError, ValueError):
            return _walk(v.item(), prefix, bad)
    return v


def finite(v: Any) -> Any:
    """``v`` with every NaN/±inf float as None, recursively (keys str, tuples lists, numpy scalars)."""
    return _walk(v, "", [])


def non_finite(v: Any) -> list[tuple[str, float]]:
    """(dotted path, value) of each non-finite float in ``v`` (``rows[2].actual``)."""
    bad: list[tuple[str, float]] = []
    _walk(v, "", bad)
    return bad


def dumps(obj: Any, **kw: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(obj)`` with ``allow_nan=False``."""
    return json.dumps(finite(obj), allow_nan=False, **kw)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: ValueError naming a key given twice (json keeps the last)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} given twice in one object")
        out[k] = v
    return out

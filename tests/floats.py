"""Recomputed floats against recorded ones, within a stated tolerance: numpy's summation order
follows the CPU's SIMD width (173.2212655194156 on one x86-64, 173.22126551941557 on another), so
a figure recomputed here is never compared with a recorded one bit for bit."""

from __future__ import annotations

import math

#: relative tolerance of a recomputed float against the recorded one
REL = 1e-9


def close(a: object, b: object, rel: float = REL, abs_tol: float = 0.0) -> bool:
    """``a`` equals ``b``, floats within ``rel`` relative (or ``abs_tol``), through dicts, lists and
    tuples; NaN equals NaN; anything else exactly."""
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(x, (int, float)) for x in (a, b)):
            return a == b
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel, abs_tol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, rel, abs_tol) for x, y in zip(a, b))
    return a == b

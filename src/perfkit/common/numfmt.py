"""Numbers as a reader sees them, in every table, sentence and check reason perfkit writes
(:func:`number_text` is the one rule; docs/suite.md, "The report page")."""

from __future__ import annotations

import math
from typing import Any


def number_text(x: float) -> str:
    """``x`` as display text: whole numbers thousands-separated (``14,512``), else ``>= 100`` no
    decimals, ``>= 10`` one, ``>= 1`` two, below three, trailing zeros dropped below 10 (``1.5``);
    no exponent; NaN ``"–"``, infinities ``"∞"``/``"-∞"``; TypeError/ValueError: not a number."""
    f = float(x)
    if math.isnan(f):
        return "–"
    if math.isinf(f):
        return "∞" if f > 0 else "-∞"
    a = abs(f)
    if a < 1e15 and f == round(f):
        return f"{int(round(f)):,}"
    if a >= 100:
        s = f"{f:,.0f}"
    elif a >= 10:
        s = f"{f:,.1f}"
    elif a >= 1:
        s = f"{f:.2f}"
    else:
        s = f"{f:.3f}"
    if "." in s and a < 10:  # 1.50 -> 1.5; 73.0 keeps its decimal (it was rounded there)
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("0", "-0") else s


def percent_text(x: object, digits: int = 1) -> str:
    """A fraction as a percent (``0.054`` -> ``"5.4 %"``); ``"–"`` (not measured) for None,
    NaN, infinities and non-numbers, never ``"nan %"``."""
    f = json_float(x)
    return "–" if f is None or isinstance(x, bool) else f"{f * 100:.{digits}f} %"


def change_text(ratio: object) -> str:
    """A ratio as a signed percent change (``1.05`` -> ``"+5.0 %"``); ``"–"`` as :func:`percent_text`."""
    f = json_float(ratio)
    return "–" if f is None or isinstance(ratio, bool) else f"{(f - 1) * 100:+.1f} %"


def confidence_text(c: float) -> str:
    """A confidence (fraction in (0, 1)) as a percent with the fewest decimals that keep it exact
    to 1e-6 or, from two decimals on, below 100: ``0.95`` -> ``"95 %"``, ``0.99957`` ->
    ``"99.96 %"``, ``0.99998`` -> ``"99.998 %"``; never ``"100 %"`` for a confidence below 1."""
    p = float(c) * 100.0
    for d in range(0, 7):
        s = f"{p:.{d}f}"
        if abs(float(s) - p) < 1e-6 or (d >= 2 and float(s) < 100.0):
            return f"{s} %"
    return f"{p} %"


def fmt(v: Any, spec: str = ".0f", unit: str = "", missing: str = "–") -> str:
    """A number for a reading or a check reason: ``fmt(58427.9, ".0f", " ms")`` -> ``"58,428 ms"``;
    a ``g`` spec takes :func:`number_text`; ``missing`` when not measured (None, NaN, not a number)."""
    x = json_float(v)
    if x is None:
        return missing
    if spec.endswith("g"):  # "as precise as it reads": the one number rule, no exponent
        return f"{number_text(x)}{unit}"
    if spec.startswith(".") and spec.endswith("f"):
        spec = "," + spec  # thousands separated: 58,428 ms
    return f"{x:{spec}}{unit}"


def json_float(x: Any) -> float | None:
    """float or None for NaN/None (results.json must be valid JSON)."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f

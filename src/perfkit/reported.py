"""Values an engine may not report: NA is "not reported", never 0 or False. sglang's records carry
no compile counts, compile times, recompile-limit flag or host RSS (only the reference engine's
``perfkit`` block does); a sum or an "any" over requests is known only when every request
reported it, and a check that needs it is skipped (:data:`NOT_REPORTED_REASON`).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

#: what a table cell or a sentence says for a value the engine did not report
NOT_REPORTED = "not reported"
#: the reason of a check skipped because the engine reports no compile counts
NOT_REPORTED_REASON = "not measured: the engine reported no compile counts (sglang's records carry none)"


def is_reported(v: Any) -> bool:
    """False for None, NaN, ``pd.NA`` and ``NaT`` (not reported); True for any other value, 0 and
    False included."""
    try:
        return not bool(pd.isna(v)) if pd.api.types.is_scalar(v) else True
    except (TypeError, ValueError):
        return True


def reported_count(v: Any) -> int | None:
    """A count as an int (``numpy.int64`` and a whole float included); None when not reported.

    Raises:
        ValueError: a value that is no whole number >= 0 (text, a fraction, a negative number).
    """
    if not is_reported(v):
        return None
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a count")
    f = float(v)
    if f < 0 or f != int(f):
        raise ValueError(f"{v!r} is not a count")
    return int(f)


def reported_flag(v: Any) -> bool | None:
    """``v`` as a bool; None when not reported."""
    return bool(v) if is_reported(v) else None


def all_reported(values: Iterable[Any]) -> bool:
    """Every value is reported (True for no values)."""
    return all(is_reported(v) for v in values)


def reported_sum(values: Iterable[Any], *, count: bool = False) -> int | float | None:
    """The sum of ``values`` when every one was reported (and there is at least one), else None:
    a sum over requests some of which did not report is not known. ``count``: an int sum of
    counts (:func:`reported_count`)."""
    vals = list(values)
    if not vals or not all_reported(vals):
        return None
    if count:
        return sum(reported_count(v) or 0 for v in vals)
    return float(sum(float(v) for v in vals))


def reported_any(values: Iterable[Any]) -> bool | None:
    """True when some value is true; False when every value was reported and none is; None
    when none is true and some were not reported (or there are none)."""
    vals = list(values)
    if any(is_reported(v) and bool(v) for v in vals):
        return True
    if not vals or not all_reported(vals):
        return None
    return False

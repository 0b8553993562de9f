"""The check rows investigations emit and the gate judges (:class:`Check`; statuses: docs/suite.md),
and values an engine may not report (:func:`is_reported`, ``reported_*``): NA is "not reported",
never 0 or False; a sum or an "any" over requests is known only when every request reported it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd

from perfkit.common.numfmt import json_float, number_text

CHECK_COLUMNS = ["case", "metric", "expected", "actual", "bound", "status", "reason"]
STATUSES = ("pass", "fail", "new", "improved", "inconclusive", "skipped")
NOT_MEASURED = "not measured"


@dataclass
class Check:
    """One checked metric: case id (or the investigation's name), baseline value or limit, measured
    value (None: ``skipped``), ``bound`` (sglang's ``max(expected*(1+tol), expected+pad)`` or the
    limit), a status of :data:`STATUSES`; lower: the low end of its noise interval; snippet: for
    ``improved``, the JSON fragment for the case's baseline entry."""

    case: str
    metric: str
    expected: float | None
    actual: float | None
    bound: float | None
    status: str
    reason: str = ""
    snippet: dict[str, Any] | None = field(default=None)
    lower: float | None = None


def number(v: Any) -> float | None:
    """A finite float, or None for None/NaN/inf/bool/text (``"12"`` too)/non-numbers."""
    return None if isinstance(v, (bool, str, bytes)) else json_float(v)


def check_max(
    case: str, metric: str, value: Any, limit: float, what: str = "", lower: Any = None, noise: str = ""
) -> Check:
    """``value <= limit``: over it, ``fail`` only when ``lower`` (its noise interval's low end,
    ``noise`` says whence) is over too, else ``inconclusive``; ``skipped`` when value is missing."""
    v, lo = number(value), number(lower)
    tail = (f" ({what})" if what else "") + (f"; {noise}" if noise and lo is not None else "")
    if v is None:
        return Check(case, metric, limit, None, limit, "skipped", NOT_MEASURED, lower=lo)
    lim = number_text(limit)
    if v <= limit:
        status, reason = "pass", f"{number_text(v)} <= {lim}"
    elif lo is None or lo > limit:
        status = "fail"
        reason = f"{number_text(v)} > {lim}" + (
            f", its lower bound {number_text(lo)} > {lim} too" if lo is not None else ""
        )
    else:
        status = "inconclusive"
        reason = (
            f"{number_text(v)} > {lim}, but its lower bound {number_text(lo)} <= {lim}: noise could flip it"
        )
    return Check(case, metric, limit, v, limit, status, reason + tail, lower=lo)


def check_min(case: str, metric: str, value: Any, limit: float, what: str = "") -> Check:
    """``value >= limit``; ``skipped`` when value is missing."""
    v = number(value)
    if v is None:
        return Check(case, metric, limit, None, limit, "skipped", NOT_MEASURED)
    ok = v >= limit
    reason = f"{number_text(v)} {'>=' if ok else '<'} {number_text(limit)}" + (f" ({what})" if what else "")
    return Check(case, metric, limit, v, limit, "pass" if ok else "fail", reason)


def check_flag(case: str, metric: str, value: Any, want: bool, detail: str = "") -> Check:
    """A boolean that must equal ``want``; ``skipped`` when value is None."""
    if value is None:
        return Check(case, metric, None, None, None, "skipped", NOT_MEASURED)
    got = bool(value)
    reason = f"{metric.split('[', 1)[0]}={got}" + (f"; {detail}" if detail else "")
    return Check(case, metric, float(want), float(got), None, "pass" if got is want else "fail", reason)


def check_table(rows: Iterable[Check | Mapping[str, Any]]) -> pd.DataFrame:
    """Check rows as a DataFrame with :data:`CHECK_COLUMNS`."""
    dicts = (r.__dict__ if isinstance(r, Check) else dict(r) for r in rows)
    return pd.DataFrame([{c: d.get(c) for c in CHECK_COLUMNS} for d in dicts], columns=CHECK_COLUMNS)


#: statuses of rows that compared a measured value with something
COMPARED = ("pass", "fail", "improved", "new")


def overall_status(df: pd.DataFrame) -> str:
    """``fail`` if any row is, else ``inconclusive`` if any, else ``skipped`` when no row compared
    anything, else (no rows too) ``pass``."""
    if df.empty:
        return "pass"
    if (df["status"] == "fail").any():
        return "fail"
    if (df["status"] == "inconclusive").any():
        return "inconclusive"
    return "pass" if df["status"].isin(COMPARED).any() else "skipped"


#: what a table cell or a sentence says for a value the engine did not report
NOT_REPORTED = "not reported"
#: the reason of a check skipped because the engine reports no compile counts
NOT_REPORTED_REASON = "not measured: the engine reported no compile counts (sglang's records carry none)"


def is_reported(v: Any) -> bool:
    """False for None, NaN, ``pd.NA`` and ``NaT``; True for any other value, 0 and False included."""
    try:
        return not bool(pd.isna(v)) if pd.api.types.is_scalar(v) else True
    except (TypeError, ValueError):
        return True


def reported_count(v: Any) -> int | None:
    """A count as an int (None: not reported); ValueError for anything but a whole number >= 0."""
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


def reported_sum(values: Iterable[Any], *, count: bool = False) -> int | float | None:
    """The sum of ``values`` when there are some and every one was reported, else None;
    ``count``: an int sum of counts (:func:`reported_count`)."""
    vals = list(values)
    if not vals or not all(map(is_reported, vals)):
        return None
    if count:
        return sum(reported_count(v) or 0 for v in vals)
    return float(sum(float(v) for v in vals))


def reported_any(values: Iterable[Any]) -> bool | None:
    """True when some value is true; False when every value was reported and none is; else None."""
    vals = list(values)
    if any(is_reported(v) and bool(v) for v in vals):
        return True
    if not vals or not all(map(is_reported, vals)):
        return None
    return False

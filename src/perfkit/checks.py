"""The check rows investigations emit and the gate judges (:class:`Check`: an invariant within a run,
or a baseline metric by sglang's rule), and their tables. Statuses: ``pass``, ``fail``, ``new``
(a case the baseline lacks), ``improved`` (faster than the baseline by more than its improvement
threshold), ``inconclusive`` (over its limit, but its noise interval is not: neither a pass nor a
regression), ``skipped`` (not measured: never a pass). And values an engine may not report
(:func:`is_reported`, ``reported_*``): NA is "not reported", never 0 or False; a sum or an "any"
over requests is known only when every request reported it (sglang's records carry no compile
counts, compile times, recompile-limit flag or host RSS; only the reference engine's do).
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
    """One checked metric.

    Attributes:
        case: case id (baseline rows) or the investigation's name (invariants).
        metric: ``stages_ms.<stage>``, ``denoise_step_ms.<i>``, ``expected_e2e_ms``, ... or the
            invariant's metric name (``warm_cold_ratio``, ``cap_held[12GiB]``).
        expected: the baseline value (ms or MiB) or the invariant's limit.
        actual: the measured value; None when it was not measured (then ``status`` is
            ``skipped``, never ``pass``).
        bound: the value ``actual`` is held to: ``max(expected*(1+tol), expected+pad)`` for a
            baseline metric (sglang's rule), the limit for an invariant.
        status: one of :data:`STATUSES`.
        reason: why, in words (``"3.4 > 3, but its lower bound 1.2 <= 3: noise could flip it"``).
        lower: an invariant's value at the low end of its noise interval (the run's own spread),
            when one was measured: over the limit only when the value is, a failure needs it.
        snippet: for ``improved``, the JSON fragment to paste into the case's baseline entry.
    """

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
    """A finite float, or None for None/NaN/inf/bool/text/non-numbers (a number written as
    text, ``"12"``, is not read as 12)."""
    return None if isinstance(v, (bool, str, bytes)) else json_float(v)


def check_max(
    case: str, metric: str, value: Any, limit: float, what: str = "", lower: Any = None, noise: str = ""
) -> Check:
    """``value <= limit``: over it, ``fail`` only when ``lower`` (the low end of its noise
    interval, e.g. a one-sided 95 % bound; ``noise`` says whence) is over too, else
    ``inconclusive``; without ``lower`` the value decides; ``skipped`` when value is missing."""
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
    """Check rows as a DataFrame with :data:`CHECK_COLUMNS`
    (case, metric, expected, actual, bound, status, reason)."""
    dicts = (r.__dict__ if isinstance(r, Check) else dict(r) for r in rows)
    return pd.DataFrame([{c: d.get(c) for c in CHECK_COLUMNS} for d in dicts], columns=CHECK_COLUMNS)


#: statuses of rows that compared a measured value with something
COMPARED = ("pass", "fail", "improved", "new")


def overall_status(df: pd.DataFrame) -> str:
    """``"fail"`` when any row failed, else ``"inconclusive"`` when a row is, else ``"skipped"``
    when no row compared anything (never a pass), else ``"pass"``; no rows: ``"pass"``."""
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


def reported_sum(values: Iterable[Any], *, count: bool = False) -> int | float | None:
    """The sum of ``values`` when every one was reported (and there is at least one), else None:
    a sum over requests some of which did not report is not known. ``count``: an int sum of
    counts (:func:`reported_count`)."""
    vals = list(values)
    if not vals or not all(map(is_reported, vals)):
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
    if not vals or not all(map(is_reported, vals)):
        return None
    return False

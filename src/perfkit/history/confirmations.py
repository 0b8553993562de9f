"""Confirmations of change points (``perfkit history confirm``), stored next to the runs as
``STORE/confirmations/<digest>.parquet``, one file each (:data:`COLUMNS`, written as the runs'
files); a later confirmation of a step is another row. The A/B itself: :mod:`perfkit.bisect.confirm`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from perfkit.history.changepoints import Analysis, Step, analyse_frame
from perfkit.history.store import HistoryError, _locked, read_store, write_parquet

#: what an A/B between a step's commits can say
OUTCOMES = ("confirmed", "not reproduced", "undecided", "error")
#: the directory under the store
CONFIRM_DIR = "confirmations"

#: column -> (arrow type, doc)
COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "hardware": (pa.string(), "the series' hardware"),
    "case_id": (pa.string(), "the series' case"),
    "metric": (pa.string(), "the series' metric (store name, e.g. DenoisingStage_ms)"),
    "before_commit": (pa.string(), "the step's last run before (commit)"),
    "after_commit": (pa.string(), "the step's first run after (commit)"),
    "step_kind": (pa.string(), "regression | improvement (from the history)"),
    "step_ratio": (pa.float64(), "the history's level ratio after / before"),
    "outcome": (pa.string(), "confirmed | not reproduced | undecided | error"),
    "ab_metric": (pa.string(), "the A/B metric compared (e.g. DenoisingStage)"),
    "ab_decision": (pa.string(), "the A/B decision of that metric (regression, no change, ...)"),
    "ratio": (pa.float64(), "A/B ratio after / before (NULL: not measured)"),
    "low": (pa.float64(), "its interval's low end"),
    "high": (pa.float64(), "its interval's high end"),
    "launches": (pa.string(), "JSON: launches run a side"),
    "detail": (pa.string(), "why (the A/B's stop reason or the error)"),
    "out": (pa.string(), "the confirmation's output directory"),
    "time": (pa.timestamp("us", tz="UTC"), "when it was confirmed (UTC)"),
}
SCHEMA = pa.schema([(k, t) for k, (t, _) in COLUMNS.items()])


@dataclass
class Confirmation:
    """One confirmation row (fields as :data:`COLUMNS`; ``launches``: side -> launches run)."""

    hardware: str
    case_id: str
    metric: str
    before_commit: str
    after_commit: str
    step_kind: str
    step_ratio: float
    outcome: str
    ab_metric: str
    ab_decision: str
    ratio: float | None
    low: float | None
    high: float | None
    launches: dict[str, int]
    detail: str
    out: str
    time: datetime

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")


def _num(x: float | None) -> float | None:
    return None if x is None or x != x else float(x)


def add_confirmation(store: str | Path, c: Confirmation) -> Path:
    """Store ``c`` as ``STORE/confirmations/<digest>.parquet``. Returns the file."""
    store = Path(store)
    row = {k: [getattr(c, k)] for k in COLUMNS}
    row["launches"] = [json.dumps(c.launches, sort_keys=True)]
    row["time"] = [c.time.astimezone(timezone.utc)]
    for k in ("ratio", "low", "high", "step_ratio"):
        row[k] = [_num(getattr(c, k))]
    table = pa.table(row, schema=SCHEMA)
    key = "\x1f".join([c.hardware, c.case_id, c.metric, c.before_commit, c.after_commit, c.time.isoformat()])
    with _locked(store):
        d = store / CONFIRM_DIR
        d.mkdir(parents=True, exist_ok=True)
        return write_parquet(table, d / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.parquet")


def read_confirmations(store: str | Path) -> pd.DataFrame:
    """Every confirmation of ``store`` (:data:`COLUMNS`), oldest first; empty with the columns
    when there is none.

    Raises:
        HistoryError: a file that is not a confirmation file (names it).
    """
    files = sorted(f for f in (Path(store) / CONFIRM_DIR).glob("*.parquet") if not f.name.startswith("."))
    if not files:
        return pd.DataFrame({k: pd.Series(dtype=object) for k in COLUMNS})
    tables = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowException, OSError) as exc:
            raise HistoryError(f"{f}: not a confirmation file (not parquet): {exc}") from None
        missing = [k for k in COLUMNS if k not in t.column_names]
        if missing:
            raise HistoryError(f"{f}: not a confirmation file: missing column {missing[0]!r}")
        tables.append(t.select(list(COLUMNS)))
    return pa.concat_tables(tables).to_pandas().sort_values("time", kind="stable", ignore_index=True)


def find_step(
    store: str | Path, series: str, change: str, *, hardware: str | None = None
) -> tuple[Analysis, Step]:
    """The step ``change`` of ``series`` in ``store``.

    Args:
        series: ``CASE/METRIC`` (e.g. ``tiny/DenoisingStage_ms``; split at the last ``/``).
        change: the step's number in the series (1 = its first step, in time order) or a
            commit (a prefix of 4 or more hex digits) of the step's first run after (or its last
            run before).
        hardware: needed when the series is stored for several hardware.

    Raises:
        HistoryError: a malformed series, a series not in the store, several hardware without
            ``hardware`` (those named), no such step (the series' steps named).
    """
    if "/" not in series:
        raise HistoryError(f"series {series!r}: expected CASE/METRIC (e.g. tiny/DenoisingStage_ms)")
    case_id, metric = series.rsplit("/", 1)
    df = read_store(store, hardware=hardware)
    df = df[(df["case_id"] == case_id) & (df["metric"] == metric)]
    if df.empty:
        raise HistoryError(
            f"{store}: no series {series!r}" + (f" on hardware {hardware!r}" if hardware else "") + " stored"
        )
    hws = sorted(df["hardware"].unique())
    if len(hws) > 1:
        raise HistoryError(
            f"series {series!r} is stored for several hardware ({', '.join(hws)}): give --hardware"
        )
    (analysis,) = analyse_frame(df)
    steps = analysis.steps
    listed = (
        "; ".join(
            f"{i}: {s.before.commit[:10]} .. {s.after.commit[:10]} ({s.change_pct:+.1f} %)"
            for i, s in enumerate(steps, 1)
        )
        or "none"
    )
    if change.isdigit() and len(change) < 4:
        k = int(change)
        if not 1 <= k <= len(steps):
            raise HistoryError(f"series {series!r} has no step {k}; its steps: {listed}")
        return analysis, steps[k - 1]
    c = change.lower()
    hits = [s for s in steps if s.after.commit.lower().startswith(c)] or [
        s for s in steps if s.before.commit.lower().startswith(c)
    ]
    if len(c) < 4 or not hits:
        raise HistoryError(f"series {series!r} has no step at commit {change!r}; its steps: {listed}")
    return analysis, hits[0]

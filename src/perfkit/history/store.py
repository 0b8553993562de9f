"""The history store: one row per case × metric × hardware × commit × time in parquet files
(``STORE/hw-<hardware slug>/<digest>.parquet``), and confirmations of change points beside them
(``STORE/confirmations/``). Layout and rules: docs/history.md ("Store")."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq

from perfkit.common import require_extra

log = logging.getLogger(__name__)

#: bump it when a column changes meaning
SCHEMA_VERSION = 1

_S, _F, _T = pa.string(), pa.float64(), pa.timestamp("us", tz="UTC")
#: column -> arrow type; every file has exactly these (meanings: docs/history.md, "Store")
COLUMNS: dict[str, pa.DataType] = {
    "schema_version": pa.int16(),
    **dict.fromkeys(["run_key", "source", "run_id", "hardware", "commit"], _S),
    "time": _T,
    **dict.fromkeys(["case_id", "metric", "unit"], _S),
    "value": _F,
    **dict.fromkeys(["error", "source_file", "provenance"], _S),
    "added_at": _T,
}
SCHEMA = pa.schema(COLUMNS)


class HistoryError(ValueError):
    """Bad input for the history: the message names the file and the key."""


@dataclass(frozen=True)
class Value:
    """One value of a run: ``value`` None is a gap (``error`` says why)."""

    case_id: str
    metric: str
    unit: str
    value: float | None
    error: str | None = None
    #: added to the run's provenance in this row (sglang: model, task)
    labels: dict[str, Any] | None = None


@dataclass
class HistoryRun:
    """One run to store: its values, one per case × metric."""

    source: str
    run_id: str
    hardware: str
    commit: str
    time: datetime
    values: list[Value]
    source_file: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """sha256 (24 hex chars) of source, hardware, run id, commit and UTC time."""
        t = utc(self.time).isoformat()
        text = "\x1f".join([self.source, self.hardware, str(self.run_id), self.commit, t])
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def finite_number(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (not a bool; an int below 1e300)."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) and abs(v) < 1e300 or isinstance(v, float) and math.isfinite(v)


def utc(t: datetime) -> datetime:
    """``t`` in UTC; a time without a timezone is read as UTC."""
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


@contextlib.contextmanager
def _locked(store: Path) -> Iterator[None]:
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_parquet(table: pa.Table, final: Path) -> Path:
    """Write ``table`` to ``final`` via a ``.NAME.<random>.tmp`` beside it and a rename. Returns ``final``."""
    tmp = final.with_name(f".{final.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the kernel applies the umask
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _files(store: Path, pattern: str = "hw-*/*.parquet") -> list[Path]:
    """Without dot files (temporary files; pathlib's ``*`` matches them)."""
    return sorted(f for f in store.glob(pattern) if not f.name.startswith("."))


def _check_files(files: Sequence[Path], columns: dict = COLUMNS, what: str = "history file") -> None:
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (pa.ArrowException, OSError) as exc:
            raise HistoryError(f"{f}: not a {what} (not parquet): {exc}") from None
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise HistoryError(f"{f}: not a {what}: missing column {missing[0]!r}")
        for name, want in columns.items():
            got = schema.field(name).type
            if not _same_kind(got, want):
                raise HistoryError(
                    f"{f}: column {name!r} is {got}, not {want} (a file rewritten by another tool?)"
                )


def _same_kind(got: pa.DataType, want: pa.DataType) -> bool:
    """``got`` reads as ``want`` without a change of meaning (a pandas rewrite)."""
    t = pa.types
    if t.is_string(want):
        return t.is_string(got) or t.is_large_string(got) or t.is_null(got)
    if t.is_timestamp(want):
        return t.is_timestamp(got) and got.tz is not None
    if t.is_floating(want) or t.is_integer(want):
        return t.is_floating(got) or t.is_integer(got) or t.is_null(got)
    return got == want


def stored_run_keys(store: str | Path) -> set[str]:
    """Keys of every run in ``store``. Raises HistoryError: a file that is not a history file."""
    files = _files(Path(store))
    if not files:
        return set()
    _check_files(files)
    require_extra("history", "the history store")
    import duckdb

    query = "SELECT DISTINCT run_key FROM read_parquet(?, union_by_name=true)"
    return {r[0] for r in duckdb.connect().execute(query, [[str(f) for f in files]]).fetchall()}


def _table(runs: Sequence[HistoryRun], added_at: datetime) -> pa.Table:
    rows = []
    for r in runs:
        prov = json.dumps(r.provenance, sort_keys=True, default=str)
        key, t = r.key, utc(r.time)
        memo: dict[int, str] = {}
        for v in r.values:
            row_prov = prov
            if v.labels:
                row_prov = memo.get(id(v.labels)) or memo.setdefault(
                    id(v.labels), json.dumps({**r.provenance, **v.labels}, sort_keys=True, default=str)
                )
            value = None if v.value is None else float(v.value)
            rows.append(
                (SCHEMA_VERSION, key, r.source, str(r.run_id), r.hardware, r.commit, t, v.case_id, v.metric)
                + (v.unit, value, v.error, r.source_file, row_prov, added_at)
            )
    cols = [list(c) for c in zip(*rows)] or [[] for _ in COLUMNS]
    return pa.table(dict(zip(COLUMNS, cols)), schema=SCHEMA)


@dataclass
class AddResult:
    """What :func:`add_runs` did: keys stored now, keys already there."""

    added: list[str]
    skipped: list[str]


def add_runs(store: str | Path, runs: Iterable[HistoryRun]) -> AddResult:
    """Store ``runs`` in ``store``, each run once, one new file per hardware. Raises HistoryError:
    a run without values, or a value not a finite number or None (names file, case, metric)."""
    store = Path(store)
    runs = list(runs)
    for r in runs:
        if not r.values:
            raise HistoryError(f"{r.source_file or r.run_id}: the run has no values")
        for v in r.values:
            if v.value is not None and not finite_number(v.value):
                raise HistoryError(f"{r.source_file}: {v.case_id}.{v.metric}: not a number: {v.value!r}")
    added: list[str] = []
    skipped: list[str] = []
    with _locked(store):
        known = stored_run_keys(store)
        fresh: dict[str, HistoryRun] = {}
        for r in runs:
            k = r.key
            if k in known or k in fresh:
                skipped.append(k)
            else:
                fresh[k] = r
        by_hw: dict[str, list[HistoryRun]] = {}
        for r in fresh.values():
            by_hw.setdefault(r.hardware, []).append(r)
        now = datetime.now(timezone.utc)
        for hw, group in sorted(by_hw.items()):
            keys = sorted(r.key for r in group)
            digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:20]
            d = store / ("hw-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", hw).strip("-") or "unknown"))
            d.mkdir(parents=True, exist_ok=True)
            write_parquet(_table(group, now), d / f"{digest}.parquet")
            added.extend(keys)
    log.info("history %s: %d run(s) added, %d already stored", store, len(added), len(skipped))
    return AddResult(added, skipped)


def runs_frame(runs: Sequence[HistoryRun]) -> pd.DataFrame:
    """``runs`` as :func:`read_store` would return them once stored."""
    return (
        _table(list(runs), datetime.now(timezone.utc))
        .to_pandas()
        .sort_values(["hardware", "case_id", "metric", "time", "run_key"], ignore_index=True)
    )


#: the columns the change point analysis reads (:func:`read_store` ``columns=``)
ANALYSIS_COLUMNS = tuple("hardware case_id metric unit run_key run_id commit time value error source".split())


def read_store(
    store: str | Path, *, hardware: str | None = None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Every row of ``store`` (one per run key, case, metric), sorted by hardware, case, metric,
    time. Raises HistoryError naming the file: not a history file, or a newer schema."""
    files = _files(Path(store))
    cols = list(columns or COLUMNS)
    if not files:
        return pd.DataFrame({k: pd.Series(dtype=object) for k in cols})
    _check_files(files)
    # pyarrow, not DuckDB: memory (docs/history.md)
    need = list(dict.fromkeys([*cols, "schema_version", "run_key", "case_id", "metric", "hardware", "time"]))
    tables = []
    for f in files:
        t = pq.read_table(f, columns=need)
        try:
            t = t.cast(pa.schema([SCHEMA.field(n) for n in t.column_names]))
        except pa.ArrowInvalid as exc:
            raise HistoryError(f"{f}: {exc}") from None
        newest = pa.compute.max(t["schema_version"]).as_py() or 0
        if newest > SCHEMA_VERSION:
            raise HistoryError(
                f"{f}: schema_version {newest} is newer than this perfkit reads ({SCHEMA_VERSION})"
            )
        if hardware is not None:
            t = t.filter(pa.compute.equal(t["hardware"], hardware))
        tables.append(t)
    df = pa.concat_tables(tables).to_pandas()
    df = df.drop_duplicates(["run_key", "case_id", "metric"], keep="first")  # files in name order
    df = df.sort_values(["hardware", "case_id", "metric", "time", "run_key"], kind="stable")
    return df[cols].reset_index(drop=True)


OUTCOMES = ("confirmed", "not reproduced", "undecided", "error")
CONFIRM_DIR = "confirmations"

#: a confirmation's column -> arrow type (docs/history.md, "Which commit?")
CONFIRM_COLUMNS: dict[str, pa.DataType] = {
    **dict.fromkeys(["hardware", "case_id", "metric", "before_commit", "after_commit", "step_kind"], _S),
    "step_ratio": _F,
    **dict.fromkeys(["outcome", "ab_metric", "ab_decision"], _S),
    **dict.fromkeys(["ratio", "low", "high"], _F),
    **dict.fromkeys(["launches", "detail", "out"], _S),
    "time": _T,
}
CONFIRM_SCHEMA = pa.schema(CONFIRM_COLUMNS)


def add_confirmation(store: str | Path, **row: Any) -> Path:
    """Store one confirmation (``row``: :data:`CONFIRM_COLUMNS`) and return its file. Raises
    ValueError: ``outcome`` not in :data:`OUTCOMES`."""
    if row["outcome"] not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {row['outcome']!r}")
    store = Path(store)
    cols = {k: [row[k]] for k in CONFIRM_COLUMNS}
    cols["launches"] = [json.dumps(row["launches"], sort_keys=True)]
    cols["time"] = [utc(row["time"])]
    for k in ("ratio", "low", "high", "step_ratio"):  # NaN: NULL
        cols[k] = [None if row[k] is None or row[k] != row[k] else float(row[k])]
    table = pa.table(cols, schema=CONFIRM_SCHEMA)
    names = ("hardware", "case_id", "metric", "before_commit", "after_commit")
    key = "\x1f".join([*(row[k] for k in names), row["time"].isoformat()])
    with _locked(store):
        d = store / CONFIRM_DIR
        d.mkdir(parents=True, exist_ok=True)
        return write_parquet(table, d / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.parquet")


def read_confirmations(store: str | Path) -> pd.DataFrame:
    """Every confirmation of ``store``, oldest first. Raises HistoryError: not a confirmation file."""
    files = _files(Path(store), f"{CONFIRM_DIR}/*.parquet")
    if not files:
        return pd.DataFrame({k: pd.Series(dtype=object) for k in CONFIRM_COLUMNS})
    _check_files(files, CONFIRM_COLUMNS, "confirmation file")
    tables = [pq.read_table(f, columns=list(CONFIRM_COLUMNS)) for f in files]
    return pa.concat_tables(tables).to_pandas().sort_values("time", kind="stable", ignore_index=True)

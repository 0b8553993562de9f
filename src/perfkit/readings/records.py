"""sglang's ``performance.log`` records (one JSON object a line): :class:`PerfRecord`, streamed
readers, and the strict value readers the perf dump shares. Rules: docs/sglang.md, "Readers"."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from perfkit.common import PERF_LOG_NAME
from perfkit.common.jsonsafe import unique_keys

log = logging.getLogger(__name__)


#: sglang's memory snapshot checkpoints.
SNAPSHOT_KEYS = ("load_peak", "warmup_peak", "runtime_peak")
#: a stage's time key: performance.log, perf dump (sglang ``runtime/utils/perf_logger.py``)
STAGE_TIME_KEYS = ("execution_time_ms", "duration_ms")


class RecordError(ValueError):
    """A record that cannot be read as written; the message names the file, line and key."""

    def __init__(self, key: str, problem: str, *, source: str | None = None, line: int | None = None) -> None:
        self.key, self.problem, self.source, self.line = key, problem, source, line
        self.request_id: str | None = None
        where = (line and (f"{source}:{line}" if source else f"line {line}")) or source
        super().__init__(f"{where + ': ' if where else ''}key {key!r}: {problem}")

    def located(self, source: str | None = None, line: int | None = None) -> "RecordError":
        """The same error with the file and/or line filled in."""
        return RecordError(self.key, self.problem, source=source or self.source, line=line or self.line)


#: the largest ms or MiB value read (issue 54): 1e9 ms is 11.6 days, 1e9 MiB a petabyte
MAX_READING = 1e9


def json_int(digits: str) -> int | float:
    """``parse_int`` for ``json.loads``: inf for 4,000+ digits, which :func:`read_number` refuses."""
    return int(digits) if len(digits) < 4000 else float("inf")


def short_repr(v: Any) -> str:
    """``repr(v)``, a long one cut to its first digits and its length."""
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:12]}… ({len(r)} digits)"


def read_number(value: Any, key: str, *, nullable: bool = True) -> float | None:
    """``value`` as a float, exactly as written; None for null (``nullable``). Raises
    :class:`RecordError` naming ``key`` for anything else (not a number, NaN, < 0, > MAX_READING)."""
    t = type(value)
    if (t is float or t is int) and 0 <= value <= MAX_READING:
        return float(value)
    if value is None:
        if nullable:
            return None
        raise RecordError(key, "is null, expected a number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(key, f"{value!r} ({type(value).__name__}) is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(key, f"{value!r} is not a finite number")
    if 0 <= value <= MAX_READING:  # numpy's float64
        return float(value)
    what = "is negative" if value < 0 else f"is above {MAX_READING:g} (no ms or MiB value is that large)"
    raise RecordError(key, f"{short_repr(value)} {what}")


def read_optional_str(obj: dict[str, Any], key: str) -> str | None:
    """``obj[key]``, a string or None; else :class:`RecordError` naming the key."""
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise RecordError(key, f"{v!r} ({type(v).__name__}) is not a string")
    return v


def read_stage_entry(st: Any, index: int, group: str = "stages") -> tuple[str, float | None]:
    """``{"name", "execution_time_ms" | "duration_ms"}`` -> (name, ms or None); RecordError."""
    where = f"{group}[{index}]"
    if not isinstance(st, dict):
        raise RecordError(where, f"{st!r} is not an object with name and execution_time_ms")
    name = st.get("name")
    if not isinstance(name, str):
        raise RecordError(f"{where}.name", f"{name!r} is not a stage name" if "name" in st else "is missing")
    present = [k for k in STAGE_TIME_KEYS if k in st]
    if not present:
        others = sorted(k for k in st if k not in ("name", "is_denoising"))
        raise RecordError(
            f"{where}.execution_time_ms",
            f"stage {name!r} has no time: expected execution_time_ms or duration_ms"
            + (f", found {', '.join(others)}" if others else ""),
        )
    if len(present) > 1:
        raise RecordError(
            f"{where}.duration_ms",
            f"stage {name!r} has both execution_time_ms and duration_ms: which one was measured is ambiguous",
        )
    key = present[0]
    return name, read_number(st[key], f"{where}.{key}")


def read_head(
    obj: Any, what: str, keys: Sequence[str], stages_key: str, missing: str = "is missing"
) -> tuple[str, list[tuple[str, float | None]]]:
    """(request_id, stages) of a record or perf dump holding ``keys``; RecordError naming the key."""
    if not isinstance(obj, dict):
        raise RecordError(f"<{what}>", f"is {type(obj).__name__}, expected a JSON object")
    for key in keys:
        if key not in obj:
            raise RecordError(key, missing)
    rid = obj["request_id"]
    if not isinstance(rid, str) or not rid:
        raise RecordError("request_id", f"{rid!r} is not a request id")
    if not isinstance(obj[stages_key], list):
        raise RecordError(stages_key, f"{obj[stages_key]!r} is not a list of stages")
    return rid, [read_stage_entry(st, i, group=stages_key) for i, st in enumerate(obj[stages_key])]


def read_step_list(steps: Any, key: str = "steps") -> list[float | None]:
    """Step ms: numbers, or ``{"step": i, "duration_ms": ms}`` (perf dump); RecordError."""
    if not isinstance(steps, list):
        raise RecordError(key, f"{steps!r} is not a list")
    out: list[float | None] = []
    for i, s in enumerate(steps):
        if isinstance(s, dict):
            if type(s.get("step")) is not int or s["step"] != i:
                why = f"{s['step']!r} is not the step index {i}" if "step" in s else "is missing"
                raise RecordError(f"{key}[{i}].step", why)
            if "duration_ms" not in s:
                extra = sorted(k for k in s if k != "step")
                raise RecordError(
                    f"{key}[{i}].duration_ms",
                    "is missing" + (f" (found {', '.join(extra)})" if extra else ""),
                )
            out.append(read_number(s["duration_ms"], f"{key}[{i}].duration_ms"))
        else:
            out.append(read_number(s, f"{key}[{i}]"))
    return out


def read_perfkit_block(pk: dict[str, Any]) -> None:
    """Check the ``perfkit`` block's keys perfkit reads; RecordError naming ``perfkit.<key>``."""
    n = read_number(pk.get("compiles"), "perfkit.compiles")
    if n is not None and n != int(n):
        raise RecordError("perfkit.compiles", f"{pk['compiles']!r} is not a whole number")
    for key in ("compile_ms", "host_rss_mib", "host_anon_mib"):
        read_number(pk.get(key), f"perfkit.{key}")
    hit = pk.get("recompile_limit_hit")
    if hit is not None and not isinstance(hit, bool):
        raise RecordError(
            "perfkit.recompile_limit_hit", f"{hit!r} ({type(hit).__name__}) is not true or false"
        )
    reasons = pk.get("recompile_reasons")
    if reasons is not None and (
        not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons)
    ):
        raise RecordError("perfkit.recompile_reasons", f"{reasons!r} is not a list of strings")
    phases = pk.get("compile_phases_ms")
    if phases is not None:
        if not isinstance(phases, dict):
            raise RecordError("perfkit.compile_phases_ms", f"{phases!r} is not an object of name -> ms")
        for name, ms in phases.items():
            read_number(ms, f"perfkit.compile_phases_ms.{name}", nullable=False)


def read_memory_map(obj: Any, key: str) -> dict[str, dict[str, float | None]]:
    """checkpoint -> {key: MiB or None}. Raises :class:`RecordError` naming the key."""
    if not isinstance(obj, dict):
        raise RecordError(key, f"{obj!r} is not an object")
    out: dict[str, dict[str, float | None]] = {}
    for cp, snap in obj.items():
        if not isinstance(snap, dict):
            raise RecordError(f"{key}.{cp}", f"{snap!r} is not an object")
        out[cp] = {k: read_number(v, f"{key}.{cp}.{k}") for k, v in snap.items()}
    return out


def sum_by_name(items: Iterable[tuple[str, float | None]]) -> dict[str, float | None]:
    """Name -> the sum of its ms, in first-seen order; None when any part was not measured."""
    out: dict[str, float | None] = {}
    for name, ms in items:
        if name in out:
            ms = None if out[name] is None or ms is None else out[name] + ms
        out[name] = ms
    return out


@dataclass
class PerfRecord:
    """One request's record (ms, MiB; fields: docs/sglang.md): ``perfkit`` the reference engine's
    extras ({} for sglang), ``raw`` the parsed object, ``line_no`` 1-based (0: built in memory)."""

    request_id: str
    timestamp: str | None = None
    commit_hash: str | None = None
    tag: str | None = None
    stages: list[tuple[str, float | None]] = field(default_factory=list)
    steps: list[float | None] = field(default_factory=list)
    total_duration_ms: float | None = None
    memory_snapshots: dict[str, dict[str, float | None]] = field(default_factory=dict)
    perfkit: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    line_no: int = 0

    @property
    def is_warmup(self) -> bool:
        """True for startup warmup runs (tag ``warmup``)."""
        return (self.tag or "").lower() == "warmup"

    def stage_ms(self) -> dict[str, float | None]:
        """Stage name -> ms (a repeated name sums; None when any part was not measured)."""
        return sum_by_name(self.stages)

    def peak_mb(self, checkpoint: str = "runtime_peak", key: str = "peak_reserved_mb") -> float | None:
        """A memory snapshot value (MiB), or None when not written."""
        val = (self.memory_snapshots.get(checkpoint) or {}).get(key)
        return float(val) if val is not None else None

    @classmethod
    def from_dict(cls, obj: dict[str, Any], line_no: int = 0) -> "PerfRecord":
        """From a parsed line (sglang's ``RequestPerfRecord``). Raises :class:`RecordError` naming
        the key (and ``line_no``) of the first value sglang would not write."""
        try:
            rid, stages = read_head(
                obj, "record", ("request_id", "stages", "steps", "total_duration_ms"), "stages"
            )
            steps = read_step_list(obj["steps"])
            snaps = obj.get("memory_snapshots")
            pk = obj.get("perfkit")
            if pk is not None and not isinstance(pk, dict):
                raise RecordError("perfkit", f"{pk!r} is not an object")
            if pk:
                read_perfkit_block(pk)
            strs = {k: read_optional_str(obj, k) for k in ("timestamp", "commit_hash", "tag")}
            total = read_number(obj["total_duration_ms"], "total_duration_ms")
            snapshots = read_memory_map(snaps, "memory_snapshots") if snaps is not None else {}
        except RecordError as exc:
            raise exc.located(line=line_no or None) from None
        return cls(
            request_id=rid,
            **strs,
            stages=stages,
            steps=steps,
            total_duration_ms=total,
            memory_snapshots=snapshots,
            perfkit=dict(pk or {}),
            raw=obj,
            line_no=line_no,
        )


@dataclass
class ParseReport:
    """Records, skipped lines (line number, reason), ``rejected``: request id -> reason."""

    records: list[PerfRecord]
    skipped: list[tuple[int, str]]
    rejected: dict[str, str] = field(default_factory=dict)


#: the reason prefix of a request failed because its record was refused (bundles, summary.md)
REFUSED = "performance.log record refused"


def _request_id_of(text: str) -> str | None:
    try:
        obj = json.loads(text, parse_int=json_int)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and rid else None


def load_json(text: str, what: str, bad_json: str, source: str | None = None) -> Any:
    """``text`` parsed (a key given twice refused). Raises :class:`RecordError` (key ``<json>``,
    naming ``source``; ``bad_json`` formatted with ``msg``, ``lineno``, ``colno``)."""
    try:
        return json.loads(text, parse_int=json_int, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        problem = bad_json.format(msg=exc.msg, lineno=exc.lineno, colno=exc.colno)
    except RecursionError:
        problem = f"nested too deeply to be {what}"
    except ValueError as exc:  # a key given twice
        problem = str(exc)
    raise RecordError("<json>", problem, source=source)


def iter_lines_report(
    lines: Iterable[str | bytes],
    *,
    source: str | None = None,
    strict: bool = False,
    partial_last: bool = True,
    keep_raw: bool = True,
) -> Iterator[PerfRecord | RecordError]:
    """A :class:`PerfRecord` or a :class:`RecordError` (file, line, key; ``strict``: raised) per
    line. ``partial_last``: an unterminated unparsable last line is skipped."""
    pending: tuple[int, str | bytes] | None = None
    for i, line in enumerate(lines, start=1):
        if pending is not None:
            yield from _one(*pending, source=source, strict=strict, last=False, keep_raw=keep_raw)
        pending = (i, line)
    if pending is not None:
        yield from _one(*pending, source=source, strict=strict, last=partial_last, keep_raw=keep_raw)


def _one(
    i: int, line: str | bytes, *, source: str | None, strict: bool, last: bool, keep_raw: bool
) -> Iterator[PerfRecord | RecordError]:
    unterminated = not line.endswith(b"\n" if isinstance(line, bytes) else "\n")
    try:
        text = (decode_text(line, "") if isinstance(line, bytes) else line).strip()
        bad = "not a whole JSON object ({msg} at column {colno})"
        obj = load_json(text, "a performance.log record", bad) if text else None
        rec = PerfRecord.from_dict(obj, line_no=i) if text else None
    except RecordError as exc:
        if last and unterminated and exc.key == "<json>":
            return
        err = exc.located(source=source, line=i)
        if exc.key == "<utf-8>":
            err.request_id = _request_id_of(line.decode("utf-8", errors="replace"))
        elif exc.key != "<json>":
            err.request_id = _request_id_of(text)
        if strict:
            raise err from None
        yield err
        return
    if rec is not None:
        if not keep_raw:
            rec.raw, rec.perfkit = {}, {}
        yield rec


def _collect(items: Iterable[PerfRecord | RecordError]) -> ParseReport:
    records: list[PerfRecord] = []
    skipped: list[tuple[int, str]] = []
    rejected: dict[str, str] = {}
    for it in items:
        if isinstance(it, PerfRecord):
            records.append(it)
            continue
        log.warning("performance.log record skipped: %s", it)
        skipped.append((it.line or 0, str(it)))
        if it.request_id:
            rejected[it.request_id] = f"{REFUSED}: {it}"
    return ParseReport(records, skipped, rejected)


def parse_lines(
    lines: Iterable[str | bytes], *, source: str | None = None, strict: bool = False
) -> ParseReport:
    """:func:`iter_lines_report` collected into a :class:`ParseReport`."""
    return _collect(iter_lines_report(lines, source=source, strict=strict))


def decode_text(raw: bytes, source: str) -> str:
    """``raw`` decoded as UTF-8, strictly; RecordError ``<utf-8>`` naming the file, line and byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecordError(
            "<utf-8>",
            f"invalid UTF-8 at byte {col} of the line ({raw[exc.start : exc.start + 4]!r})",
            source=source,
            line=line,
        ) from None


#: the longest performance.log line read (bytes; a record is a few KiB): refused beyond
MAX_LINE_BYTES = 64 * 2**20


def _binary_lines(p: Path) -> Iterator[bytes]:
    with open(p, "rb") as fh:
        n = 0
        while line := fh.readline(MAX_LINE_BYTES + 1):
            n += 1
            if len(line) > MAX_LINE_BYTES:
                raise RecordError("<line>", f"longer than {MAX_LINE_BYTES:,} bytes", source=str(p), line=n)
            yield line


def iter_perf_log(
    path: str | Path, *, strict: bool = False, keep_raw: bool = True, partial_last: bool = True
) -> Iterator[PerfRecord | RecordError]:
    """:func:`iter_lines_report` of a ``performance.log`` (or its directory); missing: nothing."""
    p = Path(path)
    if p.is_dir():
        p = p / PERF_LOG_NAME
    if not p.exists():
        return
    yield from iter_lines_report(
        _binary_lines(p), source=str(p), strict=strict, keep_raw=keep_raw, partial_last=partial_last
    )


def read_perf_log(path: str | Path, *, strict: bool = False) -> ParseReport:
    """:func:`iter_perf_log` collected; malformed lines logged and skipped (``strict``: raised)."""
    return _collect(iter_perf_log(path, strict=strict))


def lookup(path: str | Path, request_id: str) -> PerfRecord | RecordError | None:
    """The last line naming ``request_id``: its record or its :class:`RecordError`; else None."""
    found = [it for it in iter_perf_log(path) if it.request_id == request_id]
    return found[-1] if found else None

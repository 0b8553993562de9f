"""Per-request performance records in sglang's ``performance.log`` layout.

Layout (sglang diffusion server, ``SGLANG_DIFFUSION_STAGE_LOGGING=1`` and
``SGLANG_PERF_LOG_DIR=DIR``): one JSON object per line in ``DIR/performance.log``::

    {"request_id": str, "timestamp": str, "commit_hash": str|None, "tag": str,
     "stages": [{"name": "DenoisingStage", "execution_time_ms": 12.3}, ...],
     "steps": [ms, ...],                 # denoising steps, in order
     "total_duration_ms": float,
     "memory_snapshots": {"load_peak": {"allocated_mb", "reserved_mb",
                                        "peak_allocated_mb", "peak_reserved_mb"},
                          "warmup_peak": {...}, "runtime_peak": {...}}}

sglang 0.5.23 also writes ``is_denoising`` in each stage entry and ``peak_host_anon_mb`` in each
snapshot (kept in :attr:`PerfRecord.raw` / :attr:`PerfRecord.memory_snapshots`); it writes no line
for its startup warmup, and its ``tag`` is ``"pipeline_stage_metrics"``. Stage names are kept as
written; :mod:`perfkit.readings.stages` classes them (denoising, refinement, decoding, other).

The reference engine adds a ``perfkit`` object (see :class:`PerfRecord.perfkit`):
``latent_shape`` (list of int), ``latent_frames``, ``num_frames_requested``,
``num_frames_effective``, ``height``, ``width``, ``num_inference_steps``, ``compiles``,
``compile_ms``, ``recompile_reasons`` (list of str), ``recompile_limit_hit`` (bool),
``host_rss_mib``, ``host_anon_mib``, ``device``, ``placement``, ``stage_peak_allocated_mb``
and ``stage_peak_reserved_mb`` (stage -> MiB), ``stage_spans`` (list of {name, t_start,
t_end}, epoch seconds), ``t_start``/``t_end`` (epoch seconds), ``refinement_steps`` (ms),
``status`` and ``error``.

Unknown fields are kept in :attr:`PerfRecord.raw`; a malformed line is reported with its
line number and skipped, never raised.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from perfkit.common.recordformat import PERF_LOG_NAME

log = logging.getLogger(__name__)


#: sglang's memory snapshot checkpoints.
SNAPSHOT_KEYS = ("load_peak", "warmup_peak", "runtime_peak")


@dataclass
class PerfRecord:
    """One request's record.

    Attributes:
        request_id: the server's id for the request.
        tag: free-form tag; the reference engine writes ``"warmup"`` for startup warmup runs.
        stages: ordered list of (stage name, ms).
        steps: denoising step times in ms.
        total_duration_ms: server-side end-to-end ms.
        memory_snapshots: checkpoint -> {allocated_mb, reserved_mb, peak_allocated_mb,
            peak_reserved_mb} (MiB).
        perfkit: the reference engine's extras ({} for other engines).
        raw: the whole parsed JSON object, unknown fields included.
        line_no: 1-based line number in the file it came from (0 if built in memory).
    """

    request_id: str
    timestamp: str | None = None
    commit_hash: str | None = None
    tag: str | None = None
    stages: list[tuple[str, float]] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    total_duration_ms: float | None = None
    memory_snapshots: dict[str, dict[str, float]] = field(default_factory=dict)
    perfkit: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    line_no: int = 0

    @property
    def is_warmup(self) -> bool:
        """True for startup warmup runs (tag ``warmup``)."""
        return (self.tag or "").lower() == "warmup"

    def stage_ms(self) -> dict[str, float]:
        """Stage name -> ms (a repeated name sums)."""
        out: dict[str, float] = {}
        for name, ms in self.stages:
            out[name] = out.get(name, 0.0) + ms
        return out

    def peak_mb(self, checkpoint: str = "runtime_peak", key: str = "peak_reserved_mb") -> float | None:
        """A memory snapshot value in MiB, or None when the engine did not write it."""
        snap = self.memory_snapshots.get(checkpoint) or {}
        val = snap.get(key)
        return float(val) if val is not None else None

    @classmethod
    def from_dict(cls, obj: dict[str, Any], line_no: int = 0) -> "PerfRecord":
        """Build from a parsed JSON object.

        Raises:
            ValueError: when ``request_id`` is missing or ``stages``/``steps`` have the wrong shape.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"record is {type(obj).__name__}, expected a JSON object")
        rid = obj.get("request_id")
        if rid is None:
            raise ValueError("record has no request_id")
        stages_in = obj.get("stages") or []
        if not isinstance(stages_in, list):
            raise ValueError("stages is not a list")
        stages: list[tuple[str, float]] = []
        for st in stages_in:
            if not isinstance(st, dict) or "name" not in st:
                raise ValueError(f"stage entry {st!r} lacks a name")
            stages.append((str(st["name"]), float(st.get("execution_time_ms") or 0.0)))
        steps_in = obj.get("steps") or []
        if not isinstance(steps_in, list):
            raise ValueError("steps is not a list")
        total = obj.get("total_duration_ms")
        return cls(
            request_id=str(rid),
            timestamp=obj.get("timestamp"),
            commit_hash=obj.get("commit_hash"),
            tag=obj.get("tag"),
            stages=stages,
            steps=[float(s) for s in steps_in],
            total_duration_ms=float(total) if total is not None else None,
            memory_snapshots=dict(obj.get("memory_snapshots") or {}),
            perfkit=dict(obj.get("perfkit") or {}),
            raw=obj,
            line_no=line_no,
        )


@dataclass
class ParseReport:
    """Records read from a file plus the lines that were skipped (line number, reason)."""

    records: list[PerfRecord]
    skipped: list[tuple[int, str]]


def parse_lines(lines: list[str], partial_last: bool = True) -> ParseReport:
    """Parse performance.log lines.

    Args:
        lines: the file's lines (with or without newlines).
        partial_last: treat an unterminated, unparsable last line as still being written
            (skipped silently) rather than malformed.
    """
    records: list[PerfRecord] = []
    skipped: list[tuple[int, str]] = []
    for i, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            records.append(PerfRecord.from_dict(json.loads(text), line_no=i))
        except (json.JSONDecodeError, ValueError, TypeError) as exc:
            if partial_last and i == len(lines) and not line.endswith("\n"):
                continue
            log.warning("performance.log line %d skipped: %s", i, exc)
            skipped.append((i, str(exc)))
    return ParseReport(records, skipped)


def read_perf_log(path: str | Path) -> ParseReport:
    """Read a ``performance.log`` file (or a directory holding one).

    A missing file gives an empty report. Malformed lines are logged with their number and
    skipped.
    """
    p = Path(path)
    if p.is_dir():
        p = p / PERF_LOG_NAME
    if not p.exists():
        return ParseReport([], [])
    with open(p, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines(keepends=True)
    return parse_lines(lines)


def iter_records(path: str | Path) -> Iterator[PerfRecord]:
    """Iterate the well-formed records of a performance.log."""
    yield from read_perf_log(path).records


def find_record(path: str | Path, request_id: str) -> PerfRecord | None:
    """The last record with this request id, or None."""
    found = None
    for rec in iter_records(path):
        if rec.request_id == request_id:
            found = rec
    return found

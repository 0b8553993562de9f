"""What an executor reports for one unit of work (the contract between the planner and every
executor: in-process and Ray)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import Field, TypeAdapter

from perfkit.common import jsonsafe

#: a unit's record beside its bundles (every executor writes it: :func:`write_unit_file`)
UNIT_FILE = "unit.json"

#: ``(unit, out_dir) -> None``: measure one unit (a JSON-able dict with at least ``id``,
#: ``gpus``) and write its bundles under ``out_dir``; raise on failure.
RunUnit = Callable[[Mapping[str, Any], Path], None]

#: ``(event, unit id, outcome or None)``: "started", "launch" (one of its launches finished;
#: optional), "retry", "finished" (for progress bars).
OnEvent = Callable[[str, str, "UnitOutcome | None"], None]


class ExecutorError(ValueError):
    """An executor that cannot be used (unknown name, its module or package missing): exit 2."""


@dataclass
class UnitOutcome:
    """One unit's result as the driver sees it (a manifest's outcome checked by :data:`OUTCOME`:
    numbers strict, a string ``"164.26"`` or ``true`` is a mistyped key, not a time, and finite).

    Attributes:
        unit_id: the unit's id (stable across shards and executors).
        status: "ok" or "error" (an error after the last attempt).
        out_dir: where the unit's bundles landed on the driver (None when nothing came back).
        wall_s: seconds from the last attempt's start to its end, on the worker.
        attempts: attempts made (1 + retries used).
        error: why the last attempt failed (None when ok).
        log_tail: the end of the failed attempt's logs (engine stderr, traceback).
        host: the worker's host name.
        gpu_uuids: the GPUs the unit ran on, by NVML UUID (empty on CPU).
        started_at, ended_at: epoch seconds of the last attempt (to tell which units overlapped).
    """

    unit_id: Annotated[str, Field(min_length=1)]
    status: Literal["ok", "error"]
    out_dir: Path | None = None
    wall_s: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] | None = None
    attempts: Annotated[int, Field(strict=True, ge=1)] = 1
    error: str | None = None
    log_tail: str | None = None
    host: str | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    started_at: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None
    ended_at: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``out_dir`` as a string)."""
        d = asdict(self)
        d["out_dir"] = str(self.out_dir) if self.out_dir is not None else None
        return d


OUTCOME = TypeAdapter(UnitOutcome)


def newest_log_tail(d: Path, chars: int = 4000) -> str:
    """The end of the newest ``*.log`` under ``d`` (an engine's stdout/stderr) under a header, or ""."""
    try:
        logs = sorted((p for p in d.rglob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
        if not logs:
            return ""
        return f"\n--- {logs[-1].relative_to(d)} (end) ---\n" + logs[-1].read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def write_unit_file(out_dir: Path, unit: Mapping[str, Any], outcome: UnitOutcome) -> None:
    """``out_dir/unit.json``: the unit (its dict) and its outcome."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"unit": dict(unit), "outcome": outcome.to_dict()}
    (out_dir / UNIT_FILE).write_text(jsonsafe.dumps(doc, indent=2, default=str) + "\n")

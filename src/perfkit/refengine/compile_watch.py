"""Counting torch.compile compilations per request, with recompilation reasons, the recompile
limit hit and torch's per-phase compile times (:class:`CompileWatch`, :class:`CompileWindow`;
sources: docs/refengine.md, "Compilations").
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class CompileWindow:
    """What compiled inside one window (a request): compilations started, their wall time (ms),
    the failed guard lines, whether (and in which stage) the recompile limit was hit, the same
    per stage (``by_stage``), and ``phases_ms``: torch's ``dynamo_timed`` name -> ms inside the
    window (names nest; None when this torch has no ``compilation_time_metrics``)."""

    compiles: int = 0
    compile_ms: float = 0.0
    reasons: list[str] = field(default_factory=list)
    limit_hit: bool = False
    limit_stage: str | None = None
    by_stage: dict[str, dict] = field(default_factory=dict)
    phases_ms: dict[str, float] | None = None

    def _stage_entry(self, stage: str | None) -> dict:
        return self.by_stage.setdefault(
            stage or "outside a stage", {"compiles": 0, "compile_ms": 0.0, "reasons": []}
        )


class _Handler(logging.Handler):
    def __init__(self, watch: "CompileWatch"):
        super().__init__(level=logging.DEBUG)
        self.watch = watch
        self._last: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # attached to a logger and its parent: a propagated record arrives twice
        if record is self._last:
            return
        self._last = record
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            return
        self.watch._on_log(record.name, msg)


class CompileWatch:
    """Process-wide observer of dynamo compilations; open a window per request."""

    def __init__(self) -> None:
        import torch
        import torch._dynamo  # noqa: F401

        self._lock = threading.Lock()
        self._starts: dict[str, float] = {}
        self._current: CompileWindow | None = None
        #: len of each of torch's compile timers when the window began (None: torch has none)
        self._phase_marks: dict[str, int] | None = None
        self._seen_reasons: set[tuple[str, str]] = set()
        #: the pipeline stage running now (set by the pipeline around each stage)
        self.stage: str | None = None
        handler = torch._dynamo.callback.callback_handler
        handler.register_start_callback(self._on_start)
        handler.register_end_callback(self._on_end)
        torch._logging.set_logs(recompiles=True)
        h = _Handler(self)
        for name in ("torch._dynamo.guards", "torch._dynamo.convert_frame", "torch._dynamo"):
            logging.getLogger(name).addHandler(h)

    def _cid(self, args) -> str:
        try:
            return str(args[0].compile_id)
        except Exception:  # noqa: BLE001
            return "?"

    def _on_start(self, *args, **kwargs) -> None:
        with self._lock:
            self._starts[self._cid(args)] = time.perf_counter()
            if self._current is not None:
                self._current.compiles += 1
                self._current._stage_entry(self.stage)["compiles"] += 1

    def _on_end(self, *args, **kwargs) -> None:
        with self._lock:
            t0 = self._starts.pop(self._cid(args), None)
            if t0 is not None and self._current is not None:
                ms = (time.perf_counter() - t0) * 1000.0
                self._current.compile_ms += ms
                self._current._stage_entry(self.stage)["compile_ms"] += ms

    def _on_log(self, name: str, msg: str) -> None:
        with self._lock:
            w = self._current
            if w is None:
                return
            if "recompile_limit" in msg or "cache_size_limit" in msg:
                w.limit_hit = True
                w.limit_stage = w.limit_stage or self.stage
                reason = msg.strip().splitlines()[0]
            elif "Recompiling function" in msg and (name, msg) not in self._seen_reasons:
                self._seen_reasons.add((name, msg))
                lines = [ln.strip() for ln in msg.splitlines()]
                guards = [ln.lstrip("- ").strip() for ln in lines if ln.startswith("- ")]
                # only the newest guard failure is informative (older ones repeat)
                reason = guards[0] if guards else lines[0]
            else:
                return
            w.reasons.append(reason[:300])
            w._stage_entry(self.stage)["reasons"].append(reason[:300])

    def begin(self) -> CompileWindow:
        """Start a window; returns it (filled in as compilations happen)."""
        with self._lock:
            self._seen_reasons.clear()
            self._current = CompileWindow()
            metrics = _time_metrics()
            self._phase_marks = None if metrics is None else {k: len(v) for k, v in metrics.items()}
            return self._current

    def end(self) -> CompileWindow:
        """Close the current window and return it."""
        with self._lock:
            w = self._current or CompileWindow()
            self._current = None
            metrics, marks = _time_metrics(), self._phase_marks
            if metrics is not None and marks is not None:
                w.phases_ms = {
                    k: round(sum(v[marks.get(k, 0) :]) * 1000.0, 3)
                    for k, v in metrics.items()
                    if len(v) > marks.get(k, 0)
                }
            return w


def _time_metrics() -> dict[str, list[float]] | None:
    """torch's compile timers (``torch._dynamo.utils.compilation_time_metrics``: name -> seconds
    of each timed call), or None where this torch has none."""
    try:
        from torch._dynamo import utils
    except ImportError:
        return None
    m = getattr(utils, "compilation_time_metrics", None)
    return m if isinstance(m, dict) else None

"""How :class:`~perfkit.refengine.pipeline.StagedPipeline` times its stages and steps, and the
test-only injected slowdown (``--debug-stage-delay``): :class:`StageTimer`, the pipeline's base.

On CUDA, stage and step boundaries are events on the current stream, resolved once after the
request (:meth:`StageTimer._resolve`); with ``sync`` timing, or on a CPU device, the device is
synchronised and the host clock read. The injected slowdown stretches a piece of work by a
fraction of itself: busy compute on a CPU device, a calibrated spin kernel on CUDA
(:meth:`StageTimer._inject`). Times in ms, memory in MiB.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from perfkit.refengine.profiling import INJECTED_RANGE, RequestProfiler, maybe_range, maybe_stage
from perfkit.refengine.request import RunResult, StageResult

MIB = 2**20


class StageTimer:
    """Stage and step timing and the injected slowdown for a pipeline on one device. The
    subclass sets the attributes annotated below before a request runs (``_slow``: stage ->
    fraction to inject this run; ``_run``: the running request's result)."""

    device: torch.device
    is_cuda: bool
    watch: Any
    profiler: RequestProfiler | None
    _slow: dict[str, float]
    _run: RunResult
    _pending: list
    _pending_steps: list
    _request_event: Any
    _inj_pieces: list
    _inj_est: dict[str, float]
    _sleep_cpms: float | None

    def _sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def _clock(self) -> float:
        """The clock that measures a piece of work for the injected slowdown (s): wall time on an
        accelerator (the device does the work; the host only waits), this thread's CPU time on a
        CPU device (the work is this thread's; time the OS gives other processes on a shared
        host is not work, and sizing by wall time would inflate the slowdown under contention)."""
        return time.perf_counter() if self.is_cuda else time.thread_time()

    def _busy(self, seconds: float) -> None:
        """Test-only injected slowdown on a CPU device: busy compute for ``seconds`` of
        :meth:`_clock` (small matmuls until this thread's CPU time has moved that far)."""
        if seconds <= 0:
            return
        a = torch.randn(64, 64, device=self.device)
        end = self._clock() + seconds
        while self._clock() < end:  # ~20 µs a turn on a CPU core: overshoot stays small
            a = torch.tanh(a @ a)

    def _mark(self) -> Any:
        """Start of a piece of work the injected slowdown is sized by: an event on the current
        stream on CUDA (no sync), else :meth:`_clock`."""
        return self._event() if self.is_cuda else self._clock()

    def _cycles_per_ms(self) -> float:
        """GPU clock cycles per ms of ``torch.cuda._sleep`` (its spin kernel), measured once per
        process with events (two syncs, on the first slowed request)."""
        if self._sleep_cpms is None:
            for _ in range(2):  # the first run pays the kernel's first launch
                self._sync()
                a = self._event()
                torch.cuda._sleep(10_000_000)
                b = self._event()
                b.synchronize()
                self._sleep_cpms = 10_000_000 / max(a.elapsed_time(b), 1e-3)
        return self._sleep_cpms

    def _inject(self, frac: float, mark: Any, stage: str) -> None:
        """Stretch the work since ``mark`` (:meth:`_mark`) by ``frac``.

        CPU: busy compute for ``frac`` × the thread CPU time since ``mark``. CUDA, without a
        host sync (a sync per denoising step would itself cost several % by stopping the CPU
        from queueing ahead, which is what sizing by a synced clock did, so a 2 % request came
        out near +10 % on an H200): the piece's device time is estimated from the newest piece
        of the same stage whose events have completed (``Event.query``; one sync on a stage's
        first slowed piece in the process), and ``frac`` × that is enqueued as a spin kernel
        (``torch.cuda._sleep``, calibrated in cycles per ms). The exact work and busy ms are
        read from the events after the request (:meth:`_account_injected`).
        """
        if frac <= 0:
            return
        if not self.is_cuda:
            c1 = self._clock()
            w1 = time.perf_counter()
            with maybe_range(self.profiler, INJECTED_RANGE):
                self._busy(frac * (c1 - mark))
            acc = self._run.injected.setdefault(stage, [0.0, 0.0])
            acc[0] += (c1 - mark) * 1000.0
            acc[1] += (self._clock() - c1) * 1000.0
            wall = self._run.injected_wall
            wall[stage] = wall.get(stage, 0.0) + (time.perf_counter() - w1) * 1000.0
            return
        e1 = self._event()
        done = (a.elapsed_time(b) for st, a, b, *_ in reversed(self._inj_pieces) if st == stage and b.query())
        est = next(done, self._inj_est.get(stage))
        if est is None:
            e1.synchronize()
            est = mark.elapsed_time(e1)
        self._inj_est[stage] = est
        cycles = int(frac * est * self._cycles_per_ms())
        b0 = self._event()
        if cycles > 0:
            with maybe_range(self.profiler, INJECTED_RANGE):
                torch.cuda._sleep(cycles)
        self._inj_pieces.append((stage, mark, e1, b0, self._event()))

    def _account_injected(self, out: RunResult) -> None:
        """After the request's final sync: the work and busy ms of every CUDA-injected piece, from
        its events, into ``out.injected[stage]`` as [work, busy]."""
        pieces, self._inj_pieces = self._inj_pieces, []
        for st, a, b, b0, b1 in pieces:
            acc = out.injected.setdefault(st, [0.0, 0.0])
            acc[0] += a.elapsed_time(b)
            acc[1] += b0.elapsed_time(b1)

    def _event(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @contextmanager
    def _stage(self, name: str, out: RunResult, timing: bool | str) -> Iterator[None]:
        """Time one stage. ``timing`` "events" on CUDA: an event on the current stream at each
        boundary, resolved by :meth:`_resolve` after the request (the CPU keeps queueing the next
        stage, as in production); "sync": synchronise at both boundaries and read the host clock;
        falsy: no timing (one sync at the end of the request). Peak memory per stage comes from
        the caching allocator's host-side statistics, which need no sync."""
        if self.watch is not None:
            self.watch.stage = name
        events = timing == "events" and self.is_cuda
        if timing:
            if not events:
                self._sync()
            if self.is_cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        mark = self._mark() if self._slow.get(name, 0.0) > 0 else None
        w0 = time.time()
        e0 = self._event() if events else None
        try:
            with maybe_stage(self.profiler, name):
                yield
                # a stage with denoising steps has its slowdown injected per step (step times scale too)
                if name not in ("DenoisingStage", "RefinementStage"):
                    self._inject(self._slow.get(name, 0.0), mark, name)
            if timing and not events:
                self._sync()
        finally:
            if self.watch is not None:
                self.watch.stage = None
        ms = (time.perf_counter() - t0) * 1000.0
        res = StageResult(name, ms, w0, time.time())
        if timing and self.is_cuda:
            res.peak_allocated_mb = torch.cuda.max_memory_allocated(self.device) / MIB
            res.peak_reserved_mb = torch.cuda.max_memory_reserved(self.device) / MIB
        if events:
            self._pending.append((res, e0, self._event()))
        out.stages.append(res)

    def _resolve(self, out: RunResult) -> None:
        """Fill event-timed stages and steps once the request's work is done (one sync)."""
        pending, self._pending = self._pending, []
        steps, self._pending_steps = self._pending_steps, []
        if not pending and not steps:
            return
        self._sync()
        origin = self._request_event
        for res, e0, e1 in pending:
            res.ms = e0.elapsed_time(e1)
            if origin is not None:  # wall times on the device's timeline, from the request start
                res.t_start = out.t_start + origin.elapsed_time(e0) / 1000.0
                res.t_end = out.t_start + origin.elapsed_time(e1) / 1000.0
        for target, events in steps:
            target.extend(a.elapsed_time(b) for a, b in zip(events, events[1:]))

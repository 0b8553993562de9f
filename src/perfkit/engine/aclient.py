"""Async client for sglang's video API with a bound on requests in flight.

:class:`AsyncVideoClient` speaks the same protocol as :class:`perfkit.engine.client.VideoClient`
(``POST /v1/videos``, then poll ``GET /v1/videos/{id}``) on one ``httpx.AsyncClient``; an
``asyncio.Semaphore`` holds the requests in flight to ``max_in_flight`` (sglang's
``bench_serving --max-concurrency``). Scheduling is asyncio's: a closed loop is ``k`` tasks that
each send their next request when the last one ended; an open loop is one task per arrival
that sleeps until its arrival time (:func:`closed_loop`, :func:`open_loop`).

Each outcome carries the client's clock (submit and end, epoch seconds) and, when the engine's
job JSON says so, the engine's: ``perfkit_times`` (the reference engine: submitted, started,
completed, epoch seconds). sglang's job JSON carries ``created_at`` and ``completed_at`` (whole
seconds) and no start: :attr:`AsyncOutcome.engine_started` is then None ("not reported"),
never 0; its own fields are in :attr:`AsyncOutcome.job` (whole-second ``completed_at_s``,
``inference_time_s``, ``peak_memory_mib``: null on a CPU).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from perfkit.engine.client import TERMINAL, JobFields, VideoRequestSpec, _error_text, job_fields

if TYPE_CHECKING:  # annotations only: httpx is imported where a request is sent
    import httpx

log = logging.getLogger(__name__)

__all__ = ["AsyncOutcome", "AsyncVideoClient", "closed_loop", "open_loop"]

#: how often (s) a client given ``alive`` checks the engine during an HTTP call
ALIVE_EVERY_S = 0.1


class _Lost(Exception):
    """The engine's process ended during an HTTP call."""


@dataclass
class AsyncOutcome:
    """One request sent by :class:`AsyncVideoClient`.

    Attributes:
        slot: the caller's index of the request (arrival order in an open loop).
        request_id: server id ('' when the submit failed).
        status: ``completed``, ``failed``, ``rejected``, ``timeout`` or ``error``.
        t_submit, t_end: client clock, epoch seconds (submit sent; terminal status seen).
        t_arrival: when the request was due (open loop), epoch seconds; None in a closed loop.
        engine_submitted, engine_started, engine_completed: the engine's job clock, epoch
            seconds, from the job JSON's ``perfkit_times``; None where the engine does not
            report it (sglang: no start time).
        error: the server's or the transport's message.
        in_flight_at_submit: requests of this client in flight when this one was submitted.
    """

    slot: int
    request_id: str
    status: str
    t_submit: float
    t_end: float
    t_arrival: float | None = None
    engine_submitted: float | None = None
    engine_started: float | None = None
    engine_completed: float | None = None
    error: str | None = None
    in_flight_at_submit: int = 0
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def job(self) -> JobFields:
        """The last job JSON's own fields (:func:`perfkit.engine.client.job_fields`: sglang's
        ``completed_at`` in whole seconds, ``inference_time_s``, ``peak_memory_mb``)."""
        return job_fields(self.body)

    @property
    def client_ms(self) -> float:
        """Submit to terminal status as the client saw it (ms)."""
        return (self.t_end - self.t_submit) * 1000.0


def _engine_times(body: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(submitted, started, completed) epoch seconds from a job JSON's ``perfkit_times``;
    None for each the engine does not report. A value that is not a number is None with a
    warning (never 0)."""
    pt = body.get("perfkit_times")
    if not isinstance(pt, dict):
        return None, None, None
    out = []
    for key in ("submitted", "started", "completed"):
        v = pt.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            log.warning("job %s: perfkit_times.%s = %r is not epoch seconds", body.get("id"), key, v)
            v = None
        out.append(float(v) if v is not None else None)
    return out[0], out[1], out[2]


def _json_object(resp: httpx.Response) -> dict[str, Any] | None:
    """The answer's JSON object; None when it is not JSON or not an object."""
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class AsyncVideoClient:
    """Async client for one engine, at most ``max_in_flight`` requests in flight.

    Args:
        base_url: e.g. ``http://127.0.0.1:30000``.
        max_in_flight: the bound (>= 1) on requests submitted and not yet terminal.
        timeout_s: per request, submit to terminal status (no HTTP call waits past it).
        poll_s: polling interval of ``GET /v1/videos/{id}`` (s) while the job runs; a job the
            engine reports ``queued`` is polled every 10 x ``poll_s``.
        alive: says whether the engine's process still runs (e.g.
            :meth:`perfkit.engine.handle.EngineHandle.alive`); checked every
            :data:`ALIVE_EVERY_S` during each HTTP call: once it is False, each request in
            flight ends at once (``error``, "lost the engine ...") and no later one is sent
            (``error``, "not sent: ..."), never one timeout a request.

    Use as ``async with AsyncVideoClient(url, 4) as c: out = await c.generate(spec, slot=0)``.

    Raises:
        ValueError: ``max_in_flight`` < 1.
    """

    def __init__(
        self,
        base_url: str,
        max_in_flight: int,
        timeout_s: float = 600.0,
        poll_s: float = 0.02,
        alive: Callable[[], bool] | None = None,
    ):
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.base_url = base_url.rstrip("/")
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.in_flight = 0
        self.alive = alive
        self.lost = False  # the engine was seen dead: nothing more is sent
        self._sem = asyncio.Semaphore(max_in_flight)
        limits = httpx.Limits(max_connections=max_in_flight + 2, max_keepalive_connections=max_in_flight + 2)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(30.0, connect=5.0), limits=limits
        )

    async def __aenter__(self) -> "AsyncVideoClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.aclose()

    def _dead(self) -> bool:
        if not self.lost and self.alive is not None and not self.alive():
            self.lost = True
        return self.lost

    async def _call(self, coro: Any) -> Any:
        """Await an HTTP call; raise :class:`_Lost` as soon as the engine is seen dead."""
        if self.alive is None:
            return await coro
        task = asyncio.ensure_future(coro)
        while not task.done():
            await asyncio.wait([task], timeout=ALIVE_EVERY_S)
            if not task.done() and self._dead():
                task.cancel()
                raise _Lost
        return task.result()

    async def generate(
        self, spec: VideoRequestSpec, slot: int = 0, t_arrival: float | None = None
    ) -> AsyncOutcome:
        """Wait for a free slot, submit, poll to a terminal status. Never raises for server-side
        failures or a lost engine: they come back as the outcome's status and error."""
        async with self._sem:
            self.in_flight += 1
            try:
                return await self._generate(spec, slot, t_arrival, self.in_flight - 1)
            finally:
                self.in_flight -= 1

    async def _generate(
        self, spec: VideoRequestSpec, slot: int, t_arrival: float | None, others: int
    ) -> AsyncOutcome:
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        t_submit = time.time()
        deadline = time.perf_counter() + self.timeout_s

        def done(
            rid: str, status: str, error: str | None, body: dict[str, Any] | None = None
        ) -> AsyncOutcome:
            sub, start, comp = _engine_times(body or {})
            return AsyncOutcome(
                slot,
                rid,
                status,
                t_submit,
                time.time(),
                t_arrival,
                sub,
                start,
                comp,
                error,
                others,
                body or {},
            )

        def left() -> httpx.Timeout:
            s = max(0.2, deadline - time.perf_counter())
            return httpx.Timeout(min(30.0, s), connect=min(5.0, s))

        if self._dead():
            return done("", "error", "not sent: the engine was gone")
        try:
            resp = await self._call(self.http.post("/v1/videos", json=spec.payload(), timeout=left()))
        except _Lost:
            return done("", "error", "lost the engine while submitting")
        except httpx.HTTPError as exc:
            if self._dead():
                return done("", "error", f"lost the engine while submitting: {type(exc).__name__}")
            return done("", "error", f"submit failed: {type(exc).__name__}: {exc}")
        if resp.status_code >= 400:
            return done("", "rejected", _error_text(resp))
        body = _json_object(resp)
        if body is None:
            return done("", "error", f"submit answer is not a JSON object: {resp.text[:200]!r}")
        rid = str(body.get("id") or body.get("request_id") or "")
        status = body.get("status", "queued")
        while status not in TERMINAL:
            if time.perf_counter() > deadline:
                return done(rid, "timeout", f"request {rid} not finished after {self.timeout_s:g} s", body)
            # a queued job cannot end before it starts: poll it 10x less often, so that k requests
            # in flight cost the engine about one fast poller, not k
            await asyncio.sleep(self.poll_s * (10 if status == "queued" else 1))
            try:
                r = await self._call(self.http.get(f"/v1/videos/{rid}", timeout=left()))
            except _Lost:
                return done(rid, "error", f"lost the engine while polling {rid}", body)
            except httpx.TimeoutException:
                continue
            except httpx.HTTPError as exc:
                return done(rid, "error", f"lost the engine while polling {rid}: {type(exc).__name__}", body)
            if r.status_code >= 400:
                return done(rid, "error", _error_text(r), body)
            answer = _json_object(r)
            if answer is None:
                return done(rid, "error", f"job {rid}: answer is not a JSON object: {r.text[:200]!r}", body)
            body = answer
            status = body.get("status", status)
        err = body.get("error") if status != "completed" else None
        if isinstance(err, dict):
            err = err.get("message") or str(err)
        return done(rid, "completed" if status == "completed" else "failed", err, body)


async def closed_loop(
    client: AsyncVideoClient, requests: Sequence[VideoRequestSpec], concurrency: int
) -> list[AsyncOutcome]:
    """``concurrency`` workers, each sending its next request as soon as its last one ended
    (sglang bench_serving's ``--max-concurrency`` with every request due at once), until
    ``requests`` are all sent. Returns the outcomes in request order."""
    pending = list(enumerate(requests))
    out: list[AsyncOutcome | None] = [None] * len(pending)

    async def worker() -> None:
        while pending:
            i, spec = pending.pop(0)
            out[i] = await client.generate(spec, slot=i)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [o for o in out if o is not None]


async def open_loop(
    client: AsyncVideoClient,
    requests: Sequence[VideoRequestSpec],
    arrivals_s: Sequence[float],
) -> list[AsyncOutcome]:
    """Send request i at ``arrivals_s[i]`` seconds after the start (e.g. Poisson arrivals),
    whatever is still in flight (up to the client's bound). Returns outcomes in arrival order,
    each with its due time ``t_arrival`` (epoch seconds)."""
    t0 = time.time()

    async def one(i: int, spec: VideoRequestSpec, at: float) -> AsyncOutcome:
        await asyncio.sleep(max(0.0, t0 + at - time.time()))
        return await client.generate(spec, slot=i, t_arrival=t0 + at)

    return list(await asyncio.gather(*(one(i, s, a) for i, (s, a) in enumerate(zip(requests, arrivals_s)))))

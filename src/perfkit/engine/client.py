"""The client of sglang's video API (``POST /v1/videos``, then poll ``GET /v1/videos/{id}``):
:class:`AsyncVideoClient`, :class:`VideoClient` (its synchronous face on a loop thread of its own,
so it runs in a Jupyter kernel too), :func:`closed_loop`, :func:`open_loop`. docs/robustness.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from perfkit.readings.records import PerfRecord, RecordError, lookup

if TYPE_CHECKING:  # annotations only: httpx is imported where a request is sent
    import httpx

log = logging.getLogger(__name__)

TERMINAL = ("completed", "failed", "error", "cancelled")
#: polls in a row that may lose their connection before the engine counts as lost (a GET is repeated)
POLL_RETRIES = 3
#: how often (s) a client given ``alive`` checks the engine during an HTTP call
ALIVE_EVERY_S = 0.1
#: how long (s) ``GET /health`` may take after a request timed out before the engine counts as lost
HEALTH_AFTER_TIMEOUT_S = 5.0


@dataclass
class VideoRequestSpec:
    """A request's fields (sglang's /v1/videos names)."""

    prompt: str = "a cat walks on the beach at sunset, cinematic"
    num_frames: int | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    seed: int = 0
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    fps: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """The request's JSON body: the fields that are set, then ``extra``."""
        return {**{k: v for k, v in self.__dict__.items() if k != "extra" and v is not None}, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VideoRequestSpec":
        """From a params mapping; unknown keys go to ``extra``."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "extra"}
        extra = {k: v for k, v in d.items() if k not in cls.__dataclass_fields__}
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class JobFields:
    """What a job JSON says of the job (None: not in it). sglang 0.5.23 (``video_api.py``) writes
    whole epoch seconds and no start time (started_at_s: the reference engine's ``perfkit_times``)."""

    created_at_s: int | None = None
    completed_at_s: int | None = None
    inference_time_s: float | None = None
    peak_memory_mib: float | None = None
    started_at_s: float | None = None


def _job_number(body: dict[str, Any], key: str, *path: str) -> float | None:
    """``body[key][path...]`` as a finite number >= 0, else None (a bad value logged)."""
    v: Any = body.get(key)
    for p in path:
        v = v.get(p) if isinstance(v, dict) else None
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < float("inf")
    if not ok:
        log.warning("job %s: %s = %r is not a finite number >= 0", body.get("id"), ".".join((key, *path)), v)
        return None
    return v


def job_fields(body: dict[str, Any]) -> JobFields:
    """The job JSON's own fields, each as written or None."""
    created, completed = (_job_number(body, k) for k in ("created_at", "completed_at"))
    return JobFields(
        created_at_s=None if created is None else int(created),
        completed_at_s=None if completed is None else int(completed),
        inference_time_s=_job_number(body, "inference_time_s"),
        peak_memory_mib=_job_number(body, "peak_memory_mb"),
        started_at_s=_job_number(body, "perfkit_times", "started"),
    )


@dataclass
class RequestOutcome:
    """What happened to one request, client side (epoch s). status: ``completed``, ``failed``,
    ``rejected`` (4xx on submit), ``timeout`` or ``error`` (the engine lost); request_id '' when the
    submit failed; http_status 0: no answer; t_arrival: when due (open loop)."""

    request_id: str
    status: str
    t_submit: float
    t_end: float
    http_status: int = 0
    error: str | None = None
    body: dict[str, Any] = field(default_factory=dict)
    record: PerfRecord | None = None
    slot: int = 0
    t_arrival: float | None = None
    in_flight_at_submit: int = 0

    @property
    def ok(self) -> bool:
        """True when the job completed."""
        return self.status == "completed"

    @property
    def job(self) -> JobFields:
        """The last job JSON's own fields (:func:`job_fields`)."""
        return job_fields(self.body)

    @property
    def client_ms(self) -> float:
        """Submit to terminal status, ms."""
        return (self.t_end - self.t_submit) * 1000.0


class _Lost(Exception):
    """The engine's process ended during an HTTP call."""


def _json_object(resp: httpx.Response) -> dict[str, Any] | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class AsyncVideoClient:
    """Async client for one engine, at most ``max_in_flight`` (>= 1, else ValueError) requests
    in flight (sglang bench_serving's ``--max-concurrency``); a ``queued`` job is polled every
    ``queued_every`` x ``poll_s`` (docs/load.md). ``alive``: once False, requests end at once
    (``error``) and none is sent; a timeout is then followed by ``GET /health`` (docs/robustness.md).
    """

    def __init__(
        self,
        base_url: str,
        max_in_flight: int = 1,
        timeout_s: float = 600.0,
        poll_s: float = 0.02,
        alive: Callable[[], bool] | None = None,
        queued_every: int = 10,
    ):
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.queued_every = queued_every
        self.in_flight = 0
        self.alive = alive
        self.lost = False  # the engine was seen dead: nothing more is sent
        self.lost_why: str | None = None
        self._sem = asyncio.Semaphore(max_in_flight)
        limits = httpx.Limits(max_connections=max_in_flight + 2, max_keepalive_connections=max_in_flight + 2)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(30.0, connect=5.0), limits=limits
        )

    async def __aenter__(self) -> "AsyncVideoClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.aclose()

    async def health(self, timeout_s: float | None = None) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout_s`` (default 30 s)."""
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        kw = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            return (await self.http.get("/health", **kw)).status_code == 200
        except httpx.HTTPError:
            return False

    def _why(self) -> str:
        return f": {self.lost_why}" if self.lost_why else ""

    def _dead(self) -> bool:
        if not self.lost and self.alive is not None and not self.alive():
            self.lost = True
        return self.lost

    async def _call(self, coro: Any) -> Any:
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
    ) -> RequestOutcome:
        """Submit when a slot is free, poll to a terminal status; failures come back as the outcome."""
        async with self._sem:
            self.in_flight += 1
            try:
                return await self._generate(spec, slot, t_arrival, self.in_flight - 1)
            finally:
                self.in_flight -= 1

    async def _generate(
        self, spec: VideoRequestSpec, slot: int, t_arrival: float | None, others: int
    ) -> RequestOutcome:
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        t_submit = time.time()
        deadline = time.perf_counter() + self.timeout_s
        code = 0  # the HTTP status the outcome reports

        def done(
            rid: str, status: str, error: str | None, body: dict[str, Any] | None = None
        ) -> RequestOutcome:
            return RequestOutcome(
                rid, status, t_submit, time.time(), code, error, body or {}, None, slot, t_arrival, others
            )

        def left() -> httpx.Timeout:
            # no HTTP call outlives the deadline (a stopped engine accepts and never answers)
            s = max(0.2, deadline - time.perf_counter())
            return httpx.Timeout(min(30.0, s), connect=min(5.0, s))

        async def timed_out(
            rid: str, status: str, why: str = "", body: dict[str, Any] | None = None
        ) -> RequestOutcome:
            head = f"request {rid or '(not yet accepted)'} not finished after {self.timeout_s:g} s"
            out = done(rid, "timeout", f"{head} (last status {status}{why})", body)
            if self.alive is not None and not self.lost and not await self.health(HEALTH_AFTER_TIMEOUT_S):
                self.lost = True
                self.lost_why = (
                    f"the engine stopped answering: GET /health had no answer within "
                    f"{HEALTH_AFTER_TIMEOUT_S:g} s after request {rid or '(not yet accepted)'} timed out"
                )
            return out

        if self._dead():
            return done("", "error", f"not sent: {self.lost_why or 'the engine was gone'}")
        try:
            resp = await self._call(self.http.post("/v1/videos", json=spec.payload(), timeout=left()))
        except _Lost:
            return done("", "error", f"lost the engine while submitting{self._why()}")
        except httpx.HTTPError as exc:
            if self._dead():
                return done("", "error", f"lost the engine while submitting: {type(exc).__name__}")
            if isinstance(exc, httpx.TimeoutException):
                return await timed_out("", "submitting", f"; the engine did not answer: {type(exc).__name__}")
            return done("", "error", f"submit failed: {type(exc).__name__}: {exc}")
        code = resp.status_code
        if code >= 400:
            return done("", "rejected", _error_text(resp))
        body = _json_object(resp)
        if body is None:
            return done("", "error", f"submit answer is not a JSON object: {resp.text[:200]!r}")
        rid = str(body.get("id") or body.get("request_id") or "")
        status = body.get("status", "queued")
        broken = 0  # polls in a row that lost their connection
        while status not in TERMINAL:
            if time.perf_counter() > deadline:
                return await timed_out(rid, status, body=body)
            await asyncio.sleep(self.poll_s * (self.queued_every if status == "queued" else 1))
            try:
                r = await self._call(self.http.get(f"/v1/videos/{rid}", timeout=left()))
            except _Lost:
                return done(rid, "error", f"lost the engine while polling {rid}{self._why()}", body)
            except httpx.TimeoutException:
                continue
            except httpx.TransportError as exc:
                # a GET is safe to repeat (uvicorn drops a keep-alive connection whose loop was busy)
                broken += 1
                if broken <= POLL_RETRIES and not self._dead():
                    log.info("poll of %s lost its connection (%s), retrying", rid, type(exc).__name__)
                    continue
                why = f"{type(exc).__name__}: {exc} ({broken} polls in a row)"
                return done(rid, "error", f"lost the engine while polling {rid}: {why}", body)
            except httpx.HTTPError as exc:
                return done(
                    rid, "error", f"lost the engine while polling {rid}: {type(exc).__name__}: {exc}", body
                )
            broken = 0
            if r.status_code >= 400:
                code = r.status_code
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


class VideoClient:
    """Synchronous face of :class:`AsyncVideoClient` (one request at a time), plus the request's
    record from ``perf_log_dir`` (None: no lookup)."""

    def __init__(
        self,
        base_url: str,
        perf_log_dir: str | Path | None = None,
        timeout_s: float = 600.0,
        poll_s: float = 0.05,
    ):
        self.aio = AsyncVideoClient(base_url, 1, timeout_s, poll_s, queued_every=1)
        self.base_url = self.aio.base_url
        self.perf_log_dir = Path(perf_log_dir) if perf_log_dir else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="perfkit-client", daemon=True)
        self._thread.start()

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except BaseException:  # interrupted or timed out: the request stops with the caller
            fut.cancel()
            raise

    def close(self) -> None:
        """Close the connections and end the client's thread, in at most about 10 s."""
        try:
            self._run(self.aio.http.aclose(), timeout=5.0)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("client %s: connections not closed: %r", self.base_url, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> "VideoClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self) -> bool:
        """True when ``GET /health`` answers 200 (False on an HTTP error)."""
        return self._run(self.aio.health())

    def generate(self, spec: VideoRequestSpec, record_timeout_s: float = 10.0) -> RequestOutcome:
        """Submit, poll to a terminal status, find the record; failures come back as the outcome."""
        out = self._run(self.aio.generate(spec))
        if self.perf_log_dir is not None and out.request_id and out.status in ("completed", "failed"):
            out.record = self.wait_record(out.request_id, record_timeout_s)
            if out.record is None:
                log.warning("no performance.log line for %s after %.0f s", out.request_id, record_timeout_s)
        return out

    def wait_record(self, request_id: str, timeout_s: float = 10.0) -> PerfRecord | None:
        """Poll performance.log (``perf_log_dir`` set) for the request's line."""
        deadline = time.perf_counter() + timeout_s
        while True:
            found = lookup(self.perf_log_dir, request_id)
            if isinstance(found, RecordError):  # its line was refused: waiting longer changes nothing
                log.warning("%s", found)
                return None
            if found is not None or time.perf_counter() > deadline:
                return found
            time.sleep(0.05)


def _error_text(resp: httpx.Response) -> str:
    body = _json_object(resp)
    if body is None:
        why = resp.text[:300]
    elif isinstance(body.get("error"), dict):
        why = body["error"].get("message")
    else:
        why = body["detail"] if "detail" in body else str(body)[:300]
    return f"HTTP {resp.status_code}: {why}"


async def closed_loop(
    client: AsyncVideoClient, requests: Sequence[VideoRequestSpec], concurrency: int
) -> list[RequestOutcome]:
    """``concurrency`` workers, each sending its next request when its last one ended (sglang
    bench_serving's ``--max-concurrency``); the outcomes in request order."""
    pending = list(enumerate(requests))
    out: list[RequestOutcome | None] = [None] * len(pending)

    async def worker() -> None:
        while pending:
            i, spec = pending.pop(0)
            out[i] = await client.generate(spec, slot=i)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [o for o in out if o is not None]


async def open_loop(
    client: AsyncVideoClient, requests: Sequence[VideoRequestSpec], arrivals_s: Sequence[float]
) -> list[RequestOutcome]:
    """Send request i at ``arrivals_s[i]`` s after the start, whatever is in flight (up to the
    client's bound); outcomes in arrival order."""
    t0 = time.time()

    async def one(i: int, spec: VideoRequestSpec, at: float) -> RequestOutcome:
        await asyncio.sleep(max(0.0, t0 + at - time.time()))
        return await client.generate(spec, slot=i, t_arrival=t0 + at)

    return list(await asyncio.gather(*(one(i, s, a) for i, (s, a) in enumerate(zip(requests, arrivals_s)))))

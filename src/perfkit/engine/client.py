"""Client for sglang's video API: ``POST /v1/videos``, then poll ``GET /v1/videos/{id}``.

The reference engine and sglang's diffusion server answer the same protocol. After completion the
matching line in ``performance.log`` is found by request id (polled with a timeout: the server
writes it after the status flips; a partial last line is tolerated). The job JSON's own fields
are read as what they are (:func:`job_fields`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfkit.readings.records import PerfRecord, RecordError, lookup

if TYPE_CHECKING:  # annotations only: httpx is imported where a request is sent
    import httpx

log = logging.getLogger(__name__)

TERMINAL = ("completed", "failed", "error", "cancelled")
#: polls in a row that may lose their connection before the engine counts as lost (a GET is repeated)
POLL_RETRIES = 3


@dataclass
class VideoRequestSpec:
    """A request's fields (sglang's /v1/videos names). Pixels, frames, steps."""

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
        body = {k: v for k, v in self.__dict__.items() if k != "extra" and v is not None}
        body.update(self.extra)
        return body

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VideoRequestSpec":
        """Build from a params mapping; unknown keys go to ``extra``."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "extra"}
        extra = {k: v for k, v in d.items() if k not in cls.__dataclass_fields__}
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class JobFields:
    """What a job JSON (``GET /v1/videos/{id}``) says of the job; None: not in it (or null).

    sglang 0.5.23 (multimodal_gen/runtime/entrypoints/openai/video_api.py, protocol.py) writes
    ``created_at`` and ``completed_at`` as ``int(time.time())``: epoch seconds truncated to whole
    seconds (up to 1 s early: a span between them is only good to 1 s), ``inference_time_s``
    (the pipeline's total duration, s; null until done and for failed jobs), ``peak_memory_mb``
    (the device's peak, MiB; null on a CPU, where sglang measures none) and no start time.

    Attributes:
        created_at_s, completed_at_s: epoch s, whole seconds.
        inference_time_s: s.
        peak_memory_mib: MiB.
        started_at_s: epoch s (the reference engine's ``perfkit_times.started``; sglang: None).
    """

    created_at_s: int | None = None
    completed_at_s: int | None = None
    inference_time_s: float | None = None
    peak_memory_mib: float | None = None
    started_at_s: float | None = None


def _job_number(body: dict[str, Any], key: str, *path: str) -> float | None:
    """``body[key]`` (or ``body[key][path...]``) as a finite number >= 0; None when absent or
    null; any other value is None with a warning naming the job and the key (never 0)."""
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
    """The job JSON's own fields (:class:`JobFields`), each as written or None."""

    def whole(key: str) -> int | None:
        v = _job_number(body, key)
        return int(v) if v is not None else None

    return JobFields(
        created_at_s=whole("created_at"),
        completed_at_s=whole("completed_at"),
        inference_time_s=_job_number(body, "inference_time_s"),
        peak_memory_mib=_job_number(body, "peak_memory_mb"),
        started_at_s=_job_number(body, "perfkit_times", "started"),
    )


@dataclass
class RequestOutcome:
    """What happened to one request, client side.

    Attributes:
        request_id: server id ('' when the submit itself failed).
        status: ``completed``, ``failed``, ``rejected`` (4xx on submit), ``timeout`` or ``error``
            (connection lost, e.g. the engine died).
        http_status: status code of the submit (0 when no answer).
        client_ms: submit to terminal status, ms.
        t_start, t_end: epoch seconds (same clock as the sampler).
        error: error text from the server or the transport.
        record: the matching performance.log record, when found.
    """

    request_id: str
    status: str
    http_status: int
    client_ms: float
    t_start: float
    t_end: float
    error: str | None = None
    record: PerfRecord | None = None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def job(self) -> JobFields:
        """The last job JSON's own fields (:func:`job_fields`)."""
        return job_fields(self.body)


class VideoClient:
    """Synchronous client for one engine.

    Args:
        base_url: e.g. ``http://127.0.0.1:30000``.
        perf_log_dir: where the engine writes performance.log (None: no record lookup).
        timeout_s: per request, submit to completion (no HTTP call waits past it).
        poll_s: polling interval.
    """

    def __init__(
        self,
        base_url: str,
        perf_log_dir: str | Path | None = None,
        timeout_s: float = 600.0,
        poll_s: float = 0.05,
    ):
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        self.base_url = base_url.rstrip("/")
        self.perf_log_dir = Path(perf_log_dir) if perf_log_dir else None
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(30.0, connect=5.0))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "VideoClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self) -> bool:
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        try:
            return self.http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def submit(self, spec: VideoRequestSpec) -> httpx.Response:
        return self.http.post("/v1/videos", json=spec.payload())

    def generate(self, spec: VideoRequestSpec, record_timeout_s: float = 10.0) -> RequestOutcome:
        """Submit, poll to a terminal status, then find the record. Never raises for server-side
        failures: they come back as the outcome's status and error."""
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        t_start = time.time()
        p0 = time.perf_counter()

        def outcome(rid: str, status: str, code: int, error: str | None, body=None) -> RequestOutcome:
            return RequestOutcome(
                rid,
                status,
                code,
                (time.perf_counter() - p0) * 1000.0,
                t_start,
                time.time(),
                error,
                None,
                body or {},
            )

        deadline = p0 + self.timeout_s

        def call_timeout() -> httpx.Timeout:
            # no single HTTP call outlives the request's deadline (a stopped engine accepts the
            # connection and never answers)
            left = max(0.2, deadline - time.perf_counter())
            return httpx.Timeout(min(30.0, left), connect=min(5.0, left))

        def timed_out(rid: str, code: int, status: str, why: str = "") -> RequestOutcome:
            return outcome(
                rid,
                "timeout",
                code,
                f"request {rid or '(not yet accepted)'} not finished after {self.timeout_s:g} s "
                f"(last status {status}{why})",
            )

        try:
            resp = self.http.post("/v1/videos", json=spec.payload(), timeout=call_timeout())
        except httpx.TimeoutException as exc:
            return timed_out("", 0, "submitting", f"; the engine did not answer: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return outcome("", "error", 0, f"submit failed: {type(exc).__name__}: {exc}")
        if resp.status_code >= 400:
            return outcome("", "rejected", resp.status_code, _error_text(resp))
        body = resp.json()
        rid = str(body.get("id") or body.get("request_id") or "")
        status = body.get("status", "queued")
        broken = 0  # polls in a row that lost the connection
        while status not in TERMINAL:
            if time.perf_counter() > deadline:
                return timed_out(rid, resp.status_code, status)
            time.sleep(self.poll_s)
            try:
                r = self.http.get(f"/v1/videos/{rid}", timeout=call_timeout())
            except httpx.TimeoutException as exc:
                if time.perf_counter() >= deadline:
                    return timed_out(
                        rid, resp.status_code, status, f"; the engine did not answer: {type(exc).__name__}"
                    )
                continue
            except httpx.TransportError as exc:
                # a GET is safe to repeat: a connection the server dropped (uvicorn closes a
                # keep-alive connection whose loop was busy past its timeout, e.g. while the
                # engine gzips a profiler trace) is retried on a new one; a gone engine fails
                # POLL_RETRIES times in a row
                broken += 1
                if broken <= POLL_RETRIES:
                    log.info("poll of %s lost its connection (%s), retrying", rid, type(exc).__name__)
                    continue
                return outcome(
                    rid,
                    "error",
                    resp.status_code,
                    f"lost the engine while polling {rid}: {type(exc).__name__}: {exc} "
                    f"({broken} polls in a row)",
                )
            except httpx.HTTPError as exc:
                return outcome(
                    rid,
                    "error",
                    resp.status_code,
                    f"lost the engine while polling {rid}: {type(exc).__name__}: {exc}",
                )
            broken = 0
            if r.status_code >= 400:
                return outcome(rid, "error", r.status_code, _error_text(r))
            body = r.json()
            status = body.get("status", status)
        out = outcome(
            rid,
            "completed" if status == "completed" else "failed",
            resp.status_code,
            body.get("error") if status != "completed" else None,
            body,
        )
        if isinstance(out.error, dict):
            out.error = out.error.get("message") or str(out.error)
        if self.perf_log_dir is not None and rid:
            out.record = self.wait_record(rid, record_timeout_s)
            if out.record is None:
                log.warning("no performance.log line for %s after %.0f s", rid, record_timeout_s)
        return out

    def wait_record(self, request_id: str, timeout_s: float = 10.0) -> PerfRecord | None:
        """Poll performance.log for the request's line."""
        if self.perf_log_dir is None:
            return None
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
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return f"HTTP {resp.status_code}: {err.get('message')}"
    if isinstance(body, dict) and "detail" in body:
        return f"HTTP {resp.status_code}: {body['detail']}"
    return f"HTTP {resp.status_code}: {str(body)[:300]}"

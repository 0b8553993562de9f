"""Start the reference engine as a real subprocess for tests (independent of perfkit.engine.launch).

::

    with running_engine(tmp_dir, "--compile", "--compile-backend", "aot_eager") as eng:
        with eng.client() as c:
            out = c.generate(VideoRequestSpec(num_frames=25))
        eng.records()          # performance.log records so far

The engine runs in its own session (process group). Its stderr streams to ``stderr.log`` in the
engine directory; the port comes from the ``perfkit-mark listening port=N`` line there. Ready is
``GET /health`` == 200. Teardown: SIGTERM to the group, a grace period, then SIGKILL to the group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

from perfkit.engine.client import VideoClient, VideoRequestSpec
from perfkit.readings.records import PerfRecord, read_perf_log

PORT_RE = re.compile(r"perfkit-mark listening port=(\d+)")
#: Seconds an engine may take to become ready (model build + warmup, compile included).
START_TIMEOUT_S = float(os.environ.get("PERFKIT_TEST_ENGINE_START_S", "240"))


class EngineStartFailed(RuntimeError):
    pass


@dataclass
class RunningEngine:
    proc: subprocess.Popen
    directory: Path
    argv: list[str]
    port: int = 0
    ready_s: float = 0.0
    _stderr_fh: object = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def perf_log_dir(self) -> Path:
        return self.directory / "perf"

    @property
    def stderr_path(self) -> Path:
        return self.directory / "stderr.log"

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **kw) -> VideoClient:
        kw.setdefault("timeout_s", 300.0)
        return VideoClient(self.base_url, perf_log_dir=self.perf_log_dir, **kw)

    def records(self) -> list[PerfRecord]:
        return read_perf_log(self.perf_log_dir).records

    def perf_log_lines(self) -> list[str]:
        p = self.perf_log_dir / "performance.log"
        return p.read_text().splitlines() if p.exists() else []

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL it. Returns the exit code."""
        pgid = self.proc.pid  # start_new_session: the pid is the group id
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while children in its group remain: always sweep the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self._stderr_fh is not None:
            self._stderr_fh.close()
            self._stderr_fh = None
        return self.proc.returncode


def start_engine(
    directory: str | Path,
    *extra_args: str,
    preset: str = "tiny",
    timeout_s: float = START_TIMEOUT_S,
    env: dict[str, str] | None = None,
    entry: tuple[str, ...] = ("-m", "perfkit.refengine"),
) -> RunningEngine:
    """Start ``python -m perfkit.refengine`` (or ``entry``, e.g. ``("-m", "perfkit.cli", "engine",
    "serve")``) and wait until /health is 200.

    Raises:
        EngineStartFailed: exited or not ready within ``timeout_s`` (the message has the stderr tail).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "perf").mkdir(exist_ok=True)
    argv = [
        sys.executable,
        *entry,
        "--preset",
        preset,
        "--port",
        "0",
        "--perf-log-dir",
        str(d / "perf"),
        *extra_args,
    ]
    full_env = dict(os.environ)
    full_env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(d / "cache" / "inductor"),
            "TRITON_CACHE_DIR": str(d / "cache" / "triton"),
        }
    )
    full_env.update(env or {})
    err_fh = open(d / "stderr.log", "wb")
    out_fh = open(d / "stdout.log", "wb")
    try:
        proc = subprocess.Popen(
            argv,
            stdout=out_fh,
            stderr=err_fh,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
            cwd=str(d),
        )
    finally:
        out_fh.close()
    eng = RunningEngine(proc=proc, directory=d, argv=argv, _stderr_fh=err_fh)
    t0 = time.monotonic()
    try:
        _wait_ready(eng, t0 + timeout_s)
    except BaseException:
        eng.stop(grace_s=2)
        raise
    eng.ready_s = time.monotonic() - t0
    return eng


def _wait_ready(eng: RunningEngine, deadline: float) -> None:
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0)) as http:
        while True:
            if eng.proc.poll() is not None:
                raise EngineStartFailed(
                    f"engine exited with {eng.proc.returncode} before ready:\n{eng.stderr_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise EngineStartFailed(
                    f"engine not ready in time (port {eng.port or '?'}):\n{eng.stderr_text()[-4000:]}"
                )
            if not eng.port:
                m = PORT_RE.search(eng.stderr_text())
                if m:
                    eng.port = int(m.group(1))
            if eng.port:
                try:
                    if http.get(f"{eng.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)


@contextlib.contextmanager
def running_engine(directory: str | Path, *extra_args: str, **kw) -> Iterator[RunningEngine]:
    """Context manager around :func:`start_engine`; always stops the engine (and asserts it is gone)."""
    eng = start_engine(directory, *extra_args, **kw)
    try:
        yield eng
    finally:
        eng.stop()
        assert eng.proc.poll() is not None, f"engine pid {eng.proc.pid} survived teardown"


def spec(num_frames: int = 25, steps: int = 4, height: int = 64, width: int = 64, **kw) -> VideoRequestSpec:
    """A small request (64x64, 4 steps, 25 frames by default)."""
    return VideoRequestSpec(
        num_frames=num_frames, height=height, width=width, num_inference_steps=steps, **kw
    )

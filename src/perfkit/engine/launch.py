"""Start an engine under memory caps, wait until it is ready, capture its logs, always tear down.
Layout under ``run_dir/<label>/``: ``stdout.log``, ``stderr.log``, ``perf/``, ``cache/`` (or
``run_dir/shared-cache/``); teardown: docs/robustness.md; the handle: :mod:`perfkit.engine.handle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from perfkit.engine import owner as _owner
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.handle import (
    _LIVE,
    EngineHandle,
    EngineStartError,
    LaunchClock,
    PortInUseError,
    boot_start_s,
    cold_start_parts,
    parse_marks,
)
from perfkit.engine.owner import StartedProcess, _register
from perfkit.engine.owner import started_processes as started_processes  # re-exported
from perfkit.engine.owner import surviving as surviving  # re-exported
from perfkit.engine.spec import EngineSpec

log = logging.getLogger(__name__)


POLL_S = 0.2
#: the poll while nothing answers yet (refused: cheap), so a short warmup's 503 is seen
REFUSED_POLL_S = 0.05


def free_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """A port that is free now (bind ``port``, 0: any). Raises OSError when it is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, port))
        return s.getsockname()[1]


#: sglang 0.5.23's internal ports (``server_args.py``: ``master_port`` 30005, ``scheduler_port``
#: 5555 + 0..100): two servers started together both find 30005 free, one dies (EADDRINUSE)
SGLANG_PORT_FLAGS = ("--master-port", "--scheduler-port")


def _sglang_ports(spec: EngineSpec) -> list[str]:
    """For kind ``sglang``: ``--flag port`` for each :data:`SGLANG_PORT_FLAGS` the spec leaves unset."""
    if spec.kind != "sglang":
        return []
    given = set(spec.server_args) | set(spec.extra_args)
    out: list[str] = []
    for flag in SGLANG_PORT_FLAGS:
        if flag not in given and not any(a.startswith(flag + "=") for a in given):
            out += [flag, str(free_port(spec.host))]
    return out


def _unique_dir(base: Path, label: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._=-]+", "_", label) or "engine"
    d = base / safe
    i = 1
    while d.exists():
        d = base / f"{safe}-{i}"
        i += 1
    d.mkdir(parents=True)
    return d


@contextlib.contextmanager
def launch(
    spec: EngineSpec,
    caps: MemoryCaps | None = None,
    run_dir: str | Path | None = None,
    label: str = "engine",
    nvml: Any = None,
) -> Iterator[EngineHandle]:
    """Start ``spec`` under ``caps`` (host budget clamped to what exists, :meth:`MemoryCaps.resolve`),
    wait for health, yield an :class:`EngineHandle`, tear down. GPUs: docs/scale-out.md.

    Raises PortInUseError (``spec.port`` taken), FileNotFoundError (``spec.check()``),
    EngineStartError (exited, not ready in time or over the host cap before ready), MemoryReadError.
    """
    spec.check()
    if caps is not None and not caps.resolved:
        caps = caps.resolve()
    port = _port(spec)

    base = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="perfkit-run-"))
    d = _unique_dir(base, label)
    perf_dir = d / "perf"
    perf_dir.mkdir()
    cache = base / "shared-cache" if spec.share_compile_cache else d / "cache"
    for sub in ("inductor", "triton"):
        (cache / sub).mkdir(parents=True, exist_ok=True)

    argv = spec.command(port, perf_dir) + _sglang_ports(spec)
    env = _engine_env(spec, caps, perf_dir, port, cache)
    gpus = _engine_gpus(spec, env, label, nvml)

    (d / "command.txt").write_text(" ".join(argv) + "\n")
    log.info("launching %s: %s (logs in %s)", label, " ".join(argv), d)
    proc, clock = _start(argv, env, label, d)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    _register(StartedProcess(proc.pid, proc.pid, create_time, label, tuple(argv)))
    handle = EngineHandle(
        spec, label, port, proc.pid, argv, d, proc, caps=caps, _nvml=nvml, _create_time=create_time, **gpus
    )
    _LIVE[proc.pid] = handle
    start_error = None
    try:
        handle._enforcer = (caps or MemoryCaps()).start(proc.pid, name=label)
        _wait_ready(handle, spec.startup_timeout_s, clock)
        log.info("engine %s ready in %.2f s at %s", label, handle.cold_start["ready_s"], handle.base_url)
        yield handle
    except EngineStartError as exc:
        start_error = None if handle.cold_start else exc  # not ready: this launch's own error
        raise
    finally:
        handle._terminate(spec.stop_grace_s)
        log.info("engine %s stopped (exit code %s)", label, handle.exit_code)
        if start_error is not None:  # how it ended, read by the teardown (a signal, its OOM record)
            start_error.end = handle.end


def _port(spec: EngineSpec) -> int:
    try:
        return free_port(spec.host, spec.port or 0)
    except OSError:
        if spec.port is None:
            raise
        raise PortInUseError(
            f"port {spec.port} is already in use on {spec.host} "
            f"(EngineSpec.port); stop what holds it or leave port unset"
        ) from None


def _engine_env(
    spec: EngineSpec, caps: MemoryCaps | None, perf_dir: Path, port: int, cache: Path
) -> dict[str, str]:
    """The engine's whole environment: this one, plus the spec's, the caps' and the caches'."""
    added = {**spec.env_for(perf_dir, port), **(caps.env() if caps is not None else {})}
    added.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    added.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    added.update(PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    return {**os.environ, **added}


def _engine_gpus(spec: EngineSpec, env: dict[str, str], label: str, nvml: Any) -> dict[str, Any]:
    """The handle's GPUs by UUID, their NVML indices and device MiB used before launch."""
    from perfkit.readings.sampler.nvml import GpuResolveError, device_used_mib, resolve_visible_gpus

    n_gpus = spec.num_gpus if spec.kind != "command" else 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if "CUDA_DEVICE_ORDER" not in env:  # CUDA ordinals = NVML indices
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        gpus = resolve_visible_gpus(visible, nvml=nvml)[:n_gpus]
    except GpuResolveError as exc:
        log.warning("%s: %s; sampling NVML indices 0..%d instead", label, exc, n_gpus - 1)
        gpus = []
    indices = [g.index for g in gpus] or list(range(n_gpus))
    return {
        "gpus": [dataclasses.asdict(g) for g in gpus],
        "gpu_indices": indices,
        "device_baseline_mib": device_used_mib(indices, nvml=nvml),
    }


def _start(argv: list[str], env: dict[str, str], label: str, d: Path) -> tuple[subprocess.Popen, LaunchClock]:
    """Start ``argv`` in its own session, dying with its parent; EngineStartError when it cannot."""
    with open(d / "stdout.log", "wb") as out_fh, open(d / "stderr.log", "wb") as err_fh:
        clock = LaunchClock(time.time(), time.monotonic_ns(), time.clock_gettime(time.CLOCK_BOOTTIME))
        try:
            proc = subprocess.Popen(
                argv,
                stdout=out_fh,
                stderr=err_fh,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_owner.die_with_parent,  # SIGKILL at the launcher's death (own session)
            )
        except OSError as exc:
            raise EngineStartError(f"could not start engine {label!r}: {exc}", run_dir=d) from exc
    return proc, dataclasses.replace(clock, pid_boot_s=boot_start_s(proc.pid))


#: what ended an engine, most telling first: a line saying it aborts (sglang: "Server warmup
#: failed; aborting startup: ..."), else an exception's or an ERROR line
_FATAL = re.compile(r"\S.*\b(?:abort(?:ing|ed)?|fatal)\b.*", re.IGNORECASE)
_ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b:?.*|\bERROR\b.*")


def error_line(log_tail: str) -> str | None:
    """The line of an engine's log tail that says why it ended, clipped to 300 characters: the
    last line saying it aborts (sglang: "Server warmup failed; aborting startup: ..." on stdout,
    while stderr has errors it recovered from), else the last naming an error; None when none."""
    lines = log_tail.splitlines()
    for pattern in (_FATAL, _ERROR):
        for line in reversed(lines):
            m = pattern.search(line)
            if m:
                return m.group(0).strip()[:300]
    return None


def _wait_ready(h: EngineHandle, timeout: float, clock: LaunchClock) -> None:
    """Poll ``/health`` until 200 and set ``h.cold_start``; EngineStartError on exit or timeout."""
    import httpx  # here, not at the top: only where a request is sent (a replay sends none)

    health: dict[str, Any] = {}  # first_status, t_first_503 once seen

    def failed(head: str, exit_code: int | None) -> EngineStartError:
        tail = h.tail(50)
        return EngineStartError(
            f"{head}\ncommand: {' '.join(h.command)}\n--- last 50 log lines ({h.run_dir}) ---\n{tail}",
            exit_code,
            tail,
            h.cap_outcome,
            h.run_dir,
        )

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as client:
        while True:
            if not h.alive():
                time.sleep(0.1)  # let the last log lines land
                o = h.cap_outcome
                why = f"; {o.message}" if o.exceeded else ""
                cause = error_line(h.tail(50))
                why += f"; the log's last error: {cause}" if cause else ""
                raise failed(
                    f"engine {h.label!r} exited with code {h.exit_code} before it was ready{why}", h.exit_code
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise failed(
                    f"engine {h.label!r} not ready after {timeout:g} s (GET {h.health_url} never answered 200)",
                    None,
                )
            pause = POLL_S
            try:
                r = client.get(h.health_url, timeout=max(0.1, min(2.0, remaining)))
                t_answer = time.time()
                health.setdefault("first_status", r.status_code)
                if r.status_code == 503:
                    health.setdefault("t_first_503", t_answer)
                if r.status_code == 200:
                    text = "\n".join(p.read_text(errors="replace") for p in (h.stdout_path, h.stderr_path))
                    h.cold_start = cold_start_parts(
                        parse_marks(text),
                        clock.t_launch,
                        t_answer,
                        log_text=text,
                        clock=clock,
                        health=health,
                        engine="sglang" if h.spec.kind == "sglang" else f"the {h.spec.kind} engine",
                    )
                    return
            except httpx.HTTPError:
                pause = POLL_S if health else REFUSED_POLL_S
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

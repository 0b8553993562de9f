"""Start an engine under memory caps, wait until it is ready, capture its logs, always tear down.

::

    with launch(EngineSpec(kind="reference"), caps=MemoryCaps(host_gib=32), run_dir=d) as eng:
        client = ...(eng.base_url)
        eng.cold_start          # {"ready_s": 41.2, "process_start_s": 0.4, ...}
        eng.records()           # performance.log records so far
    # here the engine's whole process group is gone

Layout under ``run_dir/<label>/``: ``stdout.log``, ``stderr.log``, ``perf/`` (the perf log dir),
``cache/{inductor,triton}`` (own compile caches unless ``spec.share_compile_cache``, then
``run_dir/shared-cache/``).

Cold start: ``ready_s`` is launch until ``GET health_path`` answers 200. Its parts come from engine
log lines ``perfkit-mark <name> t=<epoch seconds>``: ``process_start_s`` and ``models_loaded_s``
(mark − launch time) and ``warmup_s`` (warmup_done − models_loaded), None where absent.

Teardown (normal exit, exception or KeyboardInterrupt): SIGTERM and SIGCONT to the process
group, ``grace_s`` (default ``spec.stop_grace_s``) to exit, then SIGKILL to the group, to any
descendant seen that survived (also those that left the group) and to the engine's own cgroup
where it has one; :attr:`EngineHandle.end` says how it ended. Every process started is recorded
in a module registry (:func:`started_processes`) so tests can assert that none survives, and
with the owner (:mod:`perfkit.engine.owner`: the file named by ``PERFKIT_OWNER_REGISTRY``), which
ends it if this process dies first; the engine itself gets a SIGKILL parent-death signal.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import psutil

from perfkit.engine import owner as _owner
from perfkit.engine.caps import CapOutcome, HostCapEnforcer, MemoryCaps, kill_tree
from perfkit.engine.spec import EngineSpec
from perfkit.readings import records as _records

log = logging.getLogger(__name__)

MARK_RE = re.compile(r"perfkit-mark[ \t]+(\w+)\b[^\n]*?(?<![\w])t=([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?\d+)?)")
POLL_S = 0.2


class EngineStartError(RuntimeError):
    """The engine did not become ready: it exited, timed out, or could not be started.

    Attributes:
        exit_code: the process exit code (negative: killed by that signal), None if still running
            or never started.
        log_tail: the last lines of its stdout+stderr.
        cap_outcome: the host cap outcome (None without a launch).
        command: the argv.
        run_dir: the launch directory holding the logs.
    """

    def __init__(
        self,
        message: str,
        exit_code: int | None = None,
        log_tail: str = "",
        cap_outcome: CapOutcome | None = None,
        command: list[str] | None = None,
        run_dir: Path | None = None,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.cap_outcome = cap_outcome
        self.command = command
        self.run_dir = run_dir


class PortInUseError(EngineStartError):
    """The fixed port of the spec is taken."""


class EngineExitedError(RuntimeError):
    """The engine is no longer running (see :meth:`EngineHandle.raise_if_dead`)."""


# ---------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class StartedProcess:
    pid: int
    pgid: int
    create_time: float
    label: str
    command: tuple[str, ...]


_REGISTRY: list[StartedProcess] = []
_REGISTRY_LOCK = threading.Lock()


def started_processes() -> list[StartedProcess]:
    """Every engine process (and descendant seen at teardown) started by :func:`launch` in
    this Python process, oldest first."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY)


def _register(p: StartedProcess) -> None:
    with _REGISTRY_LOCK:
        _REGISTRY.append(p)


def surviving(procs: list[StartedProcess]) -> list[StartedProcess]:
    """Those of ``procs`` still alive (same pid and start time, not a zombie)."""
    out = []
    for sp in procs:
        try:
            p = psutil.Process(sp.pid)
            if abs(p.create_time() - sp.create_time) > 0.05:
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(sp)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            out.append(sp)
    return out


_LIVE: dict[int, "EngineHandle"] = {}


@atexit.register
def _kill_live_at_exit() -> None:
    for h in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            h._terminate(grace_s=2.0)


# ---------------------------------------------------------------------------- helpers
def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now (bind port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def parse_marks(text: str) -> dict[str, float]:
    """``perfkit-mark <name> t=<epoch s>`` lines -> name -> t (the first of each name; one mark
    per line, the first). Linear in ``len(text)``."""
    out: dict[str, float] = {}
    for line in text.splitlines():  # one try per line, at its first mark: linear on any log
        i = line.find("perfkit-mark")
        m = MARK_RE.match(line, i) if i >= 0 else None
        if m is not None:
            out.setdefault(m.group(1), float(m.group(2)))
    return out


def cold_start_parts(marks: dict[str, float], t_launch: float, t_ready: float | None) -> dict[str, Any]:
    """Cold start dict: ready_s, process_start_s, models_loaded_s, warmup_s (None when absent)."""

    def since(name: str) -> float | None:
        t = marks.get(name)
        return t - t_launch if t is not None else None

    wd, ml = marks.get("warmup_done"), marks.get("models_loaded")
    return {
        "ready_s": (t_ready - t_launch) if t_ready is not None else None,
        "process_start_s": since("process_start"),
        "models_loaded_s": since("models_loaded"),
        "warmup_s": (wd - ml) if wd is not None and ml is not None else None,
        "t_launch": t_launch,
        "t_ready": t_ready,
        "marks": dict(marks),
    }


def _tail_file(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max(65536, 400 * n)))
            data = fh.read()
    except OSError:
        return []
    return list(deque(data.decode("utf-8", errors="replace").splitlines(), maxlen=n))


def _unique_dir(base: Path, label: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._=-]+", "_", label) or "engine"
    d = base / safe
    i = 1
    while d.exists():
        d = base / f"{safe}-{i}"
        i += 1
    d.mkdir(parents=True)
    return d


# ---------------------------------------------------------------------------- handle
@dataclass
class EngineHandle:
    """A running engine.

    Attributes:
        spec: the EngineSpec.
        label: launch label.
        host, port, base_url: where it answers (``http://host:port``).
        pid, pgid: root process id and its process group.
        command: the exact argv; env_added: environment added to os.environ (spec + caps + caches).
        run_dir: this launch's directory (``<run_dir>/<label>``).
        perf_log_dir: where the engine writes ``performance.log``.
        stdout_path, stderr_path: engine log files.
        caps: the MemoryCaps after :meth:`MemoryCaps.resolve` (asked and effective host budget;
            None: none given).
        cold_start: ready_s, process_start_s, models_loaded_s, warmup_s (None when not marked),
            t_launch, t_ready (epoch s), marks (name -> epoch s).
        device_baseline_mib: device used memory read before launch (NaN without NVML).
        gpus: the GPUs the engine was given, as NVML knows them ({index, uuid, name} each,
            resolved by UUID from its CUDA_VISIBLE_DEVICES; [] without NVML).
        gpu_indices: the NVML indices its sampler reads (those of ``gpus``; without NVML the
            first ``num_gpus`` indices, as before).
        exit_code: set when the process has ended.
        end: set at teardown, how the engine ended: ``how`` (words: ``exited with code 3``,
            ``was killed by signal 9 (SIGKILL, not sent by perfkit)``, ``ended on perfkit's SIGTERM
            after 0.2 s (exit code -15)``, ``did not exit within 2 s of SIGTERM: killed by
            perfkit (SIGKILL) after 2.0 s``, prefixed ``was stopped (SIGSTOP) ...`` when it
            was), ``exit_code``, ``signal`` (None unless killed by one), ``by_perfkit``,
            ``after_s`` (SIGTERM until gone, s), ``stopped``, ``oom`` (the host's OOM-kill
            record, :func:`perfkit.readings.oom.oom_record`, when a signal not sent by perfkit
            ended it; else None).
    """

    spec: EngineSpec
    label: str
    host: str
    port: int
    pid: int
    pgid: int
    command: list[str]
    env_added: dict[str, str]
    run_dir: Path
    perf_log_dir: Path
    stdout_path: Path
    stderr_path: Path
    caps: MemoryCaps | None = None
    cold_start: dict[str, Any] = field(default_factory=dict)
    device_baseline_mib: float = math.nan
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_indices: list[int] = field(default_factory=lambda: [0])
    exit_code: int | None = None
    _nvml: Any = field(default=None, repr=False)
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _enforcer: HostCapEnforcer | None = field(default=None, repr=False)
    end: dict[str, Any] = field(default_factory=dict)
    _create_time: float = field(default=0.0, repr=False)

    @property
    def base_url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.base_url + self.spec.health_path

    @property
    def cap_outcome(self) -> CapOutcome:
        """Live host cap outcome (enforcement, exceeded, message, peak_rss_gib)."""
        if self._enforcer is not None:
            return self._enforcer.outcome
        return CapOutcome(message="no host cap")

    @property
    def perf_log_path(self) -> Path:
        return self.perf_log_dir / _records.PERF_LOG_NAME

    def alive(self) -> bool:
        """True while the root process runs."""
        if self._proc is None:
            return False
        rc = self._proc.poll()
        if rc is not None:
            self.exit_code = rc
            return False
        return True

    def poll(self) -> int | None:
        """Exit code, or None while running."""
        self.alive()
        return self.exit_code

    def health(self, timeout_s: float = 2.0) -> bool:
        """One ``GET health_path``: True on 200 (False when dead, refused or timed out)."""
        if not self.alive():
            return False
        try:
            return httpx.get(self.health_url, timeout=timeout_s, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def raise_if_dead(self) -> None:
        """Raise EngineExitedError (with the cap message when the cap killed it) if not running."""
        if self.alive():
            return
        o = self.cap_outcome
        why = o.message if o.exceeded else f"exit code {self.exit_code}"
        raise EngineExitedError(
            f"engine {self.label!r} (pid {self.pid}) is not running: {why}\n--- log tail ---\n{self.tail(30)}"
        )

    def tail(self, n: int = 50, stream: str = "both") -> str:
        """Last ``n`` lines of stdout, stderr or both (stdout's then stderr's, each labelled)."""
        if stream == "stdout":
            return "\n".join(_tail_file(self.stdout_path, n))
        if stream == "stderr":
            return "\n".join(_tail_file(self.stderr_path, n))
        out = _tail_file(self.stdout_path, n)
        err = _tail_file(self.stderr_path, n)
        parts = []
        if out:
            parts.append("[stdout]\n" + "\n".join(out))
        if err:
            parts.append("[stderr]\n" + "\n".join(err))
        return "\n".join(parts)

    def logs(self) -> dict[str, str]:
        """Full log texts: {"<label>.stdout.log": ..., "<label>.stderr.log": ...}."""
        out = {}
        for name, p in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            try:
                out[f"{self.label}.{name}.log"] = p.read_text(errors="replace")
            except OSError:
                out[f"{self.label}.{name}.log"] = ""
        return out

    def marks(self) -> dict[str, float]:
        """``perfkit-mark`` lines found in the logs so far."""
        text = ""
        for p in (self.stderr_path, self.stdout_path):
            with contextlib.suppress(OSError):
                text += p.read_text(errors="replace")
        return parse_marks(text)

    def records(self) -> list[_records.PerfRecord]:
        """Records in ``perf_log_dir/performance.log`` so far (malformed lines skipped)."""
        return _records.read_perf_log(self.perf_log_path).records

    def record_lines(self) -> list[str]:
        """Raw performance.log lines (for ResultBundle.records); a line that is not UTF-8 is kept
        with its stray bytes as ``\\xNN`` escapes (lossless; the record reader refuses that line,
        naming it, from the file itself)."""
        try:
            with open(self.perf_log_path, "rb") as fh:
                raw = [ln.rstrip(b"\r\n") for ln in fh]
        except OSError:
            return []
        return [ln.decode("utf-8", errors="backslashreplace") for ln in raw if ln.strip()]

    @property
    def cgroup_path(self) -> Path | None:
        """The engine's own cgroup (v2) directory while the cap holds it there, else None."""
        return self._enforcer.cgroup_path if self._enforcer is not None else None

    def sampler(self, interval_s: float = 0.1, gpu_index: int | list[int] | None = None, nvml: Any = None):
        """A (not started) MemorySampler of this engine with the pre-launch device baseline and,
        where the engine has its own cgroup, that cgroup (``cgroup_current_mib``).

        ``gpu_index``: NVML indices to read (default :attr:`gpu_indices`, the engine's own GPUs
        matched by UUID). ``nvml``: an NVML source (default: the one given to :func:`launch`,
        else pynvml)."""
        from perfkit.readings.sampler import MemorySampler

        return MemorySampler(
            self.pid,
            interval_s=interval_s,
            gpu_index=self.gpu_indices if gpu_index is None else gpu_index,
            baseline_device_mib=self.device_baseline_mib,
            cgroup_path=self.cgroup_path,
            nvml=nvml if nvml is not None else self._nvml,
        )

    def launch_row(self) -> dict[str, Any]:
        """One row of the bundle's ``launches`` table (load/warmup peaks filled by the caller)."""
        cs, o, caps = self.cold_start, self.cap_outcome, self.caps
        return {
            "launch": self.label,
            "label": self.label,
            "ready_s": cs.get("ready_s"),
            "process_start_s": cs.get("process_start_s"),
            "models_loaded_s": cs.get("models_loaded_s"),
            "warmup_s": cs.get("warmup_s"),
            "warmup_frames": self.spec.startup_warmup_frames(),
            "device_cap_gib": caps.device_gib if caps else None,
            "host_cap_gib": caps.host_gib if caps else None,
            "host_cap_asked_gib": caps.host_gib if caps else None,
            "host_cap_effective_gib": caps.host_effective_gib if caps else None,
            "host_cap_clamp": caps.host_clamp if caps else None,
            "enforcement": o.enforcement,
            "cap_mechanism": o.mechanism,
            "host_source": o.host_source,
            "host_pss_peak_mib": o.peak_pss_gib * 1024 if o.peak_pss_gib is not None else None,
            "cgroup_peak_mib": o.peak_cgroup_gib * 1024 if o.peak_cgroup_gib is not None else None,
            "cap_exceeded": o.exceeded,
            "command": " ".join(self.command),
            "exit_code": self.exit_code,
        }

    # ------------------------------------------------------------------ teardown
    def _descendants(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        if self._enforcer is not None:
            found.update(self._enforcer.known)
        try:
            root = psutil.Process(self.pid)
            if abs(root.create_time() - self._create_time) < 0.05:
                found[root.pid] = root
                for c in root.children(recursive=True):
                    found[c.pid] = c
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
        # also anything still in the process group (children that were re-parented)
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid not in found and os.getpgid(p.pid) == self.pgid:
                    found[p.pid] = p
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return [p for pid, p in found.items() if pid != self.pid]

    def _terminate(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM (and SIGCONT, so that a stopped engine acts on it) to the group, wait
        ``grace_s``, SIGKILL the group and surviving descendants (and the engine's own cgroup,
        where it has one: ``cgroup.kill``). Sets :attr:`end` (how the engine ended)."""
        _LIVE.pop(self.pid, None)
        if self._enforcer is not None:
            self._enforcer.stop()
        desc = self._descendants()
        for p in desc:
            with contextlib.suppress(psutil.Error):
                sp = StartedProcess(p.pid, self.pgid, p.create_time(), self.label, ())
                _register(sp)
                _owner.register(sp.pid, sp.pgid, sp.create_time, f"{self.label} (child)")
        proc = self._proc
        rc_before = proc.poll() if proc is not None else None
        stopped = False
        with contextlib.suppress(psutil.Error):
            stopped = rc_before is None and psutil.Process(self.pid).status() == psutil.STATUS_STOPPED
        killed, waited = False, 0.0
        if proc is not None and proc.poll() is None or any(_running(p) for p in desc):
            t0 = time.monotonic()
            kill_tree(self.pgid, desc, signal.SIGTERM)
            kill_tree(self.pgid, desc, signal.SIGCONT)
            deadline = t0 + grace_s
            while time.monotonic() < deadline:
                if (proc is None or proc.poll() is not None) and not any(_running(p) for p in desc):
                    break
                time.sleep(0.05)
            else:
                killed = proc is not None and proc.poll() is None
                log.warning(
                    "engine %s (pid %d) did not exit within %.1f s of SIGTERM; SIGKILL",
                    self.label,
                    self.pid,
                    grace_s,
                )
            waited = time.monotonic() - t0
            _cgroup_kill(self.cgroup_path)
            kill_tree(self.pgid, desc + self._descendants(), signal.SIGKILL)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            self.exit_code = proc.poll()
        psutil.wait_procs([p for p in desc if _running(p)], timeout=2)
        self.end = _end_words(
            rc_before,
            self.exit_code,
            stopped,
            killed,
            waited,
            grace_s,
            [self.pid, *(p.pid for p in desc)],
            self.cgroup_path,
            self._create_time or None,
        )
        if self._enforcer is not None:
            self._enforcer.finish()
        return self.exit_code


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _end_words(
    rc_before: int | None,
    rc: int | None,
    stopped: bool,
    killed: bool,
    waited_s: float,
    grace_s: float,
    pids: list[int],
    cgroup_path: Path | None,
    since: float | None = None,
) -> dict[str, Any]:
    """How an engine ended, as :attr:`EngineHandle.end` holds it (see there)."""
    from perfkit.readings.oom import oom_record

    code = rc_before if rc_before is not None else rc
    sig = -code if code is not None and code < 0 else None
    oom = None
    if rc_before is not None:  # it ended by itself, before perfkit's teardown
        if sig is not None:
            how = f"was killed by signal {sig} ({_signal_name(sig)}, not sent by perfkit)"
            oom = oom_record(pids, cgroup_path, since=since)
        else:
            how = f"exited with code {code}"
        by_perfkit = False
    elif killed:
        how = f"did not exit within {grace_s:g} s of SIGTERM: killed by perfkit (SIGKILL) after {waited_s:.1f} s"
        by_perfkit = True
    else:
        how = f"ended on perfkit's SIGTERM after {waited_s:.1f} s (exit code {code})"
        by_perfkit = True
    if stopped:
        how = f"was stopped (SIGSTOP) when perfkit ended it; {how}"
    return {
        "how": how,
        "exit_code": code,
        "signal": sig,
        "by_perfkit": by_perfkit,
        "after_s": round(waited_s, 2),
        "stopped": stopped,
        "oom": oom,
    }


def _cgroup_kill(path: Path | None) -> None:
    """``cgroup.kill`` of the engine's own cgroup v2 (Linux >= 5.14), when it has one."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        (Path(path) / "cgroup.kill").write_text("1")


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when my launcher dies (Linux ``PR_SET_PDEATHSIG``).

    The engine runs in its own session (so its group can be signalled as a whole), which also
    means a killed launcher (a notebook kernel shut down by papermill, ``perfkit suite`` stopped
    by a CI cancel) would leave it running; the death signal closes that gap. SIGKILL, not
    SIGTERM: a stopped engine, or one that drains in-flight jobs on SIGTERM, would not act on
    SIGTERM. The engine's own children are ended by the owner (:mod:`perfkit.engine.owner`).
    Elsewhere: no-op.
    """
    _owner.die_with_parent(signal.SIGKILL)


# ---------------------------------------------------------------------------- launch
@contextlib.contextmanager
def launch(
    spec: EngineSpec,
    caps: MemoryCaps | None = None,
    run_dir: str | Path | None = None,
    label: str = "engine",
    grace_s: float | None = None,
    startup_timeout_s: float | None = None,
    nvml: Any = None,
) -> Iterator[EngineHandle]:
    """Start ``spec`` under ``caps``, wait for health, yield an :class:`EngineHandle`, tear down.

    Args:
        spec: the engine.
        caps: memory budgets (None: no caps). The host budget is clamped to what exists
            (:meth:`MemoryCaps.resolve`, unless already resolved) and the engine's environment
            gets the effective value.
        run_dir: directory for this run's launches (default: a new temporary directory).
        label: launch label; the launch directory is ``run_dir/<label>`` (``<label>-1``, … when
            taken).
        grace_s: seconds between SIGTERM and SIGKILL at teardown (default ``spec.stop_grace_s``).
        startup_timeout_s: overrides ``spec.startup_timeout_s``.
        nvml: NVML source for GPU matching, the baseline and the sampler (tests; default pynvml).

    GPUs: the engine's ``CUDA_VISIBLE_DEVICES`` (from the spec's env or this process's, as Ray
    sets it for a task) is resolved to NVML devices by UUID
    (:func:`~perfkit.readings.sampler.resolve_visible_gpus`); the first ``num_gpus`` of them
    (one for a ``command`` engine) are the ones read. When ``CUDA_DEVICE_ORDER`` is not set, the
    engine gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA's ordinals (integer entries, or
    ``cuda:N`` without the variable) are NVML's indices.

    Raises:
        PortInUseError: ``spec.port`` is set and taken (before anything is started).
        FileNotFoundError: ``spec.check()`` failed (e.g. sglang not installed).
        EngineStartError: the engine exited before ready (exit code and log tail in the message),
            was not ready within the timeout, or went over the host cap while starting.
        MemoryReadError: a cgroup limit or /proc/meminfo could not be read as a number.
    """
    spec.check()
    grace_s = float(spec.stop_grace_s if grace_s is None else grace_s)
    if caps is not None and not caps.resolved:
        caps = caps.resolve()
    timeout = float(startup_timeout_s if startup_timeout_s is not None else spec.startup_timeout_s)
    if spec.port is not None:
        if port_in_use(spec.port, spec.host):
            raise PortInUseError(
                f"port {spec.port} is already in use on {spec.host} "
                f"(EngineSpec.port); stop what holds it or leave port unset"
            )
        port = spec.port
    else:
        port = free_port(spec.host)

    base = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="perfkit-run-"))
    d = _unique_dir(base, label)
    perf_dir = d / "perf"
    perf_dir.mkdir()
    if spec.share_compile_cache:
        cache = base / "shared-cache"
    else:
        cache = d / "cache"
    (cache / "inductor").mkdir(parents=True, exist_ok=True)
    (cache / "triton").mkdir(parents=True, exist_ok=True)

    argv = spec.command(port, perf_dir)
    added: dict[str, str] = {}
    added.update(spec.env_for(perf_dir, port))
    if caps is not None:
        added.update(caps.env())
    added.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    added.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    added["PYTHONUNBUFFERED"] = "1"
    added["NCCL_NVLS_ENABLE"] = "0"
    env = dict(os.environ)
    env.update(added)

    from perfkit.readings.sampler import GpuResolveError, device_used_mib, resolve_visible_gpus

    n_gpus = spec.num_gpus if spec.kind != "command" else 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if "CUDA_DEVICE_ORDER" not in env:  # CUDA ordinals = NVML indices
        added["CUDA_DEVICE_ORDER"] = env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        gpus = resolve_visible_gpus(visible, nvml=nvml)[:n_gpus]
    except GpuResolveError as exc:
        log.warning("%s: %s; sampling NVML indices 0..%d instead", label, exc, n_gpus - 1)
        gpus = []
    gpu_indices = [g.index for g in gpus] or list(range(n_gpus))
    baseline = device_used_mib(gpu_indices, nvml=nvml)

    stdout_path, stderr_path = d / "stdout.log", d / "stderr.log"
    (d / "command.txt").write_text(" ".join(argv) + "\n")
    log.info("launching %s: %s (logs in %s)", label, " ".join(argv), d)
    with open(stdout_path, "wb") as out_fh, open(stderr_path, "wb") as err_fh:
        t_launch = time.time()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=out_fh,
                stderr=err_fh,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise EngineStartError(
                f"could not start engine {label!r}: {exc}", command=argv, run_dir=d
            ) from exc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    _register(StartedProcess(proc.pid, proc.pid, create_time, label, tuple(argv)))
    _owner.register(proc.pid, proc.pid, create_time, label)
    handle = EngineHandle(
        spec=spec,
        label=label,
        host=spec.host,
        port=port,
        pid=proc.pid,
        pgid=proc.pid,
        command=argv,
        env_added=added,
        run_dir=d,
        perf_log_dir=perf_dir,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        caps=caps,
        device_baseline_mib=baseline,
        gpus=[g.to_dict() for g in gpus],
        gpu_indices=gpu_indices,
        _nvml=nvml,
        _proc=proc,
        _create_time=create_time,
    )
    _LIVE[proc.pid] = handle
    try:
        handle._enforcer = (caps or MemoryCaps()).start(proc.pid, name=label)
        _wait_ready(handle, timeout, t_launch)
        log.info("engine %s ready in %.2f s at %s", label, handle.cold_start["ready_s"], handle.base_url)
        yield handle
    finally:
        handle._terminate(grace_s)
        log.info("engine %s stopped (exit code %s)", label, handle.exit_code)


def _wait_ready(h: EngineHandle, timeout: float, t_launch: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as client:
        while True:
            if not h.alive():
                time.sleep(0.1)  # let the last log lines land
                o = h.cap_outcome
                why = f"; {o.message}" if o.exceeded else ""
                raise EngineStartError(
                    f"engine {h.label!r} exited with code {h.exit_code} before it was ready{why}\n"
                    f"command: {' '.join(h.command)}\n--- last 50 log lines ({h.run_dir}) ---\n"
                    f"{h.tail(50)}",
                    exit_code=h.exit_code,
                    log_tail=h.tail(50),
                    cap_outcome=o,
                    command=h.command,
                    run_dir=h.run_dir,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineStartError(
                    f"engine {h.label!r} not ready after {timeout:g} s (GET {h.health_url} never "
                    f"answered 200)\ncommand: {' '.join(h.command)}\n--- last 50 log lines "
                    f"({h.run_dir}) ---\n{h.tail(50)}",
                    exit_code=None,
                    log_tail=h.tail(50),
                    cap_outcome=h.cap_outcome,
                    command=h.command,
                    run_dir=h.run_dir,
                )
            try:
                r = client.get(h.health_url, timeout=max(0.1, min(2.0, remaining)))
                if r.status_code == 200:
                    t_ready = time.time()
                    h.cold_start = cold_start_parts(h.marks(), t_launch, t_ready)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

"""A running engine (:class:`EngineHandle`): liveness, logs, records, sampler, launches row and
teardown (engines live at exit are ended); its cold start parts (:func:`cold_start_parts`) and
what starting one raises (:class:`EngineStartError`, :class:`PortInUseError`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from perfkit.common.frames import latent_frames
from perfkit.engine import owner as _owner
from perfkit.engine.caps import CapOutcome, HostCapEnforcer, MemoryCaps
from perfkit.engine.owner import StartedProcess, _register, _running
from perfkit.engine.spec import EngineSpec
from perfkit.readings import records as _records
from perfkit.readings.memory import oom_record

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class EngineStartError(RuntimeError):
    """The engine did not become ready: it exited, timed out, or could not be started. exit_code:
    negative for a signal, None if not ended; run_dir: None before it was made; end:
    :attr:`EngineHandle.end` once torn down."""

    message: str
    exit_code: int | None = None
    log_tail: str = ""
    cap_outcome: CapOutcome | None = None
    run_dir: Path | None = None
    end: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


class PortInUseError(EngineStartError):
    """The fixed port of the spec is taken."""


MARK_RE = re.compile(r"perfkit-mark[ \t]+(\w+)\b[^\n]*?(?<![\w])t=([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?\d+)?)")


_LIVE: dict[int, "EngineHandle"] = {}


@atexit.register
def _kill_live_at_exit() -> None:
    for h in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            h._terminate(grace_s=2.0)


def parse_marks(text: str) -> dict[str, float]:
    """``perfkit-mark <name> t=<epoch s>`` lines -> name -> t (the first of each name and line)."""
    out: dict[str, float] = {}
    for line in text.splitlines():  # one try per line, at its first mark: linear
        i = line.find("perfkit-mark")
        m = MARK_RE.match(line, i) if i >= 0 else None
        if m is not None:
            out.setdefault(m.group(1), float(m.group(2)))
    return out


#: sglang's line when its workers are ready (models loaded, pipeline built): CLOCK_MONOTONIC ns,
#: system-wide on Linux (sglang 0.5.23, multimodal_gen/runtime/launch_server.py)
SERVER_LOAD_RE = re.compile(r"\[server-load\] workers_ready_monotonic_ns=(\d+)(?!\S)")


def parse_server_load(text: str) -> int | None:
    """The first ``[server-load] workers_ready_monotonic_ns`` value (ns, CLOCK_MONOTONIC) or None."""
    m = SERVER_LOAD_RE.search(text)
    return int(m.group(1)) if m else None


#: sglang's startup warmup request as its progress bar / CI log line shows it: ``server warmup req
#: (96x64x9f, 2/50 steps)`` (``warmup req`` for the in-scheduler warmup); sglang 0.5.23,
#: multimodal_gen/runtime/server_warmup.py ``format_warmup_req``
WARMUP_REQ_RE = re.compile(r"\b(?:server )?warmup req \((\d+)x(\d+)(?:x(\d+)f)?, (\d+)(?:/(\d+))? steps?\)")


@dataclass(frozen=True)
class WarmupShape:
    """One startup warmup request's shape from sglang's log (pixels; num_frames after sglang's
    frame rule, 1 for an image); default_steps: the model's steps it stands in for (None: = steps)."""

    width: int
    height: int
    num_frames: int
    steps: int
    default_steps: int | None = None

    @property
    def latent_frames(self) -> int:
        """Latent frames by LTX frame math (:func:`perfkit.common.frames.latent_frames`)."""
        return latent_frames(self.num_frames)


def parse_warmup_shapes(text: str) -> list[WarmupShape]:
    """The distinct shapes of an engine log's ``server warmup req (WxHxNf, S/D steps)`` lines (sglang
    0.5.23, docs/sglang.md) in first-seen order, skipping ``ran out of memory`` segments."""
    out: dict[tuple[int, int, int], WarmupShape] = {}  # the first of each shape
    for seg in re.split(r"[\r\n]", text):
        if "warmup req" not in seg or "ran out of memory" in seg:
            continue
        for m in WARMUP_REQ_RE.finditer(seg):
            w, h, f, steps, default = m.groups()
            key = (int(w), int(h), int(f) if f else 1)
            out.setdefault(key, WarmupShape(*key, int(steps), int(default) if default else None))
    return list(out.values())


def boot_start_s(pid: int) -> float | None:
    """When ``pid`` was created, s on CLOCK_BOOTTIME (``/proc/<pid>/stat``, 10 ms ticks); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
        return int(stat[stat.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class LaunchClock:
    """Clocks read just before the start (epoch s, CLOCK_MONOTONIC ns, CLOCK_BOOTTIME s) and the
    process's creation on CLOCK_BOOTTIME (:func:`boot_start_s`)."""

    t_launch: float
    mono_ns: int
    boot_s: float
    pid_boot_s: float | None = None


def cold_start_parts(
    marks: dict[str, float],
    t_launch: float,
    t_ready: float | None,
    *,
    log_text: str = "",
    clock: LaunchClock | None = None,
    health: dict[str, Any] | None = None,
    engine: str = "the engine",
) -> dict[str, Any]:
    """The cold start parts (docs/DESIGN.md "cold start"): ``ready_s``, ``process_start_s``,
    ``models_loaded_s``, ``warmup_s`` (s, None: not measured), ``sources`` (part -> source or
    ``not reported by <engine>: <why>``), ``t_launch``, ``t_ready`` (epoch s), ``marks``. ``health``:
    the poll's ``first_status`` and ``t_first_503``; ``marks`` fill only parts nothing else measures.
    """
    health = health or {}
    src: dict[str, str] = {}
    out: dict[str, Any] = dict.fromkeys(("ready_s", "process_start_s", "models_loaded_s", "warmup_s"))
    if t_ready is not None:
        out["ready_s"], src["ready_s"] = t_ready - t_launch, "/health answered 200 (perfkit's poll)"
    if clock is not None and clock.pid_boot_s is not None:
        # the kernel truncates to its tick: a start in the launch's own tick reads 0
        out["process_start_s"] = max(0.0, clock.pid_boot_s - clock.boot_s)
        src["process_start_s"] = "OS: /proc/<pid>/stat starttime (10 ms ticks)"
    elif "process_start" in marks:
        out["process_start_s"], src["process_start_s"] = marks["process_start"] - t_launch, "perfkit-mark"
    ns = parse_server_load(log_text)
    if ns is not None and clock is not None:
        out["models_loaded_s"] = (ns - clock.mono_ns) / 1e9
        src["models_loaded_s"] = "engine log: [server-load] workers_ready_monotonic_ns"
    elif "models_loaded" in marks:
        out["models_loaded_s"], src["models_loaded_s"] = marks["models_loaded"] - t_launch, "perfkit-mark"
    t503 = health.get("t_first_503")
    if t503 is not None and t_ready is not None:
        out["warmup_s"], src["warmup_s"] = t_ready - t503, "/health 503 until 200 (perfkit's poll)"
    elif "warmup_done" in marks and "models_loaded" in marks:
        out["warmup_s"] = marks["warmup_done"] - marks["models_loaded"]
        src["warmup_s"] = "perfkit-mark warmup_done - models_loaded"
    why = {
        "ready_s": "/health never answered 200",
        "process_start_s": "no /proc/<pid>/stat to read and no process_start mark",
        "models_loaded_s": "no [server-load] workers_ready_monotonic_ns line in its log",
        "warmup_s": (
            f"/health answered {health['first_status']} at its first answer: no startup warmup held it"
            if health.get("first_status") == 200
            else "/health never answered 503 before 200 and no warmup marks"
        ),
    }
    for part, reason in why.items():
        src.setdefault(part, f"not reported by {engine}: {reason}")
    return {**out, "sources": src, "t_launch": t_launch, "t_ready": t_ready, "marks": dict(marks)}


def sources_text(cold_start: dict[str, Any]) -> str | None:
    """``part: source; ...`` of a cold start dict (the launches row's ``cold_start_sources``)."""
    src = cold_start.get("sources") or {}
    return "; ".join(f"{k.removesuffix('_s')}: {v}" for k, v in src.items()) or None


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


@dataclass
class EngineHandle:
    """A running engine; pid is also its process group's. device_baseline_mib: used before launch
    (NaN without NVML); gpus: {index, uuid, name} by NVML; end: set at teardown (docs/robustness.md
    "How it ended": how, exit_code, signal, by_perfkit, after_s, stopped, oom)."""

    spec: EngineSpec
    label: str
    port: int
    pid: int
    command: list[str]
    run_dir: Path
    _proc: subprocess.Popen = field(repr=False)
    caps: MemoryCaps | None = None
    cold_start: dict[str, Any] = field(default_factory=dict)
    device_baseline_mib: float = math.nan
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_indices: list[int] = field(default_factory=lambda: [0])
    exit_code: int | None = None
    _nvml: Any = field(default=None, repr=False)
    _enforcer: HostCapEnforcer | None = field(default=None, repr=False)
    end: dict[str, Any] = field(default_factory=dict)
    _create_time: float = field(default=0.0, repr=False)
    perf_log_dir: Path = field(init=False)
    stdout_path: Path = field(init=False)
    stderr_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.perf_log_dir, self.stdout_path, self.stderr_path = (
            self.run_dir / n for n in ("perf", "stdout.log", "stderr.log")
        )

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the engine (an IPv6 host in brackets)."""
        h = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{h}:{self.port}"

    @property
    def health_url(self) -> str:
        """The engine's health URL."""
        return self.base_url + self.spec.health_path

    @property
    def cap_outcome(self) -> CapOutcome:
        """Live host cap outcome (enforcement, exceeded, message, peak_rss_gib)."""
        return self._enforcer.outcome if self._enforcer is not None else CapOutcome(message="no host cap")

    @property
    def perf_log_path(self) -> Path:
        """The engine's perf log file (in ``perf_log_dir``)."""
        return self.perf_log_dir / _records.PERF_LOG_NAME

    def alive(self) -> bool:
        """True while the root process runs."""
        self.exit_code = self._proc.poll()
        return self.exit_code is None

    def health(self, timeout_s: float = 2.0) -> bool:
        """One ``GET health_path``: True on 200 (False when dead, refused or timed out)."""
        import httpx  # here, not at the top: only where a request is sent (a replay sends none)

        if not self.alive():
            return False
        try:
            return httpx.get(self.health_url, timeout=timeout_s, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def tail(self, n: int = 50) -> str:
        """Last ``n`` lines of stdout, then of stderr, each labelled."""
        files = {"stdout": self.stdout_path, "stderr": self.stderr_path}
        return "\n".join(f"[{k}]\n" + "\n".join(t) for k, p in files.items() if (t := _tail_file(p, n)))

    def records(self) -> list[_records.PerfRecord]:
        """Records in ``performance.log`` so far (malformed lines skipped)."""
        return _records.read_perf_log(self.perf_log_path).records

    @property
    def cgroup_path(self) -> Path | None:
        """The engine's own cgroup (v2) directory while the cap holds it there, else None."""
        return self._enforcer.cgroup_path if self._enforcer is not None else None

    def sampler(self, interval_s: float = 0.1):
        """A (not started) MemorySampler of this engine's GPUs, baseline and cgroup."""
        from perfkit.readings.sampler import MemorySampler

        return MemorySampler(
            self.pid,
            interval_s=interval_s,
            gpu_index=self.gpu_indices,
            baseline_device_mib=self.device_baseline_mib,
            cgroup_path=self.cgroup_path,
            nvml=self._nvml,
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
            "cold_start_sources": sources_text(cs),
            "warmup_frames": self.spec.startup_warmup_frames(),
            "device_cap_gib": caps.device_gib if caps else None,
            "host_cap_gib": caps.host_gib if caps else None,
            # as asked, and in force (clamped), as the enforcer holds them
            "host_cap_asked_gib": o.host_cap_asked_gib,
            "host_cap_effective_gib": o.host_cap_gib,
            "host_cap_clamp": o.host_cap_clamp,
            "enforcement": o.enforcement,
            "cap_mechanism": o.mechanism,
            "host_source": o.host_source,
            "host_pss_peak_mib": o.peak_pss_gib * 1024 if o.peak_pss_gib is not None else None,
            "cgroup_peak_mib": o.peak_cgroup_gib * 1024 if o.peak_cgroup_gib is not None else None,
            "cap_exceeded": o.exceeded,
            "command": " ".join(self.command),
            "exit_code": self.exit_code,
        }

    def _descendants(self) -> list[psutil.Process]:
        found = dict(self._enforcer.known) if self._enforcer is not None else {}
        found.update({p.pid: p for p in _owner.tree(self.pid, since=self._create_time)})
        return [p for pid, p in found.items() if pid != self.pid]

    def _terminate(self, grace_s: float = 10.0) -> int | None:
        """End the engine's tree (docs/robustness.md "Teardown") and set :attr:`end`."""
        _LIVE.pop(self.pid, None)
        if self._enforcer is not None:
            self._enforcer.stop()
        desc = self._descendants()
        for p in desc:
            with contextlib.suppress(psutil.Error):
                _register(StartedProcess(p.pid, self.pid, p.create_time(), f"{self.label} (child)", ()))
        rc_before = self._proc.poll()
        procs = dict.fromkeys((p for p in desc if _running(p)), self.label)
        root = None
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid) if rc_before is None else None  # our child: not reaped yet
        if root is not None:
            procs[root] = self.label
        ended = {e.pid: e for e in _owner.end_processes(procs, grace_s)}
        if procs:
            with contextlib.suppress(OSError):  # cgroup.kill: Linux >= 5.14
                if self.cgroup_path is not None:
                    (self.cgroup_path / "cgroup.kill").write_text("1")
            _owner.kill_tree([self.pid], self._descendants(), signal.SIGKILL)
        mine = ended.get(self.pid)
        if mine is not None and mine.killed:
            log.warning(
                "engine %s (pid %d) did not exit within %.1f s of SIGTERM; SIGKILL",
                self.label,
                self.pid,
                grace_s,
            )
        if getattr(root, "returncode", None) is not None:  # psutil reaped it: Popen cannot
            self._proc.returncode = int(root.returncode)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        self.exit_code = self._proc.poll()
        code = self.exit_code
        sig = -code if code is not None and code < 0 else None
        stopped, killed = mine is not None and mine.stopped, mine is not None and mine.killed
        waited = max((e.after_s for e in ended.values()), default=0.0)
        how, oom = f"ended on perfkit's SIGTERM after {waited:.1f} s (exit code {code})", None
        if rc_before is not None and sig is not None:  # it ended by itself, before the teardown
            how = f"was killed by signal {sig} ({_owner.signal_name(sig)}, not sent by perfkit)"
            oom = oom_record(
                [self.pid, *(p.pid for p in desc)], self.cgroup_path, since=self._create_time or None
            )
        elif rc_before is not None:
            how = f"exited with code {code}"
        elif killed:
            how = f"did not exit within {grace_s:g} s of SIGTERM: killed by perfkit (SIGKILL) after {waited:.1f} s"
        if stopped:
            how = f"was stopped (SIGSTOP) when perfkit ended it; {how}"
        self.end = {
            "how": how,
            "exit_code": code,
            "signal": sig,
            "by_perfkit": rc_before is None,
            "after_s": round(waited, 2),
            "stopped": stopped,
            "oom": oom,
        }
        if self._enforcer is not None:
            self._enforcer.finish()
        return self.exit_code

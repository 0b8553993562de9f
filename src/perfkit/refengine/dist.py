"""CFG parallelism for the reference engine (``--num-gpus N``, N > 1): rank 0 serves and broadcasts
each request, each rank computes one guidance branch per step, the predictions are all-gathered
(docs/refengine.md, "CFG parallelism")."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime as _dt
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

#: Collective timeout (s), which bounds the idle time between requests; PERFKIT_DIST_TIMEOUT_S.
DEFAULT_TIMEOUT_S = 24 * 3600.0
#: Seconds rank 0 waits for an in-flight request after a peer died before it exits (code 3).
STUCK_EXIT_S = 10.0


def timeout() -> _dt.timedelta:
    """The collective timeout: PERFKIT_DIST_TIMEOUT_S or :data:`DEFAULT_TIMEOUT_S` (s)."""
    return _dt.timedelta(seconds=float(os.environ.get("PERFKIT_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))


def make_store(init: str | None, world_size: int, master: bool):
    """(TCPStore, ``tcp://HOST:PORT`` for the other ranks): rank 0's (``master``; without ``init``
    on a free port) or a client of it. ValueError: ``init`` is not ``tcp://HOST:PORT``."""
    from torch.distributed import TCPStore

    host, port = "127.0.0.1", "0"
    if init:
        if not init.startswith("tcp://") or ":" not in init[6:]:
            raise ValueError(f"--dist-init must look like tcp://HOST:PORT, got {init!r}")
        host, port = init[6:].rsplit(":", 1)
    kw = {"wait_for_workers": False} if master else {}
    store = TCPStore(host, int(port), world_size, is_master=master, timeout=timeout(), **kw)
    return store, f"tcp://{host}:{store.port}"


@dataclass
class CfgParallel:
    """One rank's view of the CFG-parallel group; ``control``: the gloo group for requests and
    reports (None: the default group is gloo)."""

    rank: int
    world_size: int
    device: torch.device
    control: Any = None
    _marks: list = field(default_factory=list, repr=False)

    def begin_request(self) -> None:
        """Start collecting this request's per-step compute/gather split."""
        self._marks = []

    def step_split(self) -> tuple[list[float], list[float]]:
        """(transformer ms, all_gather ms) per step of the request, in call order."""
        compute, gather = [], []
        for a, b, c in self._marks:
            if isinstance(a, float):
                compute.append(round((b - a) * 1000.0, 3))
                gather.append(round((c - b) * 1000.0, 3))
            else:
                c.synchronize()
                compute.append(round(a.elapsed_time(b), 3))
                gather.append(round(b.elapsed_time(c), 3))
        self._marks = []
        return compute, gather

    def _mark(self):
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def noise(
        self,
        predict: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        latents: torch.Tensor,
        embeds: torch.Tensor,
        mask: torch.Tensor,
        cfg: bool,
        guidance: float,
    ) -> torch.Tensor:
        """This rank's branch through ``predict``, gathered with the others, combined (CFG:
        ``embeds``/``mask`` are [unconditional (rank 0), conditional (rank 1)])."""
        import torch.distributed as dist

        branches = 2 if cfg else 1
        t0 = self._mark()
        if self.rank < branches:
            b = slice(self.rank, self.rank + 1) if cfg else slice(None)
            local = predict(latents, embeds[b], mask[b])
        else:
            local = torch.zeros(latents.shape, dtype=torch.float32, device=latents.device)
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        t1 = self._mark()
        dist.all_gather(parts, local)
        self._marks.append((t0, t1, self._mark()))
        return parts[0] + guidance * (parts[1] - parts[0]) if cfg else parts[0]

    def broadcast(self, msg: Any = None) -> Any:
        """Rank 0 sends ``msg``; every rank returns it."""
        import torch.distributed as dist

        box = [msg]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (rank order); None elsewhere."""
        import torch.distributed as dist

        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out


def init(rank: int, world_size: int, store, device: torch.device) -> CfgParallel:
    """Join the process group (``store``: rank 0's TCPStore, or a client of it)."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout())
    control = dist.new_group(backend="gloo", timeout=timeout()) if backend != "gloo" else None
    log.info("rank %d/%d joined (%s on %s)", rank, world_size, backend, device)
    return CfgParallel(rank, world_size, device, control)


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGKILL the child when rank 0 dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here, not between fork and exec
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn_ranks(argv: list[str], world_size: int, init_url: str) -> list[subprocess.Popen]:
    """Start ranks 1..world_size-1 (``python -m perfkit.refengine ARGV --rank r ...``), dying with rank 0."""
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}
    procs = []
    hook = _pdeathsig_hook()
    for r in range(1, world_size):
        cmd = [sys.executable, "-m", "perfkit.refengine", *argv, "--rank", str(r)]
        cmd += ["--world-size", str(world_size), "--dist-init", init_url]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env, preexec_fn=hook))
        log.info("started rank %d (pid %d)", r, procs[-1].pid)
    return procs


def stop_ranks(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM the ranks, wait ``grace_s``, SIGKILL those left; reaps them all."""
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def rank_report(res, rank: int, device: torch.device, snapshots: dict[str, Any]) -> dict[str, Any]:
    """One rank's part of a record: stages, steps, compile window, memory, host RSS."""
    from perfkit.refengine.jobs import host_memory, run_fields

    rt = snapshots.get("runtime_peak") or {}
    return {
        "rank": rank,
        "device": str(device),
        **run_fields(res),
        "peak_allocated_mb": rt.get("peak_allocated_mb"),
        "peak_reserved_mb": rt.get("peak_reserved_mb"),
        "memory_snapshots": {k: v for k, v in snapshots.items() if v is not None},
        "cfg_compute_ms": list(res.cfg_compute_ms),
        "cfg_gather_ms": list(res.cfg_gather_ms),
        **host_memory(),
    }


class Rank0Runner:
    """Rank 0's pipeline front: :meth:`run` broadcasts each request, runs rank 0's part and gathers
    the reports; ``fatal`` is set once the group is unusable (a rank dying while loading: exit 3)."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.pipe = None
        self.par: CfgParallel | None = None
        self.procs = procs
        self.fatal: str | None = None
        self.busy = False
        self.ready = False
        self.stopping = False
        self._seq = 0
        self._monitor = threading.Thread(target=self._watch, name="rank-monitor", daemon=True)
        self._monitor.start()

    def attach(self, pipe, par: CfgParallel) -> None:
        """The pipeline and group, once built."""
        self.pipe, self.par = pipe, par

    def run(self, req, keep_output: bool = False, slow: bool = False):
        """Run one request on every rank; the result carries the ranks' reports.
        Raises RuntimeError once the group is unusable (and re-raises a run's error, marking it so)."""
        from perfkit.refengine.profiling import snapshot

        if self.fatal:
            raise RuntimeError(f"multi-rank engine unusable: {self.fatal}")
        self.busy = True
        try:
            self.par.broadcast({"op": "run", "seq": self._seq, "req": dataclasses.asdict(req)})
            self._seq += 1
            res = self.pipe.run(req, keep_output=keep_output, slow=slow)
            dev = self.pipe.device
            mine = rank_report(res, 0, dev, {"runtime_peak": snapshot(dev)})
            res.ranks = self.par.gather(mine)
            return res
        except BaseException as exc:
            self._fail(f"rank 0: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.busy = False

    def _fail(self, why: str) -> None:
        if self.fatal:
            return
        self.fatal = why
        log.error(
            "multi-rank engine unusable (%s): stopping the other ranks; rank 0 stays up, unhealthy", why
        )
        self.stopping = True
        stop_ranks(self.procs, grace_s=2.0)

    def _watch(self) -> None:
        while not self.stopping:
            for r, p in enumerate(self.procs, start=1):
                rc = p.poll()
                if rc is None or self.stopping:
                    continue
                why = f"rank {r} (pid {p.pid}) exited with code {rc}"
                if rc in (-signal.SIGTERM, -signal.SIGINT):
                    log.warning("rank %d was stopped by signal %d (teardown of the process group?)", r, -rc)
                if not self.ready:
                    log.error("%s during startup", why)
                    stop_ranks(self.procs, grace_s=1.0)
                    os._exit(3)
                self._fail(why)
                deadline = time.monotonic() + STUCK_EXIT_S
                while self.busy and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self.busy:
                    log.error("a request is stuck in a collective with a dead rank: exiting")
                    os._exit(3)
                return
            time.sleep(0.2)

    def shutdown(self) -> None:
        """Stop the other ranks (rank 0 is exiting)."""
        self.stopping = True
        stop_ranks(self.procs)


def worker_loop(pipe, par: CfgParallel, warmup_first: bool, snapshots: dict[str, Any]) -> int:
    """Serve rank 0's broadcasts until told to stop; returns the exit code. ``warmup_first``: the
    first run is the startup warmup."""
    from perfkit.refengine.jobs import GenRequest
    from perfkit.refengine.profiling import snapshot

    dev = pipe.device
    n = 0
    while True:
        msg = par.broadcast(None)
        if not msg or msg.get("op") != "run":
            log.info("rank %d: stop", par.rank)
            return 0
        req = GenRequest(**msg["req"])
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            res = pipe.run(req, keep_output=False)
        except BaseException:
            log.exception("rank %d: request %d failed; this rank exits", par.rank, msg.get("seq"))
            return 1
        snap = snapshot(dev)
        if n == 0 and warmup_first:
            snapshots["warmup_peak"] = snap
        par.gather(rank_report(res, par.rank, dev, {**snapshots, "runtime_peak": snap}))
        n += 1

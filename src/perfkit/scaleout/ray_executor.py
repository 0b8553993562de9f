"""The Ray executor: :func:`run_units_ray`, one Ray task per unit of work; ``ray`` is imported
lazily (``perfkit[ray]``). See docs/scale-out.md ("The Ray executor")."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import socket
import tarfile
import tempfile
import time
import traceback
import uuid
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from perfkit.common import MissingExtra, require_extra
from perfkit.scaleout import units as _units
from perfkit.scaleout.units import ExecutorError, UnitOutcome

log = logging.getLogger(__name__)

#: env var prefixes shipped to the workers (names that look like secrets are not)
ENV_PREFIXES = ("PERFKIT_", "HF_", "HUGGINGFACE_", "SGLANG_", "TRANSFORMERS_", "NCCL_")
_SECRET = re.compile(r"token|secret|password|passwd|api_?key|access_?key|auth", re.I)
LOG_TAIL_LINES = 200


def _import_ray():
    try:
        require_extra("ray", "the Ray executor")
    except MissingExtra as exc:
        raise ExecutorError(str(exc)) from None
    import ray

    return ray


def unit_dir_name(unit_id: str) -> str:
    """A unit's directory name: its id, unsafe characters replaced by ``_``."""
    safe = re.sub(r"[^A-Za-z0-9._=+@-]+", "_", str(unit_id)).strip(".")
    return safe or "unit"


def pack_dir(path: str | Path) -> bytes:
    """A directory's contents as a gzip'd tar archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for p in sorted(Path(path).rglob("*")):
            tar.add(p, arcname=p.relative_to(path).as_posix(), recursive=False)
    return buf.getvalue()


def unpack_dir(data: bytes, dest: str | Path) -> Path:
    """Unpack a :func:`pack_dir` archive into ``dest`` (emptied first). Raises tarfile.TarError for
    a bad archive or a member landing outside ``dest``."""
    d = Path(dest)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        tar.extractall(d, filter="data")
    return d


class _TailHandler(logging.Handler):
    def __init__(self, n: int) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=n)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001
            pass


def _gpus_here() -> list[str]:
    """The NVML UUIDs of this task's Ray GPUs ([] when none or without NVML)."""
    try:
        import ray

        ids = [str(i) for i in ray.get_gpu_ids()]
    except Exception:  # noqa: BLE001
        ids = []
    if not ids:
        return []
    try:
        from perfkit.readings.sampler.nvml import resolve_visible_gpus

        refs = resolve_visible_gpus(",".join(ids))
    except Exception as exc:  # noqa: BLE001
        log.debug("GPU ids %s not resolved to NVML devices: %s", ids, exc)
        refs = []
    return [r.uuid for r in refs]


class _Sender:
    """Puts ``(event, unit id)`` on the driver's queue without waiting; never raises."""

    def __init__(self, events: Any, unit_id: str) -> None:
        self.events, self.unit_id, self.refs = events, unit_id, []
        self.token = uuid.uuid4().hex  # events are numbered per attempt: the queue may reorder them

    def __call__(self, event: str) -> None:
        if self.events is None:
            return
        try:
            item = (event, self.unit_id, self.token, len(self.refs))
            self.refs.append(self.events.actor.put_nowait.remote(item))
        except Exception as exc:  # noqa: BLE001
            log.debug("progress event %s of %s not sent: %s", event, self.unit_id, exc)

    def flush(self, timeout_s: float = 10.0) -> None:
        if not self.refs:
            return
        try:
            import ray

            ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001
            log.debug("progress events of %s not confirmed: %s", self.unit_id, exc)


def _set_omp(value: str | None) -> None:
    if value is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = value


def run_one(
    unit: Mapping[str, Any], run_unit: _units.RunUnit, events: Any = None, omp_threads: str | None = None
) -> tuple[UnitOutcome, bytes]:
    """The Ray task's body: run one unit, sending events to ``events`` (None: none). Returns its
    outcome (without ``attempts``, ``out_dir``) and :func:`pack_dir` of its output."""
    from perfkit.measuring.progress import listening

    send = _Sender(events, str(unit["id"]))
    send("started")
    started = time.time()
    gpu_uuids = _gpus_here()
    handler = _TailHandler(LOG_TAIL_LINES)
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    status, error = "ok", None

    # a listener also keeps the worker from drawing its own bars
    def on_progress(ev: Mapping[str, Any]) -> None:
        if ev.get("event") == "launch_done":
            send("launch")

    ray_omp = os.environ.get("OMP_NUM_THREADS")
    _set_omp(omp_threads)
    with tempfile.TemporaryDirectory(prefix=f"perfkit-unit-{unit_dir_name(unit['id'])}-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        try:
            with listening(on_progress):
                run_unit(unit, out)
        except BaseException as exc:  # noqa: BLE001
            status = "error"
            error = f"{type(exc).__name__}: {exc}"
            handler.lines.extend(traceback.format_exc().rstrip().splitlines())
        finally:
            root.removeHandler(handler)
            root.setLevel(old_level)
            _set_omp(ray_omp)
        ended = time.time()
        send.flush()
        tail = "\n".join(handler.lines) + _units.newest_log_tail(out) if status == "error" else None
        archive = pack_dir(out)
    host = socket.gethostname()
    oc = UnitOutcome(str(unit["id"]), status, wall_s=round(ended - started, 2), error=error, log_tail=tail)
    return replace(oc, host=host, gpu_uuids=gpu_uuids, started_at=started, ended_at=ended), archive


def default_runtime_env(address: str | None = None) -> dict[str, Any]:
    """``env_vars`` (:data:`ENV_PREFIXES`) and perfkit's source: on ``PYTHONPATH`` for a local Ray
    (``address=None``), else as ``py_modules``."""
    pkg = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and not _SECRET.search(k)}
    rt: dict[str, Any] = {"env_vars": env}
    if address is None:
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg.parent.name not in ("site-packages", "dist-packages"):
            paths.insert(0, str(pkg.parent))
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    else:
        rt["py_modules"] = [str(pkg)]
    return rt


def _error_of(exc: BaseException) -> tuple[str, str]:
    """(one-line error, log tail) of an exception of ``ray.get``."""
    text = str(exc).strip()
    name = type(exc).__name__
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        inner = str(cause).strip().splitlines()
        msg = inner[-1] if inner else ""
        return f"{name}({type(cause).__name__}): {msg}".rstrip(": "), text[-20_000:]
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    return f"{name}: {first}" if first else name, text[-20_000:]


def run_units_ray(
    units: Sequence[Mapping[str, Any]],
    run_unit: _units.RunUnit,
    dest: str | Path,
    *,
    address: str | None = None,
    retries: int = 0,
    on_event: _units.OnEvent | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> list[UnitOutcome]:
    """Run ``units`` as Ray tasks, each one's output unpacked to ``dest/<unit id>/``; one outcome
    per unit, in order (``address``, ``runtime_env``: docs/scale-out.md). Raises ExecutorError (no
    ray, or Ray not started or joined), ValueError (a missing or duplicate id, bad ``gpus``,
    ``retries`` < 0)."""
    emit = _units.check_retries(retries, on_event)
    ids = _checked_ids(units)
    ray = _import_ray()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    started_here, job_env = _ray_session(ray, address, runtime_env)
    events = _event_queue(ray)
    held: dict[tuple[str, str], dict[int, str]] = {}  # (unit, token) -> {n: event} not yet emitted
    next_n: dict[tuple[str, str], int] = {}
    try:
        task = ray.remote(run_one)
        cpu_unit_cpus = _smallest_node_cpus(ray)

        def drain() -> None:
            if events is None:
                return
            try:
                got = events.get_nowait_batch(events.qsize())
            except Exception as exc:  # noqa: BLE001
                log.debug("progress events not read: %s", exc)
                return
            for ev, uid, token, n in got:
                held.setdefault((uid, token), {})[n] = ev
            for (uid, token), evs in list(held.items()):
                while (n := next_n.get((uid, token), 0)) in evs:
                    emit(evs.pop(n), uid, None)
                    next_n[(uid, token)] = n + 1

        def flush(uid: str) -> None:
            for key in [k for k in held if k[0] == uid]:
                for n in sorted(held[key]):
                    emit(held[key][n], uid, None)
                del held[key]

        def submit(u: Mapping[str, Any]):
            gpus = int(u.get("gpus", 0))
            cpus = u.get("cpus")
            opts: dict[str, Any] = {
                "num_gpus": gpus,
                "num_cpus": float(cpus if cpus is not None else (1 if gpus else cpu_unit_cpus)),
                "max_retries": 0,  # the driver retries itself
                "retry_exceptions": False,
            }
            if job_env is not None:
                opts["runtime_env"] = job_env
            return task.options(name=f"perfkit-unit-{unit_dir_name(u['id'])}", **opts).remote(
                dict(u), run_unit, events, os.environ.get("OMP_NUM_THREADS")
            )

        pending: dict[Any, tuple[int, int]] = {}  # ref -> (unit index, attempt)
        for i, u in enumerate(units):
            pending[submit(u)] = (i, 1)
        results: list[UnitOutcome | None] = [None] * len(units)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            drain()
            if not ready:
                continue
            ref = ready[0]
            i, attempt = pending.pop(ref)
            oc = _collect(ray, ref, ids[i], attempt, dest)
            flush(ids[i])
            if _units.settle(units[i], oc, retries, dest / unit_dir_name(ids[i]), emit):
                results[i] = oc
            else:
                pending[submit(units[i])] = (i, attempt + 1)
        return [r for r in results if r is not None]
    finally:
        if events is not None:
            try:
                events.shutdown(force=True)
            except Exception:  # noqa: BLE001
                pass
        if started_here:
            ray.shutdown()


def _checked_ids(units: Sequence[Mapping[str, Any]]) -> list[str]:
    ids = [str(u.get("id", "")) for u in units]
    if any(not i for i in ids):
        raise ValueError("every unit needs an 'id'")
    if len(set(map(unit_dir_name, ids))) != len(ids):
        raise ValueError(f"unit ids are not unique (as directory names): {ids}")
    for u in units:
        g = u.get("gpus", 0)
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ValueError(f"unit {u['id']!r}: gpus must be a non-negative int, got {g!r}")
    return ids


def _ray_session(
    ray: Any, address: str | None, runtime_env: Mapping[str, Any] | None
) -> tuple[bool, dict[str, Any] | None]:
    """(whether Ray was started or joined here, each task's runtime_env)."""
    if not ray.is_initialized():
        env, extra = default_runtime_env(address), dict(runtime_env or {})
        env = {**env, **extra, "env_vars": {**env["env_vars"], **extra.get("env_vars", {})}}
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray"
            raise ExecutorError(f"could not start or join {where}: {exc}") from None
        return True, None
    # a Ray started elsewhere keeps its environment: only an explicit runtime_env is added
    if address is not None:
        log.warning("Ray is already initialised in this process: address %r not used", address)
    return False, dict(runtime_env) if runtime_env else None


def _event_queue(ray: Any) -> Any:
    """A queue actor for workers' progress events, or None."""
    try:
        from ray.util.queue import Queue

        return Queue(actor_options={"num_cpus": 0})
    except Exception as exc:  # noqa: BLE001
        log.warning("no progress events from Ray workers: %s", exc)
        return None


def _smallest_node_cpus(ray: Any) -> float:
    """CPUs of the smallest alive node (1 when Ray does not say)."""
    try:
        cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001
        cpus = []
    cpus = [c for c in cpus if c > 0]
    return float(min(cpus)) if cpus else 1.0


def _collect(ray: Any, ref: Any, unit_id: str, attempt: int, dest: Path) -> UnitOutcome:
    """The outcome of one finished attempt (its archive unpacked to ``dest/<unit id>/``)."""
    try:
        oc, archive = ray.get(ref)
    except Exception as exc:  # noqa: BLE001
        err, tail = _error_of(exc)
        return UnitOutcome(unit_id, "error", attempts=attempt, error=err, log_tail=tail)
    oc.attempts = attempt
    try:
        oc.out_dir = unpack_dir(archive, dest / unit_dir_name(unit_id))
    except (tarfile.TarError, OSError) as exc:
        oc.status, oc.error = "error", f"the unit's output did not unpack: {type(exc).__name__}: {exc}"
    return oc

"""One notebook executed with papermill on an IPC kernel running this Python, and its parameters
from the suite params: :func:`execute_notebook`, :func:`notebook_parameters`, :class:`NotebookRun`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.common.provenance import repo_root
from perfkit.gate.verdicts import GATE, GATE_FAILED, jsonable
from perfkit.measuring.progress import PROGRESS_ENV
from perfkit.params import SuiteParams
from perfkit.report.render import notebook_error
from perfkit.suite.preflight import NO_REPLAY_BUNDLE, SuiteError

log = logging.getLogger(__name__)


KERNEL_NAME = "python3"


def notebooks_dir() -> Path:
    env = os.environ.get("PERFKIT_NOTEBOOKS")
    return Path(env) if env else repo_root() / "notebooks"


@dataclass
class NotebookRun:
    name: str
    status: str = "pending"  # ok, error, skipped
    wall_s: float | None = None
    error: str | None = None
    ename: str | None = None
    output: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    #: why a notebook was skipped (disabled in the params, not selected, no bundle to replay)
    reason: str | None = None
    #: processes its kernel started that outlived it and the suite (their owner) ended:
    #: {pid, label, how, killed, after_s, stopped} each (:class:`perfkit.engine.owner.Ended`)
    outlived: list[dict[str, Any]] = field(default_factory=list)
    #: the launch and request under way when a failed notebook's kernel stopped
    #: (:func:`perfkit.measuring.progress.in_flight`), None when no launch was cut short
    in_flight: dict[str, Any] | None = None


def kernel_name() -> str:
    """A kernel that runs this Python (``python3`` resolves to ``sys.executable``; otherwise a
    ``perfkit`` kernelspec pointing at this interpreter is installed under ``sys.prefix``)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec(KERNEL_NAME)
        exe = spec.argv[0] if spec.argv else ""
        if (
            exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")
            or Path(exe).resolve() == Path(sys.executable).resolve()
        ):
            return KERNEL_NAME
        log.info("kernel python3 runs %s, not %s: using a perfkit kernel", exe, sys.executable)
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install

    install(kernel_name="perfkit", display_name="Python (perfkit)", prefix=sys.prefix)
    return "perfkit"


@functools.cache
def ipc_kernel_manager():
    """A jupyter_client kernel manager whose local kernel listens on IPC sockets, not TCP
    (ipykernel warns that unencrypted TCP is readable by anyone on the host); built on first use
    (GPU hosts without the Jupyter stack never import it)."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Unicode

    class _IPCKernelManager(AsyncKernelManager):
        transport = Unicode("ipc")

    return _IPCKernelManager


@contextlib.contextmanager
def _env(key: str, value: str):
    """Set ``os.environ[key]`` for the block (kernels started meanwhile inherit it)."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


@contextlib.contextmanager
def _stderr_to(path: Path | None):
    """Send file descriptor 2 (ours and the kernel's, which inherits it) to ``path``."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def execute_notebook(
    src: str | Path,
    dst: str | Path,
    parameters: Mapping[str, Any],
    *,
    cwd: str | Path | None = None,
    timeout_s: float | None = None,
    kernel: str | None = None,
    kernel_log: str | Path | None = None,
    progress_file: str | Path | None = None,
) -> NotebookRun:
    """Run one notebook with papermill; never raises for a failing notebook (a last cell's
    :class:`perfkit.gate.verdicts.GateFailed` is status ``ok``: the gate result is in its
    verdict.json). ``kernel_log`` takes the kernel's stderr and papermill's log lines;
    ``progress_file`` the kernel's progress events (default ``<dst>.progress.jsonl``).
    """
    import papermill as pm

    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=src.stem, output=str(dst), parameters=jsonable(dict(parameters)))
    t0 = time.monotonic()
    pfile = Path(progress_file) if progress_file else dst.with_suffix(".progress.jsonl")
    try:
        with _stderr_to(Path(kernel_log) if kernel_log else None), _env(PROGRESS_ENV, str(pfile)):
            pm.execute_notebook(
                str(src),
                str(dst),
                parameters=dict(parameters),
                kernel_name=kernel or kernel_name(),
                cwd=str(cwd) if cwd else None,
                progress_bar=False,
                log_output=False,
                execution_timeout=int(timeout_s) if timeout_s else None,
                kernel_manager_class=ipc_kernel_manager(),
            )
        run.status = "ok"
    except Exception as exc:  # noqa: BLE001 - papermill errors, dead kernels, timeouts
        ename, text = notebook_error(dst) if dst.exists() else (None, None)
        if (ename or getattr(exc, "ename", None)) == GATE_FAILED:
            # the last cell's gate exception (fail_on="gate"): the notebook ran to its end and
            # wrote its verdict; the gate result comes from verdict.json, not from this
            run.status, run.ename = "ok", GATE_FAILED
        else:
            run.status, run.ename = "error", ename or type(exc).__name__
            run.error = text or f"{type(exc).__name__}: {exc}"
            log.error("notebook %s failed: %s", src.name, run.error)
    run.wall_s = round(time.monotonic() - t0, 2)
    return run


def notebook_parameters(
    name: str, params: SuiteParams, run_dir: Path, replay: Path | None = None
) -> dict[str, Any]:
    """Papermill parameters of one notebook, from the suite params."""
    common = {
        "run_dir": str(run_dir),
        "engine": params.engine_dict(),
        "request": params.request.model_dump(),
        # every key, None included: the notebook merges them over the defaults, so a limit the
        # params file turns off (null) must reach it as None, not be left out
        "invariants": params.invariants.model_dump(),
        # the suite reads each verdict.json itself: a failed gate is a regression (exit 1), not
        # a notebook error, so the notebooks never raise for it here (perfkit.gate.verdicts)
        "fail_on": "never",
    }
    if name == GATE:
        b, keys = params.baseline, ("profile", "strict", "hardware")
        return {**common, "baseline_file": b.file, **{k: getattr(b, k) for k in keys}}
    sec = getattr(params, name).model_dump(exclude={"enabled", "tier"})
    bundle_dir = None
    if replay is not None:
        if not (replay / name / "meta.json").exists():  # a replay never launches an engine
            raise SuiteError(f"--replay {replay}: no {name} bundle ({NO_REPLAY_BUNDLE})")
        bundle_dir = str(replay / name)
    return {**common, **sec, "bundle_dir": bundle_dir}

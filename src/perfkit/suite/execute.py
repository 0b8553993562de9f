"""One notebook executed with papermill (:func:`execute_owned`) and its parameters; what the
suite checks and prepares before anything runs: the baseline file, the replay directory, the run
directory and its ``latest`` link, the launch plan (docs/suite.md, "The run directory")."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfkit.bundle import identity_differences, read_meta
from perfkit.common.outdirs import stamped_dir
from perfkit.common.provenance import repo_root
from perfkit.common.slugs import slug
from perfkit.engine.owner import REGISTRY_ENV, Watch, describe
from perfkit.gate import baseline as bl
from perfkit.gate.run import resolve_baseline_file
from perfkit.gate.verdicts import GATE, GATE_FAILED, RUN_FILE, jsonable
from perfkit.gate.verdicts import notebooks as notebook_names
from perfkit.investigations import registry
from perfkit.measuring.progress import PROGRESS_ENV, RunBars, in_flight, planned_requests
from perfkit.params import ParamsError, SuiteParams
from perfkit.report.runinfo import notebook_error

log = logging.getLogger(__name__)


LATEST = "latest"


def outputs_base(name: str) -> Path:
    """``outputs/<name>`` (slugged): where the runs of one params file or notebook land."""
    return Path("outputs") / slug(name)


def default_out(name: str) -> Path:
    """A new run directory ``outputs/<name>/<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when taken)."""
    return stamped_dir(outputs_base(name), create=True)


def link_latest(run_dir: Path) -> Path | None:
    """Point ``<run_dir's parent>/latest`` at ``run_dir`` (atomically); the link, or None (logged)."""
    link = run_dir.parent / LATEST
    tmp = run_dir.parent / f".{LATEST}.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, link)
        return link
    except OSError as exc:
        log.warning("could not link %s -> %s: %s", link, run_dir, exc)
        return None


class SuiteError(ValueError):
    """A suite that cannot start: nothing ran; exit code 2."""


NOT_MERGED = "not measured: a unit of it failed or is missing (see the scale-out entry)"
#: the run.json entry that carries scale-out problems
SCALEOUT = "scale-out"
NO_REPLAY_BUNDLE = "no bundle in replay dir"
#: what a run directory holds once a suite ran there
RUN_OUTPUTS = (
    RUN_FILE,
    "params.yaml",
    "baseline.json",
    "summary.md",
    "report.html",
    "report.png",
    "notebooks",
)


def check_baseline_file(params: SuiteParams, source: str | Path) -> None:
    """Raise :class:`ParamsError` when ``baseline.file`` is set but missing, not a valid
    baseline or lacks ``baseline.profile``."""
    f = params.baseline.file
    if f is None:
        return
    p = resolve_baseline_file(f)
    if not p.exists():
        raise ParamsError(
            f"{source}: baseline.file: {f} does not exist (looked in {Path.cwd()} "
            f"and {repo_root()}); use 'file: null' to gate on invariants only"
        )
    try:
        ref = bl.load_baseline(p)
    except bl.BaselineError as exc:
        raise ParamsError(f"{source}: baseline.file: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{source}: baseline.file: cannot read {p}: {exc}") from None
    tols = ref.get("tolerances") or {}
    if not bl.is_flat(tols) and params.baseline.profile not in tols:  # flat: one set for all
        profiles = sorted(tols)
        raise ParamsError(
            f"{source}: baseline.profile: {params.baseline.profile!r} is not a "
            f"tolerance profile of {f} (it has: {', '.join(profiles) or 'none'})"
        )


def replay_plan(replay_dir: Path, selected: Iterable[str], *, allow_empty: bool = False) -> list[str]:
    """The selected investigations without a bundle in ``replay_dir``. Raises :class:`SuiteError`
    when ``replay_dir`` is missing or, unless ``allow_empty``, holds no bundle of them."""
    selected = list(selected)
    if allow_empty and replay_dir.is_dir():
        return [n for n in selected if not (replay_dir / n / "meta.json").exists()]
    if not replay_dir.exists():
        raise SuiteError(
            f"--replay {replay_dir}: no such directory (--replay launches nothing: "
            "it needs a run directory holding bundles)"
        )
    if not replay_dir.is_dir():
        raise SuiteError(f"--replay {replay_dir}: not a directory")
    have = [s for s in registry.names() if (replay_dir / s / "meta.json").exists()]
    if not have:
        raise SuiteError(
            f"--replay {replay_dir}: no bundle to replay (expected "
            f"<dir>/<investigation>/meta.json for one of {', '.join(registry.names())}); "
            "--replay launches nothing"
        )
    missing = [n for n in selected if n not in have]
    if selected and len(missing) == len(selected):
        raise SuiteError(
            f"--replay {replay_dir}: no bundle of {', '.join(selected)} (it holds "
            f"{', '.join(have)}); --replay launches nothing"
        )
    return missing


def check_replay_identity(replay_dir: Path, names: Iterable[str], params: SuiteParams, source: str) -> None:
    """Raise :class:`SuiteError` when a replayed bundle was measured with another engine or
    request shape than ``params`` describe; bundles recording none are logged."""
    problems, engine, request = [], params.engine_dict(), params.request.model_dump()
    for name in names:
        if not (replay_dir / name / "meta.json").exists():
            continue
        recorded = read_meta(replay_dir / name).get("params") or {}
        if not recorded.get("spec") or not recorded.get("request"):
            log.warning(
                "--replay %s: the %s bundle records no engine spec or request: not checked", replay_dir, name
            )
            continue
        if diffs := identity_differences(recorded, engine, request):
            problems.append(f"the {name} bundle: {'; '.join(diffs)}")
    if problems:
        raise SuiteError(
            f"--replay {replay_dir}: " + "; ".join(problems) + f" ('given' is {source}): replay with the "
            "params file the bundles were measured with"
        )


def prepare_run_dir(run_dir: Path, *, force: bool = False, replay_dir: Path | None = None) -> None:
    """Refuse (:class:`SuiteError`) a run directory that holds another run, unless ``force``:
    then that run's outputs (:data:`RUN_OUTPUTS`) are removed."""
    if replay_dir is not None and replay_dir == run_dir:
        raise SuiteError(
            f"--replay and --out are the same directory ({run_dir}): choose another "
            "--out (the replayed bundles are copied there)"
        )
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise SuiteError(f"--out {run_dir}: exists and is not a directory")
    found = [run_dir / n for n in (*RUN_OUTPUTS, *notebook_names()) if (run_dir / n).exists()]
    if not found:
        return
    if not force:
        raise SuiteError(
            f"--out {run_dir} already holds another run "
            f"({', '.join(p.name for p in found)}); its bundles would mix into this "
            "run's report: choose a new --out, or pass --force to replace that run"
        )
    for p in found:
        log.warning("--force: removing %s of the earlier run", p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def run_plan(params: SuiteParams, names: Iterable[str]) -> tuple[int, int]:
    """(launches, requests) the investigations ``names`` would make at most with ``params``."""
    plans = []
    for n in names:
        if n not in registry.names():  # the gate notebook launches nothing
            continue
        try:
            plans.append(registry.get(n).plan(params.section(n)))
        except (AttributeError, TypeError, ValueError) as exc:
            log.debug("no plan for %s: %s", n, exc)
    return planned_requests(plans)


KERNEL_NAME = "python3"


def notebooks_dir() -> Path:
    """The notebooks folder: PERFKIT_NOTEBOOKS or the repo's ``notebooks``."""
    env = os.environ.get("PERFKIT_NOTEBOOKS")
    return Path(env) if env else repo_root() / "notebooks"


@dataclass
class NotebookRun:
    """One notebook's run in a suite: status, wall time (s), error, parameters."""

    name: str
    status: str = "pending"  # ok, error, skipped
    wall_s: float | None = None
    error: str | None = None
    ename: str | None = None
    output: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # why it was skipped
    #: what its kernel started and the suite ended (:class:`perfkit.engine.owner.Ended` each)
    outlived: list[dict[str, Any]] = field(default_factory=list)
    #: the launch and request under way when a failed notebook's kernel stopped
    in_flight: dict[str, Any] | None = None


@functools.cache
def kernel_name() -> str:
    """A kernel that runs this Python: ``python3``, else a ``perfkit`` kernelspec installed under
    ``sys.prefix``."""
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
    """A jupyter_client kernel manager whose kernel listens on IPC sockets, not TCP."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Unicode

    class _IPCKernelManager(AsyncKernelManager):
        transport = Unicode("ipc")

    return _IPCKernelManager


@contextlib.contextmanager
def _env(values: Mapping[str, str]):
    """``values`` in ``os.environ`` for the block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 (ours and the kernel's, which inherits it) to ``path``."""
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


def execute_owned(
    src: Path,
    dst: Path,
    parameters: Mapping[str, Any],
    bars: RunBars,
    planned: int,
    *,
    grace_s: float = 5.0,
    in_flight_error: bool = False,
    cwd: str | Path | None = None,
    timeout_s: float | None = None,
) -> NotebookRun:
    """Run one notebook with papermill; never raises for a failing notebook (a last cell's
    :class:`perfkit.gate.verdicts.GateFailed` is status ``ok``). Beside ``dst``: ``.kernel.log``,
    ``.progress.jsonl`` (drawn on ``bars``) and ``.processes.jsonl``. What the kernel launched and
    left is ended here (``grace_s``), also on Ctrl-C or SIGTERM (raised on)."""
    import papermill as pm

    dst.parent.mkdir(parents=True, exist_ok=True)
    run = NotebookRun(name=src.stem, output=str(dst), parameters=jsonable(dict(parameters)))
    pfile, registry_file = dst.with_suffix(".progress.jsonl"), dst.with_suffix(".processes.jsonl")
    env = {REGISTRY_ENV: str(registry_file), PROGRESS_ENV: str(pfile)}
    watch = Watch.start(registry_file)
    try:
        with bars.watch(pfile, src.stem, planned):
            t0 = time.monotonic()
            try:
                with _stderr_to(dst.with_suffix(".kernel.log")), _env(env):
                    pm.execute_notebook(
                        str(src),
                        str(dst),
                        parameters=dict(parameters),
                        kernel_name=kernel_name(),
                        cwd=str(cwd) if cwd else None,
                        progress_bar=False,
                        log_output=False,
                        execution_timeout=int(timeout_s) if timeout_s else None,
                        kernel_manager_class=ipc_kernel_manager(),
                    )
                run.status = "ok"
            except Exception as exc:  # noqa: BLE001 - papermill errors, dead kernels, timeouts
                ename, text = notebook_error(dst) if dst.exists() else (None, None)
                if (ename or getattr(exc, "ename", None)) == GATE_FAILED:  # the result is in verdict.json
                    run.status, run.ename = "ok", GATE_FAILED
                else:
                    run.status, run.ename = "error", ename or type(exc).__name__
                    run.error = text or f"{type(exc).__name__}: {exc}"
                    log.error("notebook %s failed: %s", src.name, run.error)
            run.wall_s = round(time.monotonic() - t0, 2)
    finally:
        left = watch.reap(grace_s=grace_s)
    run.outlived = [asdict(e) for e in left]
    if run.status == "error":
        run.in_flight = in_flight(pfile) if in_flight_error else None
        if run.in_flight:
            run.error = (
                f"{run.error}\nthe kernel stopped during launch {run.in_flight['launch']!r}, "
                f"request {run.in_flight['request']}"
            )
        if left:
            run.error = f"{run.error}\n{describe(left)}"
    return run


def notebook_parameters(
    name: str, params: SuiteParams, run_dir: Path, replay: Path | None = None
) -> dict[str, Any]:
    """Papermill parameters of one notebook, from the suite params."""
    common = {
        "run_dir": str(run_dir),
        "engine": params.engine_dict(),
        "request": params.request.model_dump(),
        "invariants": params.invariants.model_dump(),  # None included: a limit turned off
        "fail_on": "never",  # the suite reads each verdict.json itself
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

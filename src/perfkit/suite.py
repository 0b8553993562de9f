"""Papermill orchestration: run the investigation notebooks, gate the run, assemble its outputs.

``perfkit suite --params params/ci-cpu.yaml --out outputs/RUN`` calls :func:`run_suite`, which

1. validates the params (:func:`perfkit.params.load_params`) before anything is launched;
2. runs each enabled investigation notebook (``cold_warm``, ``warmup_shapes``,
   ``memory_budget``) with papermill; each writes its bundle to ``RUN/<scenario>/`` and its gate
   rows to ``RUN/<scenario>/verdict.json``;
3. runs the baseline gate notebook, which launches nothing: it reuses the bundles measured in
   step 2, writes ``RUN/baseline.json`` (this run's numbers, sglang layout), compares them with
   the params' baseline file when one is set and re-checks the invariants on all results;
4. writes ``RUN/summary.md`` (appended to ``$GITHUB_STEP_SUMMARY`` when set), ``RUN/run.json``
   and ``RUN/report.html`` (:mod:`perfkit.report`), even when a notebook failed.

Before anything runs, a replay directory without bundles, a missing or broken ``baseline.file``
and an ``--out`` already holding another run (without ``--force``) are errors (exit 2). A replay
launches nothing: an investigation whose bundle the replay directory lacks is skipped.

Exit codes (:data:`perfkit.gate.verdicts.EXIT_OK`, :data:`perfkit.gate.verdicts.EXIT_REGRESSION`,
:data:`perfkit.gate.verdicts.EXIT_ERROR`): 0 every gate passed,
1 a gate failed (regression), 2 an error (bad params, engine crash, notebook exception, kernel
death).

The helpers the notebooks call, so notebooks stay thin:
:func:`perfkit.scenarios.runner.load_or_run` (replay a recorded bundle or run a scenario),
:func:`perfkit.gate.verdicts.write_verdict`, :func:`perfkit.gate.run.case_id`,
:func:`perfkit.gate.run.bundle_cases`, :func:`perfkit.gate.run.gate`.

Run directory layout::

    RUN/params.yaml            the validated params (resolved, with defaults)
    RUN/run.json               notebook statuses, wall times, errors, exit code
    RUN/notebooks/<nb>.ipynb   executed notebooks (with outputs)
    RUN/<scenario>/            ResultBundle + verdict.json
    RUN/baseline_gate/verdict.json
    RUN/baseline.json  RUN/summary.md  RUN/report.html  RUN/report.png (when chromium is there)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import yaml

from perfkit.bundle import IDENTITY_REQUEST, IDENTITY_SPEC
from perfkit.common import jsonsafe
from perfkit.common.outdirs import stamped_dir
from perfkit.common.provenance import repo_root
from perfkit.common.slugs import slug
from perfkit.engine.owner import REGISTRY_ENV, Ended, Watch, describe, spawn_reaper, stop_reaper
from perfkit.gate import baseline as bl
from perfkit.gate.outcome import GATE_FAILED
from perfkit.gate.run import resolve_baseline_file
from perfkit.gate.verdicts import (
    GATE,
    RUN_FILE,
    STATUS_WORD,
    VERDICT_FILE,
    collect_verdicts,
    exit_code_for,
    jsonable,
    read_verdict,
)
from perfkit.gate.verdicts import notebooks as notebook_names
from perfkit.measuring.progress import PROGRESS_ENV, RunBars, in_flight, planned_requests
from perfkit.params import ParamsError, SuiteParams, load_params
from perfkit.report.render import notebook_error
from perfkit.scaleout.shards import select
from perfkit.scenarios import registry

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
    """Built on first use, so that the unit path (``--partition``, executors) runs on a GPU
    host without the Jupyter stack. A jupyter_client kernel manager whose kernel listens on IPC sockets, not TCP: the
    kernel is local, and ipykernel warns on every start that TCP without encryption is
    readable by anyone on the host (the source of that warning, fixed rather than hidden)."""
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
    """Run one notebook with papermill; never raises for a failing notebook.

    ``kernel_log``: file that receives the kernel's own stderr (ipykernel's transport warnings,
    shutdown noise) and papermill's log lines instead of the terminal.
    ``progress_file``: where the kernel appends its progress events
    (:mod:`perfkit.measuring.progress`; default ``<dst>.progress.jsonl``): no bar is drawn into
    the notebook's saved outputs.

    A notebook whose last cell raised :class:`perfkit.gate.outcome.GateFailed` (run with
    ``fail_on="gate"``) ran to its end: its status is ``ok`` and its gate result is in its
    ``verdict.json``, as for ``fail_on="never"``.
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
            run.wall_s = round(time.monotonic() - t0, 2)
            return run
        run.status = "error"
        run.ename = ename or type(exc).__name__
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
        # a notebook error, so the notebooks never raise for it here (perfkit.gate.outcome)
        "fail_on": "never",
    }
    if name == GATE:
        b = params.baseline
        bfile = b.file
        return {
            **common,
            "baseline_file": bfile,
            "profile": b.profile,
            "strict": b.strict,
            "hardware": b.hardware,
        }
    sec = getattr(params, name).model_dump()
    sec.pop("enabled", None)
    sec.pop("tier", None)
    bundle_dir = None
    if replay is not None:
        if not (replay / name / "meta.json").exists():  # a replay never launches an engine
            raise SuiteError(f"--replay {replay}: no {name} bundle ({NO_REPLAY_BUNDLE})")
        bundle_dir = str(replay / name)
    return {**common, **sec, "bundle_dir": bundle_dir}


@dataclass
class SuiteResult:
    run_dir: Path
    exit_code: int
    status: str
    notebooks: list[NotebookRun]
    verdicts: pd.DataFrame

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "exit_code": self.exit_code,
            "status": self.status,
            "notebooks": [asdict(n) for n in self.notebooks],
        }


LATEST = "latest"


def outputs_base(name: str) -> Path:
    """``outputs/<name>`` (slugged): where the runs of one params file or notebook land."""
    return Path("outputs") / slug(name)


def default_out(name: str) -> Path:
    """A new run directory ``outputs/<name>/<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when that
    second is taken): runs never overwrite each other."""
    return stamped_dir(outputs_base(name), create=True)


def link_latest(run_dir: Path) -> Path | None:
    """Point ``<run_dir's parent>/latest`` at ``run_dir`` (a relative symlink, replaced
    atomically). Returns the link, or None where symlinks are not possible (logged)."""
    link = run_dir.parent / LATEST
    tmp = run_dir.parent / f".{LATEST}.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name, target_is_directory=True)
        os.replace(tmp, link)
        return link
    except OSError as exc:
        log.warning("could not link %s -> %s: %s", link, run_dir, exc)
        return None


class SuiteError(ValueError):
    """A suite that cannot start (replay directory without bundles, run directory holding
    another run): nothing ran; exit code 2."""


#: why a merged run skips an investigation: a part of it is missing or failed
NOT_MERGED = "not measured: a unit of it failed or is missing (see the scale-out entry)"
#: name of the run.json entry that carries scale-out problems (missing shard, failed unit)
SCALEOUT = "scale-out"

#: skip reason of an investigation whose bundle the replay directory lacks
NO_REPLAY_BUNDLE = "no bundle in replay dir"
#: what a run directory holds once a suite ran there (see the module doc)
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
    baseline (the message gives line/column for broken JSON) or lacks ``baseline.profile``.
    ``file: null`` means invariants only and passes."""
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
    profiles = sorted(ref.get("tolerances") or {})
    if params.baseline.profile not in profiles:
        raise ParamsError(
            f"{source}: baseline.profile: {params.baseline.profile!r} is not a "
            f"tolerance profile of {f} (it has: {', '.join(profiles) or 'none'})"
        )


def replay_plan(replay_dir: Path, selected: Iterable[str], *, allow_empty: bool = False) -> list[str]:
    """The selected investigations without a bundle in ``replay_dir`` (they are skipped, never
    launched). Raises :class:`SuiteError` when ``replay_dir`` is missing or, unless
    ``allow_empty`` (a merge whose every unit failed: its report names why), holds no bundle of
    the selected investigations."""
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


#: what must agree between a replayed bundle and the params it is replayed with


def check_replay_identity(replay_dir: Path, names: Iterable[str], params: SuiteParams, source: str) -> None:
    """Raise :class:`SuiteError` when a replayed bundle was measured with another engine or
    request shape than ``params`` describe: case ids and the baseline's hardware label come from
    the params, so such a replay would file one engine's numbers under another's name. Bundles
    that record no params (hand-made ones) cannot be checked and are logged."""
    engine = params.engine_dict()
    request = params.request.model_dump()
    problems = []
    for name in names:
        meta_file = replay_dir / name / "meta.json"
        if not meta_file.exists():
            continue
        recorded = json.loads(meta_file.read_text()).get("params") or {}
        spec, req = recorded.get("spec"), recorded.get("request")
        if not spec or not req:
            log.warning(
                "--replay %s: the %s bundle records no engine spec or request: not checked", replay_dir, name
            )
            continue
        theirs = [f"{k} {spec.get(k)!r}" for k in IDENTITY_SPEC if spec.get(k) != engine.get(k)]
        theirs += [f"request {k} {req.get(k)!r}" for k in IDENTITY_REQUEST if req.get(k) != request.get(k)]
        if theirs:
            ours = [
                f"{x.split(' ')[0]} {engine.get(x.split(' ')[0])!r}"
                for x in theirs
                if not x.startswith("request")
            ]
            ours += [
                f"request {x.split(' ')[1]} {request.get(x.split(' ')[1])!r}"
                for x in theirs
                if x.startswith("request")
            ]
            problems.append(
                f"the {name} bundle was measured with {', '.join(theirs)}; {source} says {', '.join(ours)}"
            )
    if problems:
        raise SuiteError(
            f"--replay {replay_dir}: "
            + "; ".join(problems)
            + ": replay with the params file the bundles were measured with"
        )


def prepare_run_dir(run_dir: Path, *, force: bool = False, replay_dir: Path | None = None) -> None:
    """Refuse (:class:`SuiteError`) a run directory that holds another run, unless ``force``:
    then that run's outputs (:data:`RUN_OUTPUTS`) are removed, so no stale bundle or verdict
    mixes into the new report."""
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
    """(launches, requests) the investigations ``names`` would make with ``params``, from each
    scenario's ``plan`` (an upper bound: a scenario may reuse an earlier one's launch)."""
    plans = []
    for n in names:
        if n not in registry.names():  # the gate notebook launches nothing
            continue
        s = registry.get(n)
        if s.plan is not None:
            try:
                plans.append(s.plan(params.section(n)))
            except (AttributeError, TypeError, ValueError) as exc:
                log.debug("no plan for %s: %s", n, exc)
    return planned_requests(plans)


def run_suite(
    params_path: str | Path,
    out: str | Path | None = None,
    *,
    replay: str | Path | None = None,
    only: Iterable[str] | None = None,
    notebooks: str | Path | None = None,
    screenshot: bool = True,
    progress: bool = True,
    force: bool = False,
    tier: str | None = None,
    scaleout: Mapping[str, Any] | None = None,
) -> SuiteResult:
    """Run the suite (see the module doc). Raises :class:`ParamsError` (bad params, baseline
    file, unknown ``tier``) or :class:`SuiteError` (replay directory without bundles, ``out``
    holding another run and no ``force``) before anything runs; every later failure is
    reported through the exit code.

    With ``replay`` nothing is launched: an investigation whose bundle the replay directory
    lacks is skipped (:data:`NO_REPLAY_BUNDLE`). ``tier`` (``per-commit`` or ``extra``) runs
    only the investigations of that tier; the others are skipped with the reason.
    ``scaleout``: a merge document (:func:`perfkit.scaleout.shards.merge_shards`) whose
    ``problems`` (missing shard, failed unit, other params) become a :data:`SCALEOUT` error
    entry (exit 2, named in run.json, summary.md and the report); it is kept in run.json.
    """
    from perfkit import report

    params = load_params(params_path)
    check_baseline_file(params, params_path)
    spec = params.engine_spec()
    try:
        spec.check()
    except FileNotFoundError as exc:
        if not replay:
            raise ParamsError(f"{params_path}: engine: {exc}") from None
    new_default = out is None
    replay_dir = Path(replay).resolve() if replay else None
    try:
        selected, skipped = select(params, only, tier)
    except ValueError as exc:
        raise ParamsError(str(exc)) from None
    if replay_dir is not None:
        check_replay_identity(replay_dir, selected, params, str(params_path))
        for n in replay_plan(replay_dir, selected, allow_empty=scaleout is not None):
            skipped[n] = NOT_MERGED if scaleout is not None else NO_REPLAY_BUNDLE
            log.warning("--replay %s: no %s bundle: %s skipped", replay_dir, n, n)
    # a new default directory only once every check passed (a refused run leaves nothing)
    run_dir = (Path(out) if out else default_out(params.name)).resolve()
    prepare_run_dir(run_dir, force=force, replay_dir=replay_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.yaml").write_text(
        f"# validated from {params_path}\n" + yaml.safe_dump(params.model_dump(), sort_keys=False)
    )
    nb_dir = Path(notebooks) if notebooks else notebooks_dir()
    names = [n for n in selected if n not in skipped] + [GATE]
    runs: list[NotebookRun] = [
        NotebookRun(n, status="skipped", reason=skipped[n]) for n in registry.names() if n in skipped
    ]
    kern = kernel_name()
    t_start = time.monotonic()
    from tqdm.std import tqdm

    # the bars write to a copy of the terminal's stderr: fd 2 goes to kernel logs meanwhile
    bar_file = os.fdopen(os.dup(2), "w") if progress else sys.stderr
    it = tqdm(names, desc="perfkit suite", unit="notebook", disable=not progress, file=bar_file)
    planned = run_plan(params, [n for n in names if n != GATE]) if replay_dir is None else (0, 0)
    bars = RunBars(bar_file, *planned, enabled=progress)
    # if this process is killed outright, the reaper ends what its kernels started
    (run_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    reaper = spawn_reaper(run_dir / "notebooks", spec.stop_grace_s) if replay_dir is None else None
    try:
        for name in it:
            it.set_postfix_str(name)
            src = nb_dir / f"{name}.ipynb"
            dst = run_dir / "notebooks" / f"{name}.ipynb"
            if not src.exists():
                runs.append(
                    NotebookRun(
                        name, status="error", error=f"notebook {src} not found", ename="FileNotFoundError"
                    )
                )
                continue
            # a stale verdict from an earlier run in the same directory must not count
            stale = run_dir / name / VERDICT_FILE
            if stale.exists():
                stale.unlink()
            log.info("running %s", src)
            pfile = run_dir / "notebooks" / f"{name}.progress.jsonl"
            # this process owns what the kernel launches: registered there, ended here if it
            # outlives the kernel (perfkit.engine.owner)
            registry_file = run_dir / "notebooks" / f"{name}.processes.jsonl"
            watch = Watch.start(registry_file)
            try:
                with (
                    bars.watch(pfile, name, run_plan(params, [name])[1] if replay_dir is None else 0),
                    _env(REGISTRY_ENV, str(registry_file)),
                ):
                    r = execute_notebook(
                        src,
                        dst,
                        notebook_parameters(name, params, run_dir, replay_dir),
                        cwd=run_dir,
                        timeout_s=params.timeout_s,
                        kernel=kern,
                        kernel_log=run_dir / "notebooks" / f"{name}.kernel.log",
                        progress_file=pfile,
                    )
            except KeyboardInterrupt:
                _end_outlived(watch, spec.stop_grace_s)
                # Ctrl-C or SIGTERM (CI cancel): the kernel is shut down, its engine follows it
                # (launch's parent-death signal); stop here, but still write the report (exit 2)
                log.error("interrupted while running %s: writing the report of what ran", name)
                runs.append(
                    NotebookRun(
                        name,
                        status="error",
                        ename="KeyboardInterrupt",
                        error=f"interrupted (Ctrl-C or SIGTERM) while running {name}",
                    )
                )
                done = {r.name for r in runs}
                runs += [
                    NotebookRun(n, status="skipped", reason="not run: interrupted")
                    for n in names
                    if n not in done
                ]
                break
            r.outlived = _end_outlived(watch, spec.stop_grace_s)
            if r.status == "error":
                # a kernel that died mid-launch (cell timeout, kill) left a request in flight
                r.in_flight = in_flight(pfile)
                if r.in_flight:
                    r.error = (
                        f"{r.error}\nthe kernel stopped during launch {r.in_flight['launch']!r}, "
                        f"request {r.in_flight['request']}"
                    )
                if r.outlived:
                    r.error = f"{r.error}\n{describe([Ended(**e) for e in r.outlived])}"
            if r.status == "ok" and read_verdict(run_dir / name) is None:
                r.status, r.ename = "error", "MissingVerdict"
                r.error = f"notebook {name} finished without writing {name}/{VERDICT_FILE}"
            runs.append(r)
    finally:
        stop_reaper(reaper)
    bars.close()
    it.close()
    order = {n: i for i, n in enumerate(notebook_names())}
    runs.sort(key=lambda r: order.get(r.name, 99))
    problems = list((scaleout or {}).get("problems") or [])
    if problems:
        runs.insert(
            0,
            NotebookRun(
                SCALEOUT,
                status="error",
                ename="ScaleOutError",
                error=f"{len(problems)} scale-out problem{'' if len(problems) == 1 else 's'}: "
                + "; ".join(problems),
            ),
        )
    verdicts = collect_verdicts(run_dir)
    code = exit_code_for(runs, verdicts)
    info = {
        "params_file": str(params_path),
        "name": params.name,
        "description": params.description,
        "exit_code": code,
        "status": STATUS_WORD[code],
        "wall_s": round(time.monotonic() - t_start, 2),
        "finished": _dt.datetime.now().isoformat(timespec="seconds"),
        "replay": _shown_path(replay_dir) if replay_dir else None,
        "notebooks": [asdict(r) for r in runs],
    }
    if scaleout is not None:
        info["scaleout"] = {k: v for k, v in scaleout.items() if k != "params"}
    (run_dir / RUN_FILE).write_text(jsonsafe.dumps(jsonable(info), indent=2, default=str) + "\n")
    summary = report.write_summary(run_dir)
    gh = os.environ.get("GITHUB_STEP_SUMMARY")
    if gh:
        try:
            with open(gh, "a", encoding="utf-8") as fh:
                fh.write(summary + "\n")
        except OSError as exc:
            log.warning("cannot append to GITHUB_STEP_SUMMARY %s: %s", gh, exc)
    html = report.render_report(run_dir)
    if new_default:
        link_latest(run_dir)
    if screenshot:
        try:
            report.screenshot(html, run_dir / "report.png")
        except Exception as exc:  # noqa: BLE001 - a screenshot is a nicety
            log.warning("no screenshot: %s", exc)
    return SuiteResult(run_dir, code, STATUS_WORD[code], runs, verdicts)


def _end_outlived(watch: Watch, grace_s: float) -> list[dict[str, Any]]:
    """End what a notebook's kernel started and left running (:meth:`Watch.reap`); as dicts."""
    return [e.to_dict() for e in watch.reap(grace_s=grace_s)]


def _shown_path(path: Path) -> str:
    """``path`` relative to the perfkit checkout when inside it (what a committed report should
    show), else absolute."""
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def merge_runs(
    dirs: Iterable[str | Path],
    out: str | Path,
    *,
    params_path: str | Path | None = None,
    notebooks: str | Path | None = None,
    screenshot: bool = True,
    progress: bool = True,
    force: bool = False,
    allow_mixed_commits: bool = False,
) -> SuiteResult:
    """``perfkit merge DIR... --out RUN``: join shard outputs into ``RUN/merged/``
    (:func:`perfkit.scaleout.shards.merge_shards`), then the usual path in replay mode:
    notebooks (every check judged again), gate, report, summary. Missing shards, failed units
    and shards or parts measured with other params, commit, perfkit version, engine or request
    are named in run.json, summary.md and the report, and make the exit code 2
    (``allow_mixed_commits``: other commits are accepted and each unit's shown).

    Raises:
        ParamsError: a bad ``params_path``. SuiteError: ``out`` holds another run (without
            ``force``), or nothing could be merged (no readable shard, no unit output).
    """
    from perfkit.scaleout.shards import MERGED_DIR, merge_shards

    run_dir = Path(out).resolve()
    params = load_params(params_path) if params_path else None
    prepare_run_dir(run_dir, force=force)
    merged = run_dir / MERGED_DIR
    if merged.exists():
        if not force:
            raise SuiteError(
                f"--out {run_dir} already holds merged shards ({merged}): pass --force to replace them"
            )
        shutil.rmtree(merged)
    try:
        doc = merge_shards(dirs, merged, params, allow_mixed_commits=allow_mixed_commits)
    except ValueError as exc:
        raise SuiteError(f"merge: {exc}") from None
    if not doc["merged"]:
        # still a run: its report names every problem (the report is written in every case)
        log.error(
            "perfkit merge: no bundle could be merged: %s",
            "; ".join(doc["problems"] or ["no units were planned"]),
        )
        if not doc["problems"]:
            doc["problems"] = ["no units were planned: nothing was measured"]
    return run_suite(
        params_path or merged / "params.yaml",
        run_dir,
        replay=merged,
        only=doc.get("only"),
        tier=doc.get("tier"),
        notebooks=notebooks,
        screenshot=screenshot,
        progress=progress,
        scaleout=doc,
    )


def run_units_suite(
    params_path: str | Path,
    out: str | Path | None = None,
    *,
    executor: str = "inprocess",
    executor_options: Mapping[str, Any] | None = None,
    only: Iterable[str] | None = None,
    tier: str | None = None,
    notebooks: str | Path | None = None,
    screenshot: bool = True,
    progress: bool = True,
    force: bool = False,
) -> SuiteResult:
    """``perfkit suite --executor NAME``: every unit of work through that executor (one shard of
    one, into ``RUN/shards/1/``), then :func:`merge_runs` into ``RUN``.

    Raises:
        ParamsError, SuiteError: as :func:`merge_runs`. ExecutorError: unknown or missing
            executor (e.g. ``ray`` without ``perfkit[ray]``).
    """
    from perfkit.scaleout.executor import executor as get_executor
    from perfkit.scaleout.shards import ShardInterrupted, run_shard

    params = load_params(params_path)
    check_baseline_file(params, params_path)
    get_executor(executor)  # fails before anything runs
    run_dir = (Path(out) if out else default_out(params.name)).resolve()
    prepare_run_dir(run_dir, force=force)
    shard_dir = run_dir / "shards" / "1"
    if shard_dir.exists():
        shutil.rmtree(shard_dir)
    try:
        run_shard(
            params_path,
            shard_dir,
            1,
            1,
            only=only,
            tier=tier,
            executor=executor,
            executor_options=executor_options,
            progress=progress,
        )
    except ShardInterrupted as exc:  # the manifest keeps what finished: report it (exit 2)
        log.error("%s", exc)
    return merge_runs(
        [shard_dir],
        run_dir,
        params_path=params_path,
        notebooks=notebooks,
        screenshot=screenshot,
        progress=progress,
        force=True,
    )

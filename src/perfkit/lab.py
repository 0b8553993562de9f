"""``perfkit run`` but its printing (:func:`run_notebook`) and ``perfkit lab``: JupyterLab on a
run's executed notebooks or on fresh copies bound to recorded bundles (``--replay``), in a lab
directory outside the tracked tree. See docs/lab.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import nbformat

from perfkit.bundle import read_meta
from perfkit.common import MissingExtra, require_extra
from perfkit.common.outdirs import stamped_dir
from perfkit.common.slugs import did_you_mean
from perfkit.engine.owner import become_subreaper, run_bounded
from perfkit.gate.verdicts import gate_result, read_verdict
from perfkit.investigations import registry
from perfkit.nbparams import HISTORY, section_params, validate
from perfkit.params import ParamsError, load_params, yaml_value
from perfkit.suite.execute import (
    SuiteError,
    default_out,
    notebook_parameters,
    notebooks_dir,
    outputs_base,
    replay_plan,
)

log = logging.getLogger(__name__)

LAB_BASE = Path("outputs") / "lab"
#: the replayed notebooks' run directory, relative to the lab directory
RUN_SUBDIR = "run"


class LabError(ValueError):
    """A lab that cannot be prepared; nothing was written (exit 2)."""


@dataclass
class LabDir:
    """A prepared lab directory: its ``notebooks`` in run order, those ``executed`` here (s) and
    their ``errors``."""

    dir: Path
    notebooks: list[Path] = field(default_factory=list)
    executed: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def tracked_tree(path: Path) -> Path | None:
    """The git work tree ``path`` lies in when git would track files there, else None."""
    if shutil.which("git") is None:
        return None
    base = path.resolve()
    while not base.is_dir():
        base = base.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=base, capture_output=True, text=True, timeout=30)

    top = git("rev-parse", "--show-toplevel")
    probe = path.resolve() / "probe.ipynb"
    if top.returncode != 0 or git("check-ignore", "-q", "--no-index", str(probe)).returncode == 0:
        return None
    return Path(top.stdout.strip())


def _new_dir(dest: str | Path | None) -> Path:
    d = stamped_dir(LAB_BASE) if dest is None else Path(dest)
    top = tracked_tree(d)
    if top is not None:
        raise LabError(
            f"--dir {d}: inside the git work tree {top} and not ignored: saved notebooks and "
            "checkpoints would show in git status; use a directory under outputs/ or outside the clone"
        )
    if d.exists() and any(d.glob("*.ipynb")):
        raise LabError(f"--dir {d}: already holds notebooks; choose a new directory")
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


def _recorded_section(name: str, bundle: Path) -> dict[str, Any]:
    try:
        recorded = read_meta(bundle).get("params") or {}
    except (OSError, ValueError) as exc:
        log.warning("%s: meta.json unreadable (%s): the notebook's defaults are used", bundle, exc)
        return {}
    out = {}
    for p in section_params(name):
        if p.name not in recorded:
            continue
        try:
            out.update(validate(name, {p.name: recorded[p.name]}))
        except ParamsError as exc:
            log.info("%s: recorded %s not applied (the default stays): %s", bundle, p.name, exc)
    return out


def replay_names(replay: str | Path, only: Iterable[str] | None = None) -> list[str]:
    """The investigations (of ``only``) ``replay`` holds a bundle of, in run order; LabError when
    none."""
    names = [n for n in registry.names() if not only or n in only]
    try:
        missing = replay_plan(Path(replay).resolve(), names)
    except SuiteError as exc:
        raise LabError(str(exc)) from None
    return [n for n in names if n not in missing]


def prepare_replay(
    replay: str | Path,
    dest: str | Path | None = None,
    *,
    only: Iterable[str] | None = None,
    execute: bool = True,
) -> LabDir:
    """Fresh copies of the notebooks bound to the bundles of ``replay``, executed once and signed
    unless ``execute`` is False. Raises LabError: no bundle, or ``dest`` tracked or not new."""
    import papermill as pm

    from perfkit.measuring.progress import RunBars
    from perfkit.suite import execute_owned

    replay = Path(replay).resolve()
    have = replay_names(replay, only)
    lab = LabDir(_new_dir(dest))
    for name in have:
        src, out = notebooks_dir() / f"{name}.ipynb", lab.dir / f"{name}.ipynb"
        params = {
            **_recorded_section(name, replay / name),
            "bundle_dir": str(replay / name),
            "run_dir": RUN_SUBDIR,
            "fail_on": "never",
        }
        lab.notebooks.append(out)
        if not execute:
            pm.execute_notebook(str(src), str(out), parameters=params, prepare_only=True)
            continue
        r = execute_owned(src, out, params, RunBars(None, 0, 0), 0, cwd=lab.dir, timeout_s=600)
        lab.executed[name] = r.wall_s
        if r.error:
            lab.errors[name] = r.error
        _sign(out)
    return lab


def prepare_run(run: str | Path, dest: str | Path | None = None) -> LabDir:
    """The executed notebooks of ``run``, signed: in place when untracked and no ``dest`` is given,
    else copied. Raises LabError: no executed notebook, or ``dest`` inside the tracked tree."""
    nb_dir = Path(run) / "notebooks"
    found = sorted(nb_dir.glob("*.ipynb"))
    if not found:
        raise LabError(f"{run}: no executed notebooks (expected {nb_dir}/*.ipynb); --replay opens bundles")
    if dest is None and tracked_tree(nb_dir) is None:
        lab = LabDir(nb_dir.resolve(), notebooks=[p.resolve() for p in found])
    else:
        lab = LabDir(_new_dir(dest))
        for p in found:
            shutil.copy2(p, lab.dir / p.name)
            lab.notebooks.append(lab.dir / p.name)
    for p in lab.notebooks:
        _sign(p)
    return lab


def _sign(path: Path) -> None:
    from nbformat.sign import NotebookNotary

    try:
        NotebookNotary().sign(nbformat.read(str(path), as_version=4))
    except Exception as exc:  # noqa: BLE001
        log.warning("%s: not signed (%s): JupyterLab will show its outputs as untrusted", path, exc)


def lab_command(lab: LabDir, browser: bool = True) -> list[str]:
    """The JupyterLab command for ``lab`` (``--allow-root`` as root)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={lab.dir}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd if browser else [*cmd, "--no-browser"]


def launch(lab: LabDir, browser: bool = True) -> int:
    """Run JupyterLab on ``lab`` until it stops; 0 when it exits cleanly (Ctrl-C goes on as
    KeyboardInterrupt). Raises LabError: JupyterLab not installed, or it exited with an error."""
    try:
        require_extra("lab", "perfkit lab")
    except MissingExtra as exc:
        raise LabError(f"{exc}; the notebooks are ready in {lab.dir}") from None
    rc = run_bounded(lab_command(lab, browser), grace_s=10).returncode
    if rc not in (0, -signal.SIGINT, 128 + signal.SIGINT):
        raise LabError(
            f"JupyterLab exited with {rc} (its message is above); the notebooks are ready in "
            f"{lab.dir}: open them with any Jupyter, or rerun with --no-launch"
        )
    return 0


class RunInputError(ValueError):
    """Bad input to :func:`run_notebook`; its text is the whole message."""


def parse_kv(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items -> {key: value as YAML 1.2}; RunInputError."""
    out: dict[str, Any] = {}
    for it in items or []:
        if "=" not in it:
            raise RunInputError(f"-p expects KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise RunInputError(f"-p expects KEY=VALUE, got {it!r} (empty key)")
        try:
            out[k] = yaml_value(v) if v != "" else ""
        except ParamsError as where:
            shown = repr(v) if len(v) <= 80 else repr(v[:60]) + f"… ({len(v):,} characters)"
            raise RunInputError(
                f"-p {k}: value {shown} is not valid YAML ({where}); quote strings "
                f"with special characters, e.g. -p '{k}=\"...\"'"
            ) from None
    return out


def check_notebook_parameters(nb: Path, given: dict[str, Any]) -> list[str]:
    """The names the notebook's ``parameters`` cell declares; RunInputError for one it lacks."""
    import papermill as pm

    try:
        declared = list(pm.inspect_notebook(str(nb)))
    except Exception as exc:  # noqa: BLE001
        raise RunInputError(f"cannot read the parameters of {nb}: {exc}") from None
    unknown = [k for k in given if k not in declared]
    if not unknown:
        return declared
    hints = [f"{k!r}{did_you_mean(k, declared)}" for k in unknown]
    known = ", ".join(declared) if declared else "none (the notebook has no parameters cell)"
    raise RunInputError(
        f"{nb.name}: unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; known: {known}"
    )


def notebook_params(nb: Path, params_file: str | None, kv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The params file's parameters for ``nb``, then ``-p`` items, validated; ``fail_on`` ``never``
    unless given. Raises RunInputError."""
    if not nb.exists():
        raise RunInputError(f"notebook {nb} not found")
    params: dict[str, Any] = {}
    if params_file:
        try:
            sp = load_params(params_file)
        except ParamsError as exc:
            raise RunInputError(f"invalid params:\n{exc}") from None
        params.update(notebook_parameters(nb.stem, sp, Path("unused")))
        params.pop("run_dir", None)
    try:
        given = parse_kv(kv)
        declared = check_notebook_parameters(nb, given)
        given = validate(nb.stem, given)
    except ParamsError as exc:
        raise RunInputError(f"invalid parameters for {nb.name}:\n{exc}") from None
    params.update(given)
    if "fail_on" in declared and "fail_on" not in given:
        params["fail_on"] = "never"
    return params


def run_dir_for(name: str, given: str | None) -> tuple[Path, Path | None]:
    """The run directory of notebook ``name`` (``given``, else a new ``outputs/<name>/<stamp>/``)
    and the outermost folder this run creates (None: none)."""

    def outermost_new(top: Path) -> Path:
        while not top.parent.exists():
            top = top.parent
        return top

    if given:
        path = Path(given).resolve()
        return path, None if path.exists() else outermost_new(path)
    base = outputs_base(name).resolve()
    top = None if base.exists() else outermost_new(base)
    path = default_out(name).resolve()
    return path, top or path


def execute_with_bars(nb: Path, out: Path, params: dict[str, Any], timeout_s: float | None):
    """Execute the notebook (what its kernel starts ended here), with progress bars on a terminal."""
    from perfkit.measuring.progress import RunBars
    from perfkit.suite import execute_owned

    plan: list[int] = []
    if nb.stem in registry.names() and not params.get("bundle_dir"):
        s = registry.get(nb.stem)
        fields = s.params_model.model_fields
        with contextlib.suppress(ValueError):
            sec = s.params_model.model_validate({k: v for k, v in params.items() if k in fields})
            plan = list(s.plan(sec))
    planned = sum(plan)
    bar_file, log_file = os.fdopen(os.dup(2), "w"), out.with_suffix(".kernel.log")
    bars = RunBars(bar_file, len(plan), planned, enabled=planned > 0 and bar_file.isatty())
    become_subreaper()
    try:
        return execute_owned(nb, out, params, bars, planned, cwd=Path.cwd(), timeout_s=timeout_s)
    finally:
        bars.close()
        bar_file.close()
        if log_file.exists() and not log_file.stat().st_size:
            log_file.unlink()


@dataclass
class NotebookRun:
    """What :func:`run_notebook` did; ``word``: pass / fail / not gated / error."""

    result: Any
    verdict: Any
    word: str
    out: Path
    run_dir: Path


def run_notebook(
    notebook: str,
    params_file: str | None,
    kv: list[str] | tuple[str, ...],
    out: str | None,
    timeout_s: float | None,
) -> NotebookRun:
    """Run one notebook with papermill, parameters validated first; the executed copy at ``out``
    (default RUN_DIR/notebooks/NAME). Raises RunInputError, MissingExtra (the history notebook
    without ``perfkit[history]``)."""
    nb = Path(notebook)
    if nb.stem == HISTORY:
        require_extra("history", nb.name)
    params = notebook_params(nb, params_file, kv)
    run_dir, made = run_dir_for(nb.stem, params.get("run_dir"))
    params["run_dir"] = str(run_dir)
    dest = Path(out) if out else run_dir / "notebooks" / nb.name
    r = execute_with_bars(nb, dest, params, timeout_s)
    v = read_verdict(run_dir / nb.stem) if r.status == "ok" else None
    # nothing ran: leave no empty run directory
    if r.error and made is not None and made.exists() and not any(f.is_file() for f in made.rglob("*")):
        shutil.rmtree(made, ignore_errors=True)
    return NotebookRun(r, v, gate_result(r.status, v, r.ename), dest, run_dir)

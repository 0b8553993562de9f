"""``perfkit run`` but its printing: ``-p`` parameters read and checked, the run directory made
(and removed again when nothing ran), one notebook executed with progress bars.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perfkit.common import require_extra
from perfkit.common.slugs import did_you_mean
from perfkit.gate.verdicts import gate_result, read_verdict
from perfkit.params import ParamsError, load_params, load_yaml


class UsageError(ValueError):
    """A bad command line (``-p`` without ``=``, unparsable value, unknown parameter): exit 2."""


class RunInputError(ValueError):
    """Bad input to :func:`run_notebook` (a missing notebook, an invalid params file, a bad or
    unknown ``-p``); its text is the whole message (the CLI prefixes ``perfkit: ``)."""


def parse_kv(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``-p KEY=VALUE`` items -> {key: value read as YAML 1.2 (``1e3`` is a number)}.
    Raises :class:`UsageError`."""
    out: dict[str, Any] = {}
    for it in items or []:
        if "=" not in it:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if not k:
            raise UsageError(f"-p expects KEY=VALUE, got {it!r} (empty key)")
        try:
            out[k] = load_yaml(v) if v != "" else ""
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            shown = repr(v) if len(v) <= 80 else repr(v[:60]) + f"… ({len(v):,} characters)"
            raise UsageError(
                f"-p {k}: value {shown} is not valid YAML ({where}); quote strings "
                f"with special characters, e.g. -p '{k}=\"...\"'"
            ) from None
    return out


def check_notebook_parameters(nb: Path, given: dict[str, Any]) -> list[str]:
    """The names the notebook's ``parameters`` cell declares; :class:`UsageError` for a ``-p``
    name it lacks."""
    import papermill as pm

    try:
        declared = list(pm.inspect_notebook(str(nb)))
    except Exception as exc:  # noqa: BLE001 - not a notebook, unreadable JSON, ...
        raise UsageError(f"cannot read the parameters of {nb}: {exc}") from None
    unknown = [k for k in given if k not in declared]
    if not unknown:
        return declared
    hints = [f"{k!r}{did_you_mean(k, declared)}" for k in unknown]
    known = ", ".join(declared) if declared else "none (the notebook has no parameters cell)"
    raise UsageError(
        f"{nb.name}: unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; known: {known}"
    )


def notebook_params(nb: Path, params_file: str | None, kv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The parameters of one run: the params file's for this notebook (when given), then ``-p``
    items, validated (:func:`perfkit.nbparams.validate`); ``fail_on`` ``never`` unless given (the
    exit code comes from verdict.json). Raises :class:`RunInputError`."""
    from perfkit.nbparams import validate
    from perfkit.suite.execute import notebook_parameters

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
    except UsageError as exc:
        raise RunInputError(str(exc)) from None
    except ParamsError as exc:
        raise RunInputError(f"invalid parameters for {nb.name}:\n{exc}") from None
    params.update(given)
    if "fail_on" in declared and "fail_on" not in given:
        params["fail_on"] = "never"
    return params


@dataclass
class RunDir:
    """A run directory: ``path``; ``top`` the outermost folder this run creates; ``created``."""

    path: Path
    top: Path
    created: bool

    def remove_if_empty(self) -> None:
        """Nothing ran: leave no empty run directory (only what this run created, holding no file)."""
        if self.created and self.top.exists() and not any(f.is_file() for f in self.top.rglob("*")):
            shutil.rmtree(self.top, ignore_errors=True)


def run_dir_for(name: str, given: str | None) -> RunDir:
    """The run directory of notebook ``name``: ``given`` (``-p run_dir=``), else a new
    ``outputs/<name>/<timestamp>/`` (made, empty, by :func:`perfkit.suite.preflight.default_out`)."""
    from perfkit.suite.preflight import default_out, outputs_base

    def outermost_new(top: Path) -> Path:
        while not top.parent.exists():
            top = top.parent
        return top

    if given:
        path = Path(given).resolve()
        return RunDir(path, outermost_new(path), not path.exists())
    base = outputs_base(name).resolve()
    # remove what this run creates, outputs/ included, if nothing ran
    top = None if base.exists() else outermost_new(base)
    path = default_out(name).resolve()
    return RunDir(path, top or path, True)


def execute_with_bars(nb: Path, out: Path, params: dict[str, Any], timeout_s: float | None):
    """Execute the notebook (:func:`perfkit.suite.execute_owned`: what its kernel starts ended
    here); on a terminal, its requests' progress bars (the estimate from the investigation's plan)."""
    from perfkit.engine.owner import become_subreaper
    from perfkit.investigations import registry
    from perfkit.measuring.progress import RunBars
    from perfkit.suite import execute_owned

    plan: list[int] = []
    if nb.stem in registry.names() and not params.get("bundle_dir"):
        s = registry.get(nb.stem)
        fields = s.params_model.model_fields
        with contextlib.suppress(ValueError):  # invalid: no bars, the notebook's bind cell says why
            sec = s.params_model.model_validate({k: v for k, v in params.items() if k in fields})
            plan = list(s.plan(sec)) if s.plan is not None else []
    planned = sum(plan)
    # the kernel's stderr (its shutdown noise: a traceback when interrupted) goes to a log; the
    # bars to the terminal
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
    """What :func:`run_notebook` did: the execution ``result`` (perfkit.suite's), the ``verdict``
    (None unless it ran to the end), the gate ``word`` (pass / fail / not gated / error), the
    executed notebook ``out`` and the ``run_dir``."""

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
    """Run one notebook with papermill: its parameters from ``params_file`` then ``kv`` (``-p``),
    validated before the kernel starts; the executed copy at ``out`` (default
    RUN_DIR/notebooks/NAME). A run that errors before writing anything leaves no run directory.
    Raises :class:`RunInputError` for bad input, :class:`~perfkit.common.MissingExtra` for
    the history notebook without ``perfkit[history]``."""
    from perfkit.nbparams import HISTORY

    nb = Path(notebook)
    if nb.stem == HISTORY:
        require_extra("history", nb.name)
    params = notebook_params(nb, params_file, kv)
    rd = run_dir_for(nb.stem, params.get("run_dir"))
    params["run_dir"] = str(rd.path)
    dest = Path(out) if out else rd.path / "notebooks" / nb.name
    r = execute_with_bars(nb, dest, params, timeout_s)
    v = read_verdict(rd.path / nb.stem) if r.status == "ok" else None
    if r.error:
        rd.remove_if_empty()
    return NotebookRun(r, v, gate_result(r.status, v, r.ename), dest, rd.path)

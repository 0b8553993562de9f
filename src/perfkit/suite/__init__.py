"""Papermill orchestration: run the investigation notebooks, gate the run, write its outputs
(:func:`run_suite`, :func:`merge_runs`; docs/suite.md, "The run directory")."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from perfkit.common import jsonsafe
from perfkit.common.provenance import repo_root
from perfkit.engine.owner import spawn_reaper, stop_reaper
from perfkit.engine.spec import EngineSpec
from perfkit.gate.verdicts import (
    GATE,
    RUN_FILE,
    VERDICT_FILE,
    collect_verdicts,
    exit_code_for,
    jsonable,
    read_verdict,
    status_word,
)
from perfkit.gate.verdicts import notebooks as notebook_names
from perfkit.investigations import registry
from perfkit.measuring.progress import RunBars
from perfkit.params import ParamsError, SuiteParams, load_params
from perfkit.scaleout.shards import select
from perfkit.suite.execute import (
    NO_REPLAY_BUNDLE,
    NOT_MERGED,
    SCALEOUT,
    NotebookRun,
    SuiteError,
    check_baseline_file,
    check_replay_identity,
    default_out,
    execute_owned,
    link_latest,
    notebook_parameters,
    notebooks_dir,
    prepare_run_dir,
    replay_plan,
    run_plan,
)

log = logging.getLogger(__name__)


@dataclass
class SuiteResult:
    """What a suite run gave: its directory, exit code, status, notebooks and verdicts table."""

    run_dir: Path
    exit_code: int
    status: str
    notebooks: list[NotebookRun]
    verdicts: pd.DataFrame


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
    sets: Sequence[str] = (),
    executor: str | None = None,
    executor_options: Mapping[str, Any] | None = None,
) -> SuiteResult:
    """Run the suite (docs/suite.md, "The run directory"). Before anything runs, raises
    :class:`ParamsError` (bad params or baseline file, unknown ``tier``), :class:`SuiteError` (a
    replay without bundles, ``out`` holding another run without ``force``, ``executor`` with
    ``replay``) or ExecutorError (an unknown or missing ``executor``: its units into
    ``RUN/shards/1/``, then :func:`merge_runs`); later failures set the exit code. ``scaleout``: a
    merge document whose ``problems`` become a :data:`SCALEOUT` error entry (exit 2)."""
    from perfkit import report

    if executor is not None and replay:
        raise SuiteError("--executor measures; it cannot be combined with --replay")
    params = load_params(params_path, sets)
    check_baseline_file(params, params_path)
    if executor is not None:
        from perfkit.scaleout.shards import ShardInterrupted, run_shard
        from perfkit.scaleout.shards import executor as get_executor

        get_executor(executor)  # fails before anything runs
        run_dir = (Path(out) if out else default_out(params.name)).resolve()
        prepare_run_dir(run_dir, force=force)
        shard_dir = run_dir / "shards" / "1"
        if shard_dir.exists():
            shutil.rmtree(shard_dir)
        both = {"progress": progress, "sets": sets}
        units = {"only": only, "tier": tier, "executor": executor, "executor_options": executor_options}
        try:
            run_shard(params_path, shard_dir, 1, 1, **units, **both)
        except ShardInterrupted as exc:  # the manifest keeps what finished: report it (exit 2)
            log.error("%s", exc)
        shown = {"notebooks": notebooks, "screenshot": screenshot}
        return merge_runs([shard_dir], run_dir, params_path=params_path, force=True, **shown, **both)
    spec = params.engine_spec()
    try:
        spec.check()
    except FileNotFoundError as exc:
        if not replay:
            raise ParamsError(f"{params_path}: engine: {exc}") from None
    new_default = out is None
    replay_dir = Path(replay).resolve() if replay else None
    selected, skipped = select(params, only, tier)
    if replay_dir is not None:  # investigations without a bundle skipped
        check_replay_identity(replay_dir, selected, params, str(params_path))
        for n in replay_plan(replay_dir, selected, allow_empty=scaleout is not None):
            skipped[n] = NOT_MERGED if scaleout is not None else NO_REPLAY_BUNDLE
            log.warning("--replay %s: no %s bundle: %s skipped", replay_dir, n, n)
    run_dir = (Path(out) if out else default_out(params.name)).resolve()
    prepare_run_dir(run_dir, force=force, replay_dir=replay_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "params.yaml").write_text(
        f"# validated from {params_path}{''.join(f' --set {x}' for x in sets)}\n"
        + yaml.safe_dump(params.model_dump(), sort_keys=False)
    )
    nb_dir = Path(notebooks) if notebooks else notebooks_dir()
    names = [n for n in selected if n not in skipped] + [GATE]
    runs: list[NotebookRun] = [
        NotebookRun(n, status="skipped", reason=skipped[n]) for n in registry.names() if n in skipped
    ]
    t_start = time.monotonic()
    _run_notebooks(runs, names, nb_dir, run_dir, replay_dir, params, spec, progress)
    order = {n: i for i, n in enumerate(notebook_names())}
    runs.sort(key=lambda r: order.get(r.name, 99))
    if problems := list((scaleout or {}).get("problems") or []):
        error = f"{len(problems)} scale-out problem{'' if len(problems) == 1 else 's'}: {'; '.join(problems)}"
        runs.insert(0, NotebookRun(SCALEOUT, status="error", ename="ScaleOutError", error=error))
    verdicts = collect_verdicts(run_dir)
    code = exit_code_for(runs, verdicts)
    info = {
        "params_file": str(params_path),
        "params_set": list(sets),
        "name": params.name,
        "description": params.description,
        "exit_code": code,
        "status": status_word(code, verdicts),
        "wall_s": round(time.monotonic() - t_start, 2),
        "finished": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "replay": _shown_path(replay_dir) if replay_dir else None,
        "notebooks": [asdict(r) for r in runs],
    }
    if scaleout is not None:
        info["scaleout"] = {k: v for k, v in scaleout.items() if k != "params"}
    (run_dir / RUN_FILE).write_text(jsonsafe.dumps(jsonable(info), indent=2, default=str) + "\n")
    _write_report(report, run_dir, link=new_default, screenshot=screenshot)
    return SuiteResult(run_dir, code, status_word(code, verdicts), runs, verdicts)


def _run_notebooks(
    runs: list[NotebookRun],
    names: list[str],
    nb_dir: Path,
    run_dir: Path,
    replay_dir: Path | None,
    params: SuiteParams,
    spec: EngineSpec,
    progress: bool,
) -> None:
    """Run ``names`` in order into ``runs``; Ctrl-C or SIGTERM: the one under way an error."""
    from tqdm.std import tqdm

    def run_one(name: str) -> NotebookRun | None:  # None: interrupted (Ctrl-C or SIGTERM)
        src, dst = nb_dir / f"{name}.ipynb", run_dir / "notebooks" / f"{name}.ipynb"
        if not src.exists():
            return NotebookRun(
                name, status="error", error=f"notebook {src} not found", ename="FileNotFoundError"
            )
        (run_dir / name / VERDICT_FILE).unlink(missing_ok=True)
        log.info("running %s", src)
        try:
            r = execute_owned(
                src,
                dst,
                notebook_parameters(name, params, run_dir, replay_dir),
                bars,
                planned[name][1],
                grace_s=spec.stop_grace_s,
                in_flight_error=True,
                cwd=run_dir,
                timeout_s=params.timeout_s,
            )
        except KeyboardInterrupt:
            return None
        if r.status == "ok" and read_verdict(run_dir / name) is None:
            r.status, r.ename = "error", "MissingVerdict"
            r.error = f"notebook {name} finished without writing {name}/{VERDICT_FILE}"
        return r

    # a copy of the terminal's stderr: fd 2 goes to kernel logs meanwhile
    bar_file = os.fdopen(os.dup(2), "w") if progress else sys.stderr
    it = tqdm(names, desc="perfkit suite", unit="notebook", disable=not progress, file=bar_file)
    planned = {n: run_plan(params, [n]) if replay_dir is None else (0, 0) for n in names}
    bars = RunBars(bar_file, *(sum(p[i] for p in planned.values()) for i in (0, 1)), enabled=progress)
    (run_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    reaper = spawn_reaper(run_dir / "notebooks", spec.stop_grace_s) if replay_dir is None else None
    try:
        for name in it:
            it.set_postfix_str(name)
            r = run_one(name)
            if r is None:  # Ctrl-C or SIGTERM: stop here, but still write the report (exit 2)
                log.error("interrupted while running %s: writing the report of what ran", name)
                why = f"interrupted (Ctrl-C or SIGTERM) while running {name}"
                runs.append(NotebookRun(name, status="error", ename="KeyboardInterrupt", error=why))
                rest = names[names.index(name) + 1 :]
                runs += [NotebookRun(n, status="skipped", reason="not run: interrupted") for n in rest]
                break
            runs.append(r)
    finally:
        stop_reaper(reaper)
    bars.close()
    it.close()


def _write_report(report: Any, run_dir: Path, *, link: bool, screenshot: bool) -> None:
    """summary.md (and ``$GITHUB_STEP_SUMMARY``), report.html, the ``latest`` link, report.png."""
    summary = report.write_summary(run_dir)
    gh = os.environ.get("GITHUB_STEP_SUMMARY")
    if gh:
        try:
            with open(gh, "a", encoding="utf-8") as fh:
                fh.write(summary + "\n")
        except OSError as exc:
            log.warning("cannot append to GITHUB_STEP_SUMMARY %s: %s", gh, exc)
    html = report.render_report(run_dir)
    if link:
        link_latest(run_dir)
    if screenshot:
        try:
            report.screenshot(html, run_dir / "report.png")
        except Exception as exc:  # noqa: BLE001 - a screenshot is a nicety
            log.warning("no screenshot: %s", exc)


def _shown_path(path: Path) -> str:
    """``path`` relative to the perfkit checkout when inside it, else absolute."""
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
    sets: Sequence[str] = (),
) -> SuiteResult:
    """``perfkit merge DIR... --out RUN``: shards joined into ``RUN/merged/``, then
    :func:`run_suite` replaying them; merge problems make exit 2. Raises ParamsError (a bad
    ``params_path``) or SuiteError (``out`` holds another run without ``force``; nothing merged)."""
    from perfkit.scaleout.merge import MERGED_DIR, merge_shards

    run_dir = Path(out).resolve()
    params = load_params(params_path, sets) if params_path else None
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
    if not doc["merged"]:  # still a run: its report names every problem
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
        sets=sets if params_path else (),
    )

"""``perfkit merge`` and ``perfkit suite --executor``: shards joined, then replayed by
:func:`perfkit.suite.orchestrate.run_suite`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfkit.params import load_params
from perfkit.suite.orchestrate import SuiteResult, run_suite
from perfkit.suite.preflight import SuiteError, check_baseline_file, default_out, prepare_run_dir

log = logging.getLogger(__name__)


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
    """``perfkit merge DIR... --out RUN``: join shard outputs into ``RUN/merged/``
    (:func:`perfkit.scaleout.merge.merge_shards`), then the usual path in replay mode:
    notebooks (every check judged again), gate, report, summary. Missing shards, failed units
    and shards or parts measured with other params, commit, perfkit version, engine or request
    are named in run.json, summary.md and the report, and make the exit code 2
    (``allow_mixed_commits``: other commits are accepted and each unit's shown).

    Raises:
        ParamsError: a bad ``params_path``. SuiteError: ``out`` holds another run (without
            ``force``), or nothing could be merged (no readable shard, no unit output).
    """
    from perfkit.scaleout.manifest import MERGED_DIR
    from perfkit.scaleout.merge import merge_shards

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
        sets=sets if params_path else (),
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
    sets: Sequence[str] = (),
) -> SuiteResult:
    """``perfkit suite --executor NAME``: every unit of work through that executor (one shard of
    one, into ``RUN/shards/1/``), then :func:`merge_runs` into ``RUN``.

    Raises:
        ParamsError, SuiteError: as :func:`merge_runs`. ExecutorError: unknown or missing
            executor (e.g. ``ray`` without ``perfkit[ray]``).
    """
    from perfkit.scaleout.executor import executor as get_executor
    from perfkit.scaleout.shards import ShardInterrupted, run_shard

    params = load_params(params_path, sets)
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
            sets=sets,
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
        sets=sets,
    )

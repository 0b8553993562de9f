"""Running units of work: :func:`run_unit`, the executors, :func:`run_shard` (``perfkit suite
--partition I/N``) and :func:`refresh_estimates`; re-exports :mod:`perfkit.scaleout.merge`'s names.
Layouts: docs/scale-out.md.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from perfkit.common import MissingExtra, jsonsafe, require_extra
from perfkit.common.provenance import git_commit
from perfkit.common.version import __version__
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.owner import Watch, describe
from perfkit.engine.spec import EngineSpec
from perfkit.gate import baseline as bl
from perfkit.gate.baseline.files import atomic_write_text
from perfkit.gate.run import resolve_baseline_file
from perfkit.investigations import registry
from perfkit.investigations.registry import RunContext
from perfkit.measuring.progress import listening
from perfkit.params import ParamsError, SuiteParams, load_params
from perfkit.scaleout.merge import (  # noqa: F401 (re-exported)
    MANIFEST,
    MERGE_FILE,
    MERGED_DIR,
    PLAN_NOT_RECORDED,
    TIERS,
    UNITS_DIR,
    concurrent_pairs,
    merge_shards,
    params_hash,
)
from perfkit.scaleout.units import (  # noqa: F401 (ExecutorError re-exported)
    ExecutorError,
    OnEvent,
    RunUnit,
    UnitOutcome,
    WorkUnit,
    check_retries,
    newest_log_tail,
    partition,
    plan_units,
    settle,
)

log = logging.getLogger(__name__)


#: characters of logs kept with an error outcome
LOG_TAIL_CHARS = 4000
#: ``--executor`` values
EXECUTORS = ("inprocess", "ray")


def _unit(unit: Mapping[str, Any] | WorkUnit) -> WorkUnit:
    return unit if isinstance(unit, WorkUnit) else WorkUnit.from_dict(unit)


def run_unit(unit: Mapping[str, Any] | WorkUnit, out_dir: Path) -> None:
    """Measure one unit (or its dict): each part's bundle to ``out_dir/<part id>/``. Raises
    ValueError for params its model refuses, InvestigationError for a whole part that measured
    nothing usable (bundle saved first), else whatever the engine or investigation raised."""
    u = _unit(unit)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = EngineSpec.from_dict(dict(u.engine))
    request = VideoRequestSpec.from_dict(dict(u.request))
    shared: dict[str, Any] = {}
    for part in u.parts:
        s = registry.get(part.investigation)
        sec = s.params_model.model_validate(part.params)
        dest = out_dir / part.id
        ctx = RunContext(engine=engine, request=request, work_dir=dest / "launches", shared=dict(shared))
        log.info("unit %s: running %s", u.id, part.id)
        t0 = time.time()
        watch = Watch.start()
        try:
            bundle = s.run(ctx, sec)
        finally:
            left = watch.reap(grace_s=engine.stop_grace_s)
        bundle.meta["scaleout"] = {
            "unit": u.id,
            "part": part.id,
            "key": part.key,
            "wall_s": round(time.time() - t0, 2),
            "planned": {"engine": dict(u.engine), "request": dict(u.request), "params": dict(part.params)},
        }
        if left:
            bundle.meta["scaleout"]["outlived_launches"] = describe(left)
        bundle.save(dest)
        if part.key is None:  # a split part is judged whole: the joined bundle, on replay
            s.check_bundle(bundle)
            shared.setdefault(part.investigation, bundle)


def run_units_inprocess(
    units: Sequence[Mapping[str, Any] | WorkUnit],
    run_unit: RunUnit = run_unit,
    dest: Path | str = ".",
    *,
    retries: int = 0,
    on_event: OnEvent | None = None,
) -> list[UnitOutcome]:
    """Run ``units`` in turn in this process, each into ``dest/<unit id>/``: one outcome each.
    A unit that raises is retried ``retries`` times, then is an ``error``; ValueError: retries < 0."""
    emit = check_retries(retries, on_event)
    dest = Path(dest)
    outcomes = []
    host = socket.gethostname()
    for raw in units:
        u = _unit(raw)
        out_dir = dest / u.id
        emit("started", u.id, None)

        def on_progress(ev: Mapping[str, Any], uid: str = u.id) -> None:
            if ev.get("event") == "launch_done":
                emit("launch", uid, None)

        for attempt in range(1, retries + 2):
            if out_dir.exists():
                shutil.rmtree(out_dir)
            t0, wall0 = time.time(), time.monotonic()
            oc = UnitOutcome(u.id, "ok", out_dir=out_dir, attempts=attempt, host=host)
            try:
                with listening(on_progress):
                    run_unit(u.to_dict(), out_dir)
            except Exception as exc:  # noqa: BLE001 - one failed unit must not lose the others
                tail = traceback.format_exc() + newest_log_tail(out_dir, LOG_TAIL_CHARS)
                oc.status, oc.error = "error", f"{type(exc).__name__}: {exc}"
                oc.log_tail = tail[-LOG_TAIL_CHARS:]
                oc.out_dir = out_dir if out_dir.exists() else None
            oc.wall_s = round(time.monotonic() - wall0, 2)
            oc.started_at, oc.ended_at = t0, time.time()
            if settle(u.to_dict(), oc, retries, out_dir, emit):
                break
        outcomes.append(oc)
    return outcomes


def executor(name: str) -> Callable[..., list[UnitOutcome]]:
    """``run_units_<name>`` of :data:`EXECUTORS`; ExecutorError for an unknown name or one not
    installed (the message says what to install)."""
    if name not in EXECUTORS:
        raise ExecutorError(f"--executor {name!r}: unknown executor; known: {', '.join(EXECUTORS)}")
    if name == "inprocess":
        return run_units_inprocess
    try:
        require_extra(name, f"--executor {name}")
    except MissingExtra as exc:
        raise ExecutorError(str(exc)) from None
    try:
        from perfkit.scaleout.ray_executor import run_units_ray
    except ImportError as exc:
        raise ExecutorError(
            f"--executor {name}: perfkit.scaleout.ray_executor cannot be imported ({exc}); "
            f"install it with pip install 'perfkit[{name}]'"
        ) from None
    return run_units_ray


def progress_events(
    units: Sequence[WorkUnit], *, enabled: bool = True, file: Any = None
) -> tuple[OnEvent, Callable[[], None]]:
    """One tqdm bar over every unit's launches: ``(on_event for the executor, close)``."""
    from tqdm.std import tqdm

    launches = {u.id: max(u.launches, 1) for u in units}
    bar = tqdm(
        total=sum(launches.values()), desc="perfkit units", unit="launch", disable=not enabled, file=file
    )
    running: list[str] = []
    failed: list[str] = []
    done: dict[str, int] = {}

    def on_event(event: str, unit_id: str, outcome: UnitOutcome | None) -> None:
        if event == "started" and unit_id not in running:
            running.append(unit_id)
        elif event == "launch" and done.get(unit_id, 0) < launches.get(unit_id, 1):
            done[unit_id] = done.get(unit_id, 0) + 1
            bar.update(1)
        elif event == "retry":
            bar.write(f"retrying {unit_id}")
        elif event == "finished":
            if unit_id in running:
                running.remove(unit_id)
            if outcome is not None and outcome.status != "ok":
                failed.append(unit_id)
            bar.update(max(launches.get(unit_id, 1) - done.get(unit_id, 0), 0))
            done[unit_id] = launches.get(unit_id, 1)
        bar.set_postfix_str(", ".join(running) + (f" ({len(failed)} failed)" if failed else ""))

    return on_event, bar.close


_executor = executor


def select(
    params: SuiteParams, only: Iterable[str] | None = None, tier: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """(selected names in run order, {left-out name: why}). Raises ParamsError for an unknown
    tier, ``only`` naming a disabled investigation, or nothing left selected (saying why)."""
    if tier is not None and tier not in TIERS:
        raise ParamsError(f"--tier {tier!r}: unknown tier; known: {', '.join(TIERS)}")
    params.refuse_disabled(only)
    only_set = set(only) if only else None
    enabled = params.enabled()
    selected, skipped = [], {}
    for n in registry.names():
        if n not in enabled:
            skipped[n] = "disabled in the params"
        elif only_set is not None and n not in only_set:
            skipped[n] = "not selected by --only"
        elif tier is not None and params.section(n).tier != tier:
            skipped[n] = f"tier {params.section(n).tier}, not selected by --tier {tier}"
        else:
            selected.append(n)
    if only_set and not selected:
        raise ParamsError(
            "nothing selected: " + "; ".join(f"{n}: {skipped[n]}" for n in registry.names() if n in only_set)
        )
    return selected, skipped


def _baseline_doc(params: SuiteParams) -> dict[str, Any] | None:
    f = params.baseline.file
    if not f:
        return None
    try:
        return bl.load_baseline(resolve_baseline_file(f))
    except (OSError, ValueError) as exc:
        log.warning("no estimates from baseline %s: %s", f, exc)
        return None


def run_shard(
    params_path: str | Path,
    out: str | Path,
    index: int,
    total: int,
    *,
    only: Iterable[str] | None = None,
    tier: str | None = None,
    executor: str = "inprocess",
    executor_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    sets: Sequence[str] = (),
) -> dict[str, Any]:
    """Run shard ``index`` of ``total`` (1-based): bundles under ``out/units/``, returns the
    manifest ``out/shard.json`` (docs/scale-out.md, "Partitions"). Raises ParamsError or
    FileNotFoundError (params), ExecutorError, ValueError (tier, index/total out of range)."""
    if not (total >= 1 and 1 <= index <= total):
        raise ValueError(f"shard {index}/{total}: need 1 <= I <= N")
    params = load_params(params_path, sets)
    run_units = _executor(executor)
    selected, skipped = select(params, only, tier)
    units = plan_units(params, selected, baseline=_baseline_doc(params))
    shards = partition(units, total)
    mine = shards[index - 1]
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "kind": "perfkit-shard",
        "params_file": str(params_path),
        "params_sha256": params_hash(params),
        "params": params.model_dump(),
        "partition": {"index": index, "total": total},
        "selected": selected,
        "skipped": skipped,
        "only": list(only) if only else None,
        "tier": tier,
        "units": [u.to_dict() for u in units],
        "outcomes": [],
        "perfkit_commit": git_commit(),
        "perfkit_version": str(__version__),
        "executor": executor,
    }
    _write_manifest(out, manifest)
    log.info(
        "shard %d/%d: %d of %d units (%s)", index, total, len(mine), len(units), ", ".join(u.id for u in mine)
    )
    bar_event, close = progress_events(mine, enabled=progress)
    t0 = time.monotonic()
    done: dict[str, dict[str, Any]] = {}

    def on_event(event: str, unit_id: str, outcome: UnitOutcome | None) -> None:
        bar_event(event, unit_id, outcome)
        if event == "finished" and outcome is not None:
            done[unit_id] = outcome.to_dict()
            manifest["outcomes"] = list(done.values())
            _write_manifest(out, manifest)

    try:
        outcomes = run_units(
            [u.to_dict() for u in mine],
            run_unit,
            out / UNITS_DIR,
            retries=params.scaleout.retries,
            on_event=on_event,
            **dict(executor_options or {}),
        )
    except KeyboardInterrupt as exc:
        left = [u.id for u in mine if u.id not in done]
        manifest["interrupted"] = (
            f"interrupted ({exc or 'Ctrl-C'}) after {len(done)} of {len(mine)} units; "
            f"not finished: {', '.join(left) or '(none)'}"
        )
        manifest["wall_s"] = round(time.monotonic() - t0, 2)
        _write_manifest(out, manifest)
        raise ShardInterrupted(
            f"shard {index}/{total}: {manifest['interrupted']} ({out / MANIFEST})"
        ) from None
    finally:
        close()
    manifest["outcomes"] = [o.to_dict() for o in outcomes]
    manifest["wall_s"] = round(time.monotonic() - t0, 2)
    _write_manifest(out, manifest)
    return manifest


class ShardInterrupted(RuntimeError):
    """A shard run stopped by Ctrl-C or SIGTERM (exit 2); its manifest says what finished."""


def _write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    atomic_write_text(out / MANIFEST, jsonsafe.dumps(manifest, indent=2, default=str) + "\n")


def refresh_estimates(baseline_file: str | Path, sources: Iterable[str | Path]) -> dict[str, float]:
    """Set the baseline's ``estimated_full_test_time_s`` from units' wall times (shard manifests,
    merge files, run directories), shared evenly among each unit's case ids; cases the file lacks
    are left out. Returns case id -> estimate (s). Raises ValueError (no finished unit, a bad
    baseline), OSError."""
    doc = bl.load_baseline(Path(baseline_file))
    cases = doc.setdefault("scenarios", {})
    written: dict[str, float] = {}
    found = 0
    for src in sources:
        p = Path(src)
        files = [p] if p.is_file() else [p / MANIFEST, p / MERGED_DIR / MERGE_FILE, p / MERGE_FILE]
        for f in files:
            if not f.is_file():
                continue
            try:
                m = json.loads(f.read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{f}: unreadable ({exc})") from None
            units = {u["id"]: WorkUnit.from_dict(u) for u in m.get("units") or []}
            for oc in m.get("outcomes") or []:
                u = units.get(oc.get("unit_id"))
                if u is None or oc.get("status") != "ok" or not oc.get("wall_s"):
                    continue
                found += 1
                ids = [c for part in u.parts for c in part.case_ids]
                if not ids:
                    continue
                share = round(float(oc["wall_s"]) / len(ids), 1)
                for c in ids:
                    if c in cases:
                        cases[c]["estimated_full_test_time_s"] = share
                        written[c] = share
    if not found:
        raise ValueError(
            "no finished unit in " + ", ".join(map(str, sources)) + f" (expected {MANIFEST} or {MERGE_FILE})"
        )
    bl.save_baseline(doc, Path(baseline_file))
    return written

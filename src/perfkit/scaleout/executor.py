"""Run units of work: :func:`run_unit` measures one unit without Jupyter (``DEST/<unit id>/<part
id>/`` bundles and ``unit.json``), the in-process executor, :func:`executor` by name, and
:func:`progress_events`, the one progress bar every executor drives through ``on_event``.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from perfkit.common import MissingExtra, require_extra
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.owner import Watch, describe
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import registry
from perfkit.investigations.registry import RunContext
from perfkit.measuring.progress import listening
from perfkit.scaleout.unit_outcome import OnEvent, RunUnit, UnitOutcome, newest_log_tail, write_unit_file
from perfkit.scaleout.units import WorkUnit

log = logging.getLogger(__name__)


#: characters of logs kept with an error outcome
LOG_TAIL_CHARS = 4000
#: ``--executor`` values
EXECUTORS = ("inprocess", "ray")


class ExecutorError(ValueError):
    """An executor that cannot be used (unknown name, its module or package missing): exit 2."""


def _unit(unit: Mapping[str, Any] | WorkUnit) -> WorkUnit:
    return unit if isinstance(unit, WorkUnit) else WorkUnit.from_dict(unit)


def run_unit(unit: Mapping[str, Any] | WorkUnit, out_dir: Path) -> None:
    """Measure one unit (a :class:`WorkUnit` or its dict) into ``out_dir``: its parts in order,
    each bundle to ``out_dir/<part id>/``; a part may reuse the earlier whole investigations' launches.

    Raises:
        ValueError: a part's params that its params model refuses (naming the field).
        InvestigationError: a whole-investigation part that measured nothing usable (its bundle is saved
            first); a split part's bundle is checked once joined, when the merged run replays it.
        Exception: whatever the engine or the investigation raised.
    """
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
        finally:  # what outlived the part's launches is ended here
            left = watch.reap(grace_s=engine.stop_grace_s)
        bundle.meta["scaleout"] = {
            "unit": u.id,
            "part": part.id,
            "key": part.key,
            "wall_s": round(time.time() - t0, 2),
            # what it was measured for: merge compares it with the manifest's unit
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
    """Run ``units`` one after another in this process, each into ``dest/<unit id>/``; one
    :class:`UnitOutcome` per unit, in order. A unit that raises is retried ``retries`` more
    times (its partial output removed first), then is an ``error`` outcome; the others still run.

    Raises:
        ValueError: ``retries`` < 0.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    dest = Path(dest)
    outcomes = []
    host = socket.gethostname()
    emit = on_event or (lambda *_: None)
    for raw in units:
        u = _unit(raw)
        out_dir = dest / u.id
        emit("started", u.id, None)
        attempt = 0
        while True:
            attempt += 1
            if out_dir.exists():
                shutil.rmtree(out_dir)
            t0, wall0 = time.time(), time.monotonic()

            def on_progress(ev: Mapping[str, Any], uid: str = u.id) -> None:
                if ev.get("event") == "launch_done":
                    emit("launch", uid, None)

            try:
                with listening(on_progress):
                    run_unit(u.to_dict(), out_dir)
                oc = UnitOutcome(u.id, "ok", out_dir=out_dir, attempts=attempt, host=host)
            except Exception as exc:  # noqa: BLE001 - one failed unit must not lose the others
                err = f"{type(exc).__name__}: {exc}"
                if attempt <= retries:
                    log.warning(
                        "unit %s failed (attempt %d of %d): %s: retrying", u.id, attempt, retries + 1, err
                    )
                    emit("retry", u.id, None)
                    continue
                log.error("unit %s failed after %d attempt(s): %s", u.id, attempt, err)
                tail = traceback.format_exc() + newest_log_tail(out_dir, LOG_TAIL_CHARS)
                oc = UnitOutcome(
                    u.id,
                    "error",
                    out_dir=out_dir if out_dir.exists() else None,
                    attempts=attempt,
                    error=err,
                    log_tail=tail[-LOG_TAIL_CHARS:],
                    host=host,
                )
            oc.wall_s = round(time.monotonic() - wall0, 2)
            oc.started_at, oc.ended_at = t0, time.time()
            break
        write_unit_file(out_dir, u.to_dict(), oc)
        outcomes.append(oc)
        emit("finished", u.id, oc)
    return outcomes


def executor(name: str) -> Callable[..., list[UnitOutcome]]:
    """The executor ``name`` (:data:`EXECUTORS`): ``run_units_<name>(units, run_unit, dest, *,
    retries=0, on_event=None, ...)``.

    Raises:
        ExecutorError: an unknown name, or the package it needs (``ray``) is not installed; the
            message says what to install.
    """
    if name not in EXECUTORS:
        raise ExecutorError(f"--executor {name!r}: unknown executor; known: {', '.join(EXECUTORS)}")
    if name == "inprocess":
        return run_units_inprocess
    try:
        require_extra(name, f"--executor {name}")
    except MissingExtra as exc:
        raise ExecutorError(str(exc)) from None
    from perfkit.scaleout.ray_executor import run_units_ray

    return run_units_ray


def progress_events(
    units: Sequence[WorkUnit], *, enabled: bool = True, file: Any = None
) -> tuple[OnEvent, Callable[[], None]]:
    """One tqdm bar over every unit's launches, whichever executor drives it: ``(on_event,
    close)``; ``on_event`` for the executor, ``close`` at the end."""
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

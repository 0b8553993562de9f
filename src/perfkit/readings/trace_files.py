"""Reading several profiler traces at once: one process per trace, up to the usable cores.

A torch.profiler Chrome trace of a whole request (sglang's ``profile_all_stages``, with
``record_shapes`` and ``with_stack``) holds ~200 k events per 4 MB of gzip and takes seconds
of CPU to parse (:func:`perfkit.readings.traces.load_trace`, mostly ``json.loads``); an A/B
report reads four a side. Files adding up to :data:`PARALLEL_MIN_BYTES` or more are read in a
process pool (``forkserver``, with this module preloaded); smaller sets, or a pool that cannot
start, are read in this process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfkit.readings import traces as tr

log = logging.getLogger(__name__)

#: gzip bytes of a set of traces from which they are read in parallel: about a second of
#: parsing, more than a worker's start (its pandas import) costs
PARALLEL_MIN_BYTES = 2 * 2**20


@dataclass(frozen=True)
class TraceTables:
    """One trace file's ``events`` (:func:`~perfkit.readings.traces.op_events`) and ``overhead``
    (:func:`~perfkit.readings.traces.overhead_table`), or ``error`` (file and why) and both None."""

    events: pd.DataFrame | None
    overhead: pd.DataFrame | None
    error: str | None = None


def read_one(path: str | Path, stages: list[str] | None = None) -> TraceTables:
    """Read the trace at ``path`` (the rank from its file name, :func:`~perfkit.readings.traces.rank_of`;
    ``stages``: the request's performance.log stage names, which name its ``STAGE`` ranges,
    :func:`~perfkit.readings.traces.stage_names`). A :class:`~perfkit.readings.traces.TraceError`
    becomes ``error``; nothing else is caught."""
    try:
        doc = tr.load_trace(path)
    except tr.TraceError as exc:
        return TraceTables(None, None, str(exc))
    return TraceTables(tr.op_events(doc, stages), tr.overhead_table(doc, tr.rank_of(Path(path).name), stages))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_many(paths: list[Path], stages: list[list[str] | None] | None = None) -> list[TraceTables]:
    """:func:`read_one` of each of ``paths`` (with ``stages[i]``), in order; in parallel (module
    doc) when two or more files add up to :data:`PARALLEL_MIN_BYTES` on two or more cores. A
    missing file is an ``error``, as when read alone."""
    size = sum(p.stat().st_size for p in paths if p.is_file())
    workers = min(len(paths), _cores())
    names = list(stages) if stages is not None else [None] * len(paths)
    if workers < 2 or size < PARALLEL_MIN_BYTES:
        return [read_one(p, s) for p, s in zip(paths, names)]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    log.debug("reading %d traces (%.1f MiB) in %d processes", len(paths), size / 2**20, workers)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            return list(pool.map(read_one, paths, names))
    except (BrokenProcessPool, OSError) as exc:  # no worker could start or one died: read here
        log.warning("reading %d traces in parallel failed (%s): reading them one by one", len(paths), exc)
        return [read_one(p, s) for p, s in zip(paths, names)]

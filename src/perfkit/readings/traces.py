"""Profiler traces (torch.profiler Chrome traces, sglang's per-request files) as op tables, several
read at once in a process pool (:func:`read_many`). Layouts, what an op is, the pool's threshold:
docs/below-the-stage.md, "Analysis"."""

from __future__ import annotations

import gzip
import json
import logging
import math
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

#: names of ranges that are structure, not ops
STEP_RANGE = re.compile(r"^denoising_step_(\d+)$")
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: sglang's stage range (``pipeline_executor.py``: ``maybe_record_function(f"STAGE {name}")``)
STAGE_RANGE = re.compile(r"^STAGE (.+)$")
#: registered stage name -> performance.log's class name (sglang ``composed_pipeline_base.py``)
REGISTERED_STAGES = {"denoising_stage": "DenoisingStage", "decoding_stage": "DecodingStage"}
DENOISING = "DenoisingStage"
#: the ProfilerStep sglang adds to ``active`` in an ``N_steps`` trace
WARMUP_PROFILER_STEP = 1
#: torch.compile's wrappers around a compiled graph: seen through, not ops
COMPILE_WRAPPER = re.compile(r"^(Torch-Compiled Region|## Call CompiledFxGraph|CompiledFunction$)")
#: columns of :func:`op_events`, :func:`step_ranges`, :func:`op_table`, :func:`op_diff`
EVENT_COLUMNS = ["op", "cat", "tid", "ts_us", "dur_ms", "stage", "step", "warmup_step", "top"]
STEP_COLUMNS = ["step", "name", "ts_us", "dur_ms", "warmup_step", "tail"]
OP_COLUMNS = ["op", "count", "total_ms", "mean_ms", "share"]
DIFF_COLUMNS = ["op", "count_a", "count_b", "ms_a", "ms_b", "delta_ms", "delta_share"]
#: (pid, tid) -> its top-level CPU ops' (start, end), µs
_Tops = dict[tuple[Any, Any], list[tuple[float, float]]]


#: the longest event a trace may hold (µs: one day); a longer ``dur`` is a corrupted file
MAX_DUR_US = 86_400e6


class TraceError(ValueError):
    """A trace file that cannot be read (naming the file and what was wrong)."""


#: the most JSON (bytes, uncompressed) one trace may hold: refused before parsing
MAX_TRACE_BYTES = 512 * 2**20


def load_trace(path: str | Path) -> dict[str, Any]:
    """The trace's JSON object. Raises TraceError naming the file (and the event and key): missing,
    not gzip/JSON, over :data:`MAX_TRACE_BYTES`, no ``traceEvents`` list, or a bad event."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            raw = (gzip.GzipFile(fileobj=fh) if gz else fh).read(MAX_TRACE_BYTES + 1)
        if len(raw) > MAX_TRACE_BYTES:
            raise TraceError(
                f"{p}: over {MAX_TRACE_BYTES // 2**20} MiB of JSON (uncompressed): refused before parsing"
            )
        doc = json.loads(raw)
    except TraceError:
        raise
    except (OSError, EOFError, ValueError, RecursionError) as exc:
        raise TraceError(f"{p}: not a readable Chrome trace: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{p}: no traceEvents list (not a torch.profiler Chrome trace)")
    for i, e in enumerate(doc["traceEvents"]):
        if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e:
            _check_event(e, f"{p}: traceEvents[{i}] ({str(e.get('name', ''))[:80]!r})")
    return doc


def _check_event(e: dict[str, Any], where: str) -> None:
    """Check the keys the tables read of a complete event; TraceError ``where: key ...``."""
    if not isinstance(e.get("name"), str):
        raise TraceError(f"{where}: name {e.get('name')!r} is not a string")
    for key in ("ts", "dur"):
        v = e.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (key == "dur" and not 0 <= v <= MAX_DUR_US):
            want = "a number from 0 to 1 day (µs)" if key == "dur" else "a finite number"
            raise TraceError(f"{where}: {key} {v!r} is not {want}")
    args = e.get("args")
    if args is not None and not isinstance(args, dict):
        raise TraceError(f"{where}: args {args!r} is not an object")
    corr = (args or {}).get("correlation")
    if corr is not None and (isinstance(corr, bool) or not isinstance(corr, (int, str))):
        raise TraceError(f"{where}: args.correlation {corr!r} is not an id (an integer or a string)")


def is_stage(name: str) -> bool:
    """A stage range: sglang's ``STAGE <name>``, or the older layout's ``...Stage``."""
    return name.startswith("STAGE ") or name.endswith("Stage")


def _structural(name: str) -> bool:
    return is_stage(name) or any(r.match(name) for r in (STEP_RANGE, PROFILER_STEP, COMPILE_WRAPPER))


def _complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def _threads(evs: list[dict[str, Any]], cats: tuple[str, ...]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    """(pid, tid) -> its events of ``cats`` by start; at equal starts the longer (enclosing) first."""
    out: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in evs:
        if e.get("cat") in cats:
            out.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for events in out.values():
        events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
    return out


def stage_names(trace: dict[str, Any], stages: Sequence[str] | None = None) -> dict[str, str]:
    """Stage range name -> table name (the i-th of ``stages`` when there are as many ranges)."""
    evs = sorted(
        (e for e in _complete(trace) if e.get("cat") == "user_annotation"), key=lambda e: float(e["ts"])
    )
    raw = list(dict.fromkeys(str(e.get("name", "")) for e in evs if is_stage(str(e.get("name", "")))))
    sgl = [n for n in raw if STAGE_RANGE.match(n)]
    out = {n: n for n in raw if n not in sgl}
    if stages is not None and len(stages) == len(sgl) and sgl:
        out.update(zip(sgl, stages))
    else:
        for n in sgl:
            x = STAGE_RANGE.match(n).group(1)  # type: ignore[union-attr]
            out[n] = REGISTERED_STAGES.get(x, x)
    return out


def _denoising_name(names: dict[str, str], stages: Sequence[str] | None) -> str:
    if "STAGE denoising_stage" in names:
        return names["STAGE denoising_stage"]
    return next((s for s in stages or () if "denoising" in s.lower()), DENOISING)


def step_ranges(trace: dict[str, Any]) -> pd.DataFrame:
    """Denoising-step ranges (:data:`STEP_COLUMNS`) in order; empty in a full_stages trace."""
    ann = [e for e in _complete(trace) if e.get("cat") == "user_annotation"]
    old = [e for e in ann if STEP_RANGE.match(str(e.get("name", "")))]
    stage_starts = [float(e["ts"]) for e in ann if STAGE_RANGE.match(str(e.get("name", "")))]
    rows = []
    for e in sorted(
        old or [e for e in ann if PROFILER_STEP.match(str(e.get("name", "")))], key=lambda e: e["ts"]
    ):
        name = str(e["name"])
        ts, dur = float(e["ts"]), float(e["dur"])
        k = int((STEP_RANGE.match(name) or PROFILER_STEP.match(name)).group(1))  # type: ignore[union-attr]
        tail = not old and any(ts <= s < ts + dur for s in stage_starts)
        rows.append((k, name, ts, dur / 1000.0, not old and k == WARMUP_PROFILER_STEP, tail))  # STEP_COLUMNS
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def op_events(trace: dict[str, Any], stages: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per op (:data:`EVENT_COLUMNS`): its innermost stage (``"(none)"``) and step (-1)
    on its thread, ``top`` when no op encloses it; kernels take their launch's stage and step."""
    return _op_events(_complete(trace), stage_names(trace, stages), stages)[0]


def _op_events(
    evs: list[dict[str, Any]], names: dict[str, str], stages: Sequence[str] | None
) -> tuple[pd.DataFrame, _Tops]:
    """:func:`op_events`' frame and the top-level CPU ops per thread."""
    denoising = _denoising_name(names, stages)
    # sglang's layout: ProfilerStep#k is step k; the older one's ProfilerSteps are not steps
    old = any(e.get("cat") == "user_annotation" and STEP_RANGE.match(str(e.get("name", ""))) for e in evs)
    step_re = STEP_RANGE if old else PROFILER_STEP
    rows: list[tuple[Any, ...]] = []
    launch_of: dict[Any, tuple[str, int, bool]] = {}
    tops: _Tops = {}
    cats = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    for (pid, tid), events in _threads(evs, cats).items():
        stack: list[tuple[float, dict[str, Any]]] = []  # (end, event)
        for e in events:
            ts, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= ts:
                stack.pop()
            name = str(e.get("name", ""))
            stage, step, inside_op = "(none)", -1, False
            for _, outer in stack:
                oname = str(outer.get("name", ""))
                if oname in names:
                    stage = names[oname]
                elif (m := step_re.match(oname)) is not None:
                    step = int(m.group(1))
                elif not _structural(oname) and outer.get("cat") != "cuda_runtime":
                    inside_op = True
            if stage == "(none)" and step >= 0:  # steps-only traces start inside the stage
                stage = denoising
            elif not old and stage != denoising:  # a trailing ProfilerStep holding decoding
                step = -1
            warm = not old and step == WARMUP_PROFILER_STEP
            cat = e.get("cat")
            if cat in ("cuda_runtime", "cuda_driver"):
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launch_of[corr] = (stage, step, warm)
            elif not _structural(name):  # a row of EVENT_COLUMNS
                rows.append((name, cat, tid, ts, dur / 1000.0, stage, step, warm, not inside_op))
                if not inside_op and cat in ("cpu_op", "user_annotation"):
                    tops.setdefault((pid, tid), []).append((ts, ts + dur))
            stack.append((ts + dur, e))
    for e in evs:
        if e.get("cat") != "kernel":
            continue
        stage, step, warm = launch_of.get((e.get("args") or {}).get("correlation"), ("(none)", -1, False))
        row = (str(e.get("name", "")), "kernel", e.get("tid"), float(e["ts"]), float(e["dur"]) / 1000.0)
        rows.append((*row, stage, step, warm, True))
    return pd.DataFrame(rows, columns=EVENT_COLUMNS), tops


def op_table(events: pd.DataFrame, *, kernels: bool = False, by_stage: bool = False) -> pd.DataFrame:
    """Wall time by top-level CPU op or kernel (:data:`OP_COLUMNS`; per stage), largest first."""
    sel = (
        events[events["cat"] == "kernel"] if kernels else events[(events["cat"] != "kernel") & events["top"]]
    )
    keys = ["stage", "op"] if by_stage else ["op"]
    cols = (["stage"] if by_stage else []) + OP_COLUMNS
    if sel.empty:
        return pd.DataFrame(columns=cols)
    g = sel.groupby(keys, sort=False)["dur_ms"].agg(count="count", total_ms="sum").reset_index()
    g["mean_ms"] = g["total_ms"] / g["count"]
    denom = g.groupby("stage")["total_ms"].transform("sum") if by_stage else g["total_ms"].sum()
    g["share"] = g["total_ms"] / denom
    g = g.sort_values(keys[:-1] + ["total_ms"], ascending=[True] * (len(keys) - 1) + [False])
    return g[cols].reset_index(drop=True)


def stage_top_ops(events: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The ``n`` ops with most time in each stage (columns ``stage`` + :data:`OP_COLUMNS`)."""
    return op_table(events, by_stage=True).groupby("stage", sort=False).head(n).reset_index(drop=True)


def median_op_table(traces: list[pd.DataFrame], *, kernels: bool = False) -> pd.DataFrame:
    """:func:`op_table` of several traces, ``count`` and ``total_ms`` the median (absent: 0)."""
    tables = [op_table(t, kernels=kernels).set_index("op") for t in traces]
    ops = list(dict.fromkeys(o for t in tables for o in t.index))
    if not ops:
        return pd.DataFrame(columns=OP_COLUMNS)
    g = pd.DataFrame({"op": ops})
    for c in ("count", "total_ms"):
        g[c] = np.median([t[c].reindex(ops, fill_value=0).to_numpy(float) for t in tables], axis=0)
    g["mean_ms"] = g["total_ms"] / g["count"].where(g["count"] > 0)
    g["share"] = g["total_ms"] / g["total_ms"].sum() if g["total_ms"].sum() > 0 else np.nan
    return g.sort_values("total_ms", ascending=False)[OP_COLUMNS].reset_index(drop=True)


def op_diff(
    a: pd.DataFrame | list[pd.DataFrame], b: pd.DataFrame | list[pd.DataFrame], *, kernels: bool = False
) -> pd.DataFrame:
    """Per op, from ``a`` to ``b`` (:data:`DIFF_COLUMNS`; ``delta_ms`` = b − a), largest |delta|
    first. A side is an :func:`op_events` frame or a list of them (:func:`median_op_table`)."""

    def table(x: pd.DataFrame | list[pd.DataFrame]) -> pd.DataFrame:
        return (median_op_table if isinstance(x, list) else op_table)(x, kernels=kernels).set_index("op")

    ta, tb = table(a), table(b)
    ops = list(dict.fromkeys([*ta.index, *tb.index]))
    out = pd.DataFrame({"op": ops})
    for c, side, t in (("count", "a", ta), ("count", "b", tb), ("total_ms", "a", ta), ("total_ms", "b", tb)):
        out[f"{'ms' if c == 'total_ms' else c}_{side}"] = t[c].reindex(ops, fill_value=0).to_numpy(float)
    out["delta_ms"] = out["ms_b"] - out["ms_a"]
    total = float(np.abs(out["delta_ms"]).sum())
    out["delta_share"] = np.abs(out["delta_ms"]) / total if total > 0 else np.nan
    out = out.reindex(out["delta_ms"].abs().sort_values(ascending=False).index)
    return out[DIFF_COLUMNS].reset_index(drop=True)


OVERHEAD_COLUMNS = (
    "rank stage window_ms op_ms cpu_overhead_ms cpu_overhead_share launch_ms kernels device_busy_ms "
    "device_idle_share"
).split()
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RANK_IN_NAME = re.compile(r"-global-rank(\d+)\.trace\.json(\.gz)?$")
NO_DEVICE = "not available on cpu (no device kernels)"


def rank_of(path: str | Path) -> int | None:
    """The rank sglang's file name carries (``…-global-rank{r}.trace.json.gz``), else None."""
    m = RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _union_ms(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length (ms) of the union of ``intervals`` (µs, start and end) clipped to [lo, hi]."""
    total, end = 0.0, lo  # a sweep by start: each interval adds what lies past the covered end
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi):
        if b > end:
            total, end = total + b - max(a, end), b
    return total / 1000.0


def overhead_table(
    trace: dict[str, Any], rank: int | None = None, stages: Sequence[str] | None = None
) -> pd.DataFrame:
    """CPU overhead and device idle share (ms) per stage, then ``(all stages)``
    (:data:`OVERHEAD_COLUMNS`; docs/below-the-stage.md, "Overhead and idle share"). Without
    device events the device columns are NaN. Empty without a stage or step range."""
    return _tables(trace, stages, rank)[1]


def _tables(
    trace: dict[str, Any], stages: Sequence[str] | None, rank: int | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    evs = _complete(trace)
    names = stage_names(trace, stages)
    events, tops = _op_events(evs, names, stages)
    return events, _overhead(trace, evs, names, tops, rank, stages)


def _overhead(
    trace: dict[str, Any],
    evs: list[dict[str, Any]],
    names: dict[str, str],
    tops: _Tops,
    rank: int | None,
    stages: Sequence[str] | None,
) -> pd.DataFrame:
    def iv(e: dict[str, Any]) -> tuple[float, float]:
        return float(e["ts"]), float(e["ts"]) + float(e["dur"])

    denoising = _denoising_name(names, stages)
    windows: dict[str, list[tuple[float, float]]] = {}
    thread: dict[str, tuple[Any, Any]] = {}
    ann = sorted((e for e in evs if e.get("cat") == "user_annotation"), key=lambda e: float(e["ts"]))
    for e in ann:
        name = str(e.get("name", ""))
        if name in names:
            windows.setdefault(names[name], []).append(iv(e))
            thread.setdefault(names[name], (e.get("pid"), e.get("tid")))
    steps = step_ranges(trace)
    if denoising not in windows and not steps.empty:
        starts = [a for n, ivs in windows.items() for a, _ in ivs]
        first = next(e for e in ann if str(e.get("name")) == steps["name"].iloc[0])
        windows[denoising] = [
            (a, min([b, *(s for s in starts if a < s < b)]))
            for a, b in zip(steps["ts_us"], steps["ts_us"] + steps["dur_ms"] * 1000.0)
        ]
        thread[denoising] = (first.get("pid"), first.get("tid"))
    if not windows:
        return pd.DataFrame(columns=OVERHEAD_COLUMNS)
    device = [iv(e) for e in evs if e.get("cat") in DEVICE_CATS]
    launches = [iv(e) for e in evs if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    rows = []
    for stage, ivs in sorted(windows.items(), key=lambda kv: min(a for a, _ in kv[1])):
        win = _union_ms(ivs, min(a for a, _ in ivs), max(b for _, b in ivs))
        ops = sum(_union_ms(tops.get(thread[stage], []), a, b) for a, b in ivs)
        launch = sum(min(b, hi) - max(a, lo) for a, b in launches for lo, hi in ivs if b > lo and a < hi)
        busy = sum(_union_ms(device, a, b) for a, b in ivs) if device else math.nan
        kernels = sum(1 for a, b in device for lo, hi in ivs if b > lo and a < hi)
        rows.append((stage, win, ops, win - ops, launch / 1000.0 if device else math.nan, kernels, busy))
    cols = ["stage", "window_ms", "op_ms", "cpu_overhead_ms", "launch_ms", "kernels", "device_busy_ms"]
    out = pd.DataFrame(rows, columns=cols)
    total = {
        "stage": "(all stages)",
        **{
            c: out[c].sum(min_count=1)
            for c in ("window_ms", "op_ms", "cpu_overhead_ms", "launch_ms", "device_busy_ms")
        },
        "kernels": int(out["kernels"].sum()),
    }
    out = pd.concat([out, pd.DataFrame([total])], ignore_index=True)
    out["rank"] = rank if rank is not None else math.nan
    out["cpu_overhead_share"] = out["cpu_overhead_ms"] / out["window_ms"].where(out["window_ms"] > 0)
    out["device_idle_share"] = 1.0 - out["device_busy_ms"] / out["window_ms"].where(out["window_ms"] > 0)
    out["kernels"] = out["kernels"].astype(int)
    return out[OVERHEAD_COLUMNS]


def overhead_frame(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`overhead_table` for display: :data:`NO_DEVICE` for NaN device columns."""
    t = table.copy().astype({"launch_ms": object, "device_busy_ms": object, "device_idle_share": object})
    for c in ("launch_ms", "device_busy_ms", "device_idle_share"):
        t[c] = [NO_DEVICE if pd.isna(v) else v for v in table[c]]
    if table["rank"].isna().all():
        t = t.drop(columns=["rank"])
    return t


#: gzip bytes of a set of traces from which they are read in parallel
PARALLEL_MIN_BYTES = 2 * 2**20


@dataclass(frozen=True)
class TraceTables:
    """One trace's :func:`op_events` and :func:`overhead_table`, or ``error`` and both None."""

    events: pd.DataFrame | None
    overhead: pd.DataFrame | None
    error: str | None = None


def read_one(path: str | Path, stages: list[str] | None = None) -> TraceTables:
    """Read the trace at ``path`` (rank from its name); a :class:`TraceError` becomes ``error``."""
    try:
        doc = load_trace(path)
    except TraceError as exc:
        return TraceTables(None, None, str(exc))
    return TraceTables(*_tables(doc, stages, rank_of(path)))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_many(paths: list[Path], stages: list[list[str] | None] | None = None) -> list[TraceTables]:
    """:func:`read_one` of each of ``paths`` (with ``stages[i]``), in order; in a process pool from
    :data:`PARALLEL_MIN_BYTES` on two or more cores, else (or when it fails) here."""
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
    except (BrokenProcessPool, OSError) as exc:
        log.warning("reading %d traces in parallel failed (%s): reading them one by one", len(paths), exc)
        return [read_one(p, s) for p, s in zip(paths, names)]

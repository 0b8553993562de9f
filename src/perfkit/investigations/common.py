"""Helpers the investigations share (a launch measured or reused, its peaks and latencies, split
parts joined, baseline cases) and what an investigation declares beyond measuring: notebook
cells, figures, ``perfkit figures`` block kinds, measure options (docs/DESIGN.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

import numpy as np
import pandas as pd

from perfkit.bundle import ResultBundle, conform, steady_state
from perfkit.common.numfmt import fmt, json_float
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.assemble import reuse_launch
from perfkit.measuring.launch_rows import LaunchData, measure_launch
from perfkit.measuring.profiled import SnapshotParams, ask_engine, collect

NAN = math.nan


def as_request(request: VideoRequestSpec | Mapping[str, Any] | None) -> VideoRequestSpec:
    """``request`` as a :class:`VideoRequestSpec`."""
    return request if isinstance(request, VideoRequestSpec) else VideoRequestSpec.from_dict(request or {})


def mib(v: Any) -> str:
    """``412 MiB`` (``–`` when missing)."""
    return fmt(v, ".0f", " MiB")


def first_vs_warm(
    ok: pd.DataFrame, stages: pd.DataFrame
) -> tuple[float, np.ndarray, float, dict, str | None]:
    """The first completed row against the rest, ms: (its e2e, the warm e2e, their median, its
    extra time per stage (None: no warm request ran it), the stage holding most of it)."""
    pen: dict[str, float] = {}
    if not stages.empty:
        ids = ok["request_id"]
        first = stages[stages["request_id"] == ids.iloc[0]].groupby("stage", sort=False)["ms"].sum()
        warm_med = warm_stage_medians(stages, ids.iloc[1:])
        pen = {st: float(first[st] - warm_med.get(st, NAN)) for st in first.index}
    finite = {k: v for k, v in pen.items() if not math.isnan(v)}
    e2e = ok["e2e_ms"].to_numpy(float)
    stage = max(finite, key=finite.get, default=None)
    pen = {k: json_float(v) for k, v in pen.items()}
    return float(e2e[0]), e2e[1:], float(np.median(e2e[1:])), pen, stage


def warm_stage_medians(stages: pd.DataFrame, warm_ids: Iterable[str]) -> pd.Series:
    """Stage -> the median over ``warm_ids`` of each request's ms in it, in run order."""
    if stages.empty:
        return pd.Series(dtype=float)
    warm = stages[stages["request_id"].isin(list(warm_ids))]
    return warm.groupby(["request_id", "stage"], sort=False)["ms"].sum().groupby("stage", sort=False).median()


def reuse_or_launch(
    reuse: Any, specs: list, requests: list, run_dir: Any, label: str, **kw: Any
) -> LaunchData:
    """The launch ``label``: one a ``reuse`` bundle ran with one of ``specs`` under
    ``kw["caps"]``, else a new launch of ``specs[0]`` (``kw``: measure_launch's)."""
    for spec in specs:
        data = reuse_launch(reuse, spec, requests[0], len(requests), label, caps=kw.get("caps"))
        if data is not None:
            return data
    return measure_launch(specs[0], requests, Path(run_dir), label, **kw)


def request_errors(df: pd.DataFrame) -> str:
    """The sent rows' errors joined with ``; `` (empty when none)."""
    return "; ".join(df["error"].dropna().astype(str))


def snapshot_spec(
    spec: EngineSpec, snapshot: SnapshotParams | Mapping[str, Any] | None, repeats: int
) -> tuple[EngineSpec, SnapshotParams | None, str | None]:
    """(``spec`` with the allocator snapshot flags set where asked, the params, why none or None)."""
    snapshot = SnapshotParams.model_validate(snapshot) if isinstance(snapshot, Mapping) else snapshot
    if snapshot is None or repeats < 2:
        return spec, snapshot, None
    spec, why_not = ask_engine(spec, snapshot, repeats)
    return spec, snapshot, why_not


def snapshot_sites(
    data: LaunchData, snapshot: SnapshotParams, repeats: int, why_not: str | None
) -> tuple[dict[str, Any], tuple[pd.DataFrame, dict[str, Path]]]:
    """(the launch's ``memory_sites`` results entry, (its table, snapshot files))."""
    if repeats < 2:
        return {"status": "needs repeats >= 2 (a cold and a warm request)"}, (pd.DataFrame(), {})
    table, entry, files = collect(data, snapshot, repeats, why_not)
    return entry, (table, files)


def attach_sites(bundle: ResultBundle, collected: list[tuple[pd.DataFrame, dict[str, Path]]]) -> None:
    """The bundle's ``memory_sites`` table (the launches' tables in order) and snapshot files."""
    tables = [t for t, _ in collected if not t.empty]
    bundle.tables["memory_sites"] = conform(
        "memory_sites", pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    )
    for _, files in collected:
        bundle.traces.update(files)


def launch_numbers(data: LaunchData) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(the sent request rows, the completed ones, their numbers): device, host and cgroup
    peaks (MiB), ``cold_ms`` (the first completed) and ``warm_ms`` (the median of the rest)."""
    df = data.sent_rows()
    ok = df[df["status"] == "completed"] if not df.empty else df
    lr, n = data.launch_row, len(ok)
    numbers = {
        "peak_reserved_mib": json_float(ok["peak_reserved_mib"].max()) if n else None,
        "peak_allocated_mib": json_float(ok["peak_allocated_mib"].max()) if n else None,
        "load_peak_mib": json_float(lr.get("load_peak_mib")),
        "host_anon_peak_mib": peak_mib(data.memory, "host_anon_mib"),
        "host_pss_peak_mib": peak_mib(data.memory, "host_pss_mib", lr.get("host_pss_peak_mib")),
        "cgroup_peak_mib": peak_mib(data.memory, "cgroup_current_mib", lr.get("cgroup_peak_mib")),
        "cold_ms": json_float(ok["e2e_ms"].iloc[0]) if n else None,
        "warm_ms": json_float(np.median(ok["e2e_ms"].iloc[1:])) if n >= 2 else None,
    }
    return df, ok, numbers


def run_kwargs(ctx: Any, p: Any, name: str, reuse: bool = True, **changes: Any) -> dict[str, Any]:
    """An investigation function's keyword arguments: ``request``, ``run_dir``, ``reuse`` and the
    params section's own fields, ``changes`` over them."""
    own = {k: v for k, v in p if k not in ("enabled", "tier")}
    shared = {"reuse": list(ctx.shared.values()) or None} if reuse else {}
    return {"request": ctx.request, "run_dir": ctx.work_dir / name, **shared, **own, **changes}


def join_params(parts: list[ResultBundle], key: str, asked: list, entries: str) -> tuple[dict, list]:
    """(the first part's params with ``key`` = ``asked``, the parts' results ``entries``).
    Raises ValueError: the parts' ``key`` lists in order are not ``asked``."""
    got = [x for b in parts for x in (b.meta.get("params") or {}).get(key) or []]
    if got != asked:
        raise ValueError(f"{parts[0].investigation}: parts measured {key} {got}, the params ask for {asked}")
    params = {**(parts[0].meta.get("params") or {}), key: asked}
    return params, [e for b in parts for e in b.results.get(entries) or []]


def steady_cases(bundle: ResultBundle, case_id: Any, launches: Mapping[str, Any]) -> dict[str, ResultBundle]:
    """Baseline cases, one per launch (case id suffix -> launch label): its steady state."""
    if bundle.requests.empty:
        return {}
    cases = {case_id(suffix=k): steady_state(bundle, launch=la) for k, la in launches.items()}
    return {k: b for k, b in cases.items() if not b.measured_requests().empty}


#: the header of a host-anon peak column (a page shared by forked processes counts once each)
ANON_SUM_LABEL = "host anon peak, summed per process (MiB)"


def host_peak_text(c: Mapping[str, Any]) -> str:
    """``host PSS peak 412 MiB``, else the summed anon peak, saying so."""
    pss, anon = json_float(c.get("host_pss_peak_mib")), json_float(c.get("host_anon_peak_mib"))
    if pss is not None:
        return f"host PSS peak {mib(pss)}"
    if anon is not None:
        return f"host anon peak {mib(anon)} (summed per process; PSS not read)"
    return "host peak –"


def peak_mib(memory: pd.DataFrame, col: str, launch_peak: Any = None) -> float | None:
    """The larger of a memory column's sampled maximum and the launch row's peak (MiB), or None."""
    vals = [json_float(launch_peak)]
    if memory is not None and not memory.empty and col in memory:
        vals.append(json_float(pd.to_numeric(memory[col], errors="coerce").max()))
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def pick_columns(
    df: pd.DataFrame, columns: Iterable[str], sparse: Iterable[str] = ("error",)
) -> pd.DataFrame:
    """The listed ``columns`` that ``df`` has; a ``sparse`` one only when some row has a value."""
    if df.empty:
        return df
    keep = [c for c in columns if c in df.columns]
    keep = [c for c in keep if c not in set(sparse) or not df[c].isna().all()]
    return df[keep].rename(columns={"host_anon_peak_mib": ANON_SUM_LABEL})


@dataclass(frozen=True)
class Cell:
    """One notebook cell: ``kind`` ``"markdown"`` or ``"code"``, ``source`` its text. Code runs
    after the generic cells, where ``bundle``, ``results``, ``rows`` (the gate's Check rows),
    ``out`` and the helpers of the generic setup cell are defined."""

    kind: Literal["markdown", "code"]
    source: str


def md(source: str) -> Cell:
    """A Markdown cell."""
    return Cell("markdown", source)


def code(source: str) -> Cell:
    """A code cell."""
    return Cell("code", source)


@dataclass(frozen=True)
class Figure:
    """A figure kind an investigation owns: ``draw(bundle)`` returns a matplotlib Figure and
    raises ValueError when the bundle holds nothing to draw."""

    kind: str
    title: str
    draw: Callable[[Any], Any]


@dataclass(frozen=True)
class MeasureOption:
    """A ``python -m perfkit.measure`` option an investigation declares. ``jobs(value, params
    section, spec) -> [(name suffix, section, spec)]``: the jobs run when it is given (absent:
    ``[("", section, spec)]``); a job runs when its section is enabled."""

    flag: str
    help: str
    jobs: Callable[[Any, Any, Any], list[tuple[str, Any, Any]]]
    is_flag: bool = False
    minimum: int = 0

    @property
    def dest(self) -> str:
        """The option's Python name: ``--overhead-pairs`` -> ``overhead_pairs``."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class DocBlock:
    """A ``perfkit figures`` block kind: ``combine(results list, names) -> results`` makes one
    results dict of the ``src`` bundles' (raising InvestigationError), rendered as ``full``."""

    combine: Callable[[list[Mapping[str, Any]], list[str]], Mapping[str, Any]]
    #: what the footer says was done (``"launches pooled"``)
    verb: str = "combined"


def headline(
    name: str, title: str = "Headline numbers", keep: str = "", transpose: bool = True
) -> tuple[Cell, ...]:
    """The heading ``title``, then the summary table (kept in variable ``keep``) and reading."""
    table = f'summary_frame("{name}", results)'
    shown = f"{keep} = {table}\nshow_table({keep}" if keep else f"show_table({table}"
    shown += ")" if transpose else ", transpose=False)"
    return md(f"## {title}"), code(f'{shown}\ndisplay(Markdown(reading("{name}", results)))')


GATE_CELL = """show_table(check_frame(rows))
display(Markdown(verdict_markdown(rows)))"""

ROOT_CAUSE = """show_table(first_request_costs(bundle.requests, bundle.stages), transpose=False)"""

REQUESTS = """show_table(request_frame(bundle.requests), transpose=False)"""

#: what grew between the allocator snapshots, by allocation site (perfkit.measuring.profiled)
MEMORY_SITES = """from perfkit.measuring.profiled import sites_markdown

display(Markdown(sites_markdown(results) or "No allocator snapshots: set `snapshot` (e.g. `{}`) to take them."))
sites = bundle.tables.get("memory_sites")
if sites is not None and not sites.empty:
    for kind, caption in (("grew", "What grew between the snapshots, by allocation site"),
                          ("peak", "Alive at warm request k's peak, by allocation site")):
        show_table(sites[sites["kind"] == kind].drop(columns=["kind"]), caption=caption, transpose=False)"""

MEMORY_SITES_MD = (
    "## Allocation sites: what grew, allocated where\n\n"
    "With `snapshot` set, the engine records CUDA allocation history and dumps allocator "
    "snapshots after the cold request and after warm request k (torch's "
    "`_record_memory_history` / `_dump_snapshot`; open them at pytorch.org/memory_viz). The "
    "live blocks that grew between the two are grouped by allocation site (the innermost "
    "engine frame first), and the blocks alive at warm request k's peak the same way. On a CPU "
    "engine this says *not available on cpu*."
)

#: the profiled requests of a bundle, op by op (perfkit.report.belowstage)
BELOW_STAGE = """from perfkit.common.slugs import md_text
from perfkit.report import belowstage

below = belowstage.below_stage(bundle)
if below is None:
    display(Markdown("No request was profiled (set `profile`, e.g. `{'requests': ['cold', 'warm'], 'steps': 5}`)."))
else:
    show_table(belowstage.trace_list(below), caption="Profiled requests and their trace files")
    for err in below.errors:
        display(Markdown("**Trace not read:** " + md_text(err, code=True)))
    if below.diff is not None:
        show_table(belowstage.diff_frame(below.diff, first=belowstage.first_word(below)),
                   caption=f"Ops whose time changed most, {belowstage.diff_title(below)}")
    for role, top in below.stage_top.items():
        show_table(top, caption=f"Top ops per stage, {role}")
    for role, over in belowstage.overhead_tables(below):
        show_table(over, caption=f"CPU-side overhead and device idle share per stage, {role}")
    for role, events in list(below.events.items())[:2]:  # the first one, the first warm one
        show(plots.step_timeline(events, title=f"One denoising step over time, {role}"))"""

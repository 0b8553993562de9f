"""What an investigation declares beyond measuring (fields of
:class:`perfkit.investigations.registry.Investigation`; docs/DESIGN.md, "Where things go"): its
notebook cells and the cell texts several share, its figures, its ``perfkit figures`` block kinds
and its ``python -m perfkit.measure`` options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping


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
    """A figure kind an investigation owns.

    Attributes:
        kind: its name, unique across investigations (``"load-latency"``).
        title: the heading its notebook shows above it.
        draw: ``(bundle) -> matplotlib.figure.Figure``; raises ValueError when the bundle
            holds nothing to draw.
    """

    kind: str
    title: str
    draw: Callable[[Any], Any]


@dataclass(frozen=True)
class MeasureOption:
    """A ``python -m perfkit.measure`` option an investigation declares.

    Attributes:
        flag: the option (``"--overhead-pairs"``); its value reaches :attr:`jobs` by the
            flag's Python name (``overhead_pairs``).
        help: its help text.
        jobs: ``(value, params section, engine spec) -> [(name suffix, section, spec)]``: the
            jobs the investigation runs when the option is given (the default, option absent,
            is ``[("", section, spec)]``); a job runs when its section is enabled.
        is_flag: a switch (True/False) rather than a count.
        minimum: the smallest count accepted (counts only).
    """

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
    """A ``perfkit figures`` block kind an investigation adds (``kind=<name>``): ``src`` a
    comma-separated list of bundles directories, each holding this investigation's
    ``results.json``; ``combine(results list, names) -> results`` makes one results dict of
    them (raising :class:`~perfkit.investigations.registry.InvestigationError` when they do not combine),
    rendered as the investigation's ``full`` figures."""

    combine: Callable[[list[Mapping[str, Any]], list[str]], Mapping[str, Any]]
    #: what the footer says was done (``"launches pooled"``)
    verb: str = "combined"


def headline(
    name: str, title: str = "Headline numbers", keep: str = "", transpose: bool = True
) -> tuple[Cell, ...]:
    """Investigation ``name``'s first cells: the heading ``title``, then its summary table (kept
    in variable ``keep`` for later cells when given) and its reading."""
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

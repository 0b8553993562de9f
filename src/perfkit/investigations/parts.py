"""What an investigation declares beyond measuring: its notebook cells, its figures, its
``perfkit figures`` block kinds and its ``python -m perfkit.measure`` options. Plain frozen
dataclasses, fields of :class:`perfkit.investigations.registry.Investigation`; the generator
(``notebooks/make_notebooks.py``), the report's generic section template
(``sections/investigation.html.j2``), :mod:`perfkit.report.figures` and :mod:`perfkit.measure` read
them, so adding an investigation is one module (docs/DESIGN.md, "Where things go")."""

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

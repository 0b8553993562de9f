"""The investigation registry: each investigation module registers one :class:`Investigation`
(docs/DESIGN.md, "Where things go"); :func:`load_or_run`, what every investigation notebook
calls, runs one or replays its recorded bundle."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from perfkit.bundle import ResultBundle
from perfkit.checks import Check
from perfkit.common.numfmt import fmt
from perfkit.common.slugs import did_you_mean
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.investigations import common
from perfkit.investigations.common import Cell, DocBlock, Figure, MeasureOption, code, md

log = logging.getLogger(__name__)


class InvestigationError(RuntimeError):
    """The measurement itself failed (engine crash, no completed request): the suite exits 2."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class InvestigationParams(_Model):
    """Base of every investigation's params section; ``perfkit suite --tier`` picks by ``tier``."""

    enabled: bool = True
    tier: Literal["per-commit", "extra"] = "per-commit"


class InvariantParams(_Model):
    """Base of every investigation's invariants (the params file's ``invariants``; None: not
    gated). A numeric limit is a finite number >= 0, else refused naming its key."""

    @field_validator("*")
    @classmethod
    def _a_limit_is_finite_and_not_negative(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (0 <= v < float("inf")):
            raise ValueError("a limit must be a finite number >= 0")
        return v


class EngineInvariants(InvariantParams):
    """What every launch's engine must really run, gated from the ``launches`` table
    (docs/suite.md, "What the gate checks")."""

    #: True when the engine may drop torch.compile (e.g. a placement offloading the transformer)
    compile_inactive_ok: bool = False


class CapParams(_Model):
    """One memory budget (GiB). ``None`` means no cap on that side."""

    label: Optional[str] = None
    device_gib: Optional[float] = Field(None, gt=0)
    host_gib: Optional[float] = Field(None, gt=0)

    def to_caps(self) -> MemoryCaps:
        """The :class:`~perfkit.engine.caps.MemoryCaps` of this budget."""
        return MemoryCaps(device_gib=self.device_gib, host_gib=self.host_gib, label=self.label)


@dataclass
class RunContext:
    """What an investigation's ``run`` gets besides its params: ``work_dir`` holds the launch
    directories; ``shared`` the bundles measured earlier in the run, whose launches it may reuse
    (seed 001)."""

    engine: EngineSpec
    request: VideoRequestSpec
    work_dir: Path
    shared: dict[str, ResultBundle] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyNumber:
    """One figure quoted by the summary, the report and the READMEs: ``value`` None (shown as
    "–"), a number in ``unit`` (``"ms"``, ``"MiB"``, ``""``) formatted by ``fmt`` (thousands
    separated), or a short text."""

    label: str
    value: float | str | None
    unit: str = ""
    fmt: str = ".0f"

    @property
    def text(self) -> str:
        """``"954 ms"``, ``"58,428 ms"`` (thousands separated); "–" when not measured."""
        if isinstance(self.value, str):
            return self.value
        spec = self.fmt if "," in self.fmt or not self.fmt.startswith(".") else "," + self.fmt
        return fmt(self.value, spec, f" {self.unit}" if self.unit else "")


CaseNamer = Callable[..., str]

#: the generic section template: the investigation's ``section_intro``, then the shared section
GENERIC_TEMPLATE = "sections/investigation.html.j2"


def bundle_error(bundle: ResultBundle, why: str) -> InvestigationError:
    """``InvestigationError("<investigation> (<bundle dir>): <why>")``."""
    return InvestigationError(f"{bundle.investigation} ({bundle.path or 'bundle'}): {why}")


def _needs_a_completed_request(bundle: ResultBundle) -> None:
    """The default ``check_bundle``: raises when no measured request completed."""
    req = bundle.requests
    ok = not req.empty and bool(((req["index"] >= 0) & (req["status"] == "completed")).fillna(False).any())
    if not ok:
        raise bundle_error(bundle, "no measured request completed")


def no_checks(results: Mapping[str, Any], invariants: Mapping[str, Any]) -> list[Check]:
    """The default ``checks``: none."""
    return []


def no_reading(results: Mapping[str, Any]) -> str:
    """The default ``reading``: nothing."""
    return ""


@dataclass(frozen=True)
class Investigation:
    """One investigation; docs/DESIGN.md, "Where things go", and docs/scale-out.md (``plan``,
    ``split``/``join``, ``case_ids``, ``launches``) say what each field is for."""

    name: str
    title: str
    question: str
    params_model: type[InvestigationParams]
    run: Callable[[RunContext, Any], ResultBundle]
    invariants_model: type[InvariantParams] = InvariantParams
    check_bundle: Callable[[ResultBundle], None] = _needs_a_completed_request
    checks: Callable[[Mapping[str, Any], Mapping[str, Any]], list[Check]] = no_checks
    key_numbers: Callable[[Mapping[str, Any]], list[KeyNumber]] = lambda r: []
    summary_table: Callable[[Mapping[str, Any]], pd.DataFrame] = lambda r: pd.DataFrame()
    reading: Callable[[Mapping[str, Any]], str] = no_reading
    cases: Callable[[ResultBundle, CaseNamer], dict[str, ResultBundle]] = lambda bundle, namer: {}
    order: int = 100
    plan: Callable[[Any], list[int]] = lambda p: []
    split: Optional[Callable[[Any], list[tuple[str, Any]]]] = None
    join: Optional[Callable[[list[ResultBundle], Any], ResultBundle]] = None
    case_ids: Optional[Callable[[Any, CaseNamer], list[str]]] = None
    launches: Optional[Callable[[Any, EngineSpec, VideoRequestSpec], list[Any]]] = None
    found_in: Optional[Callable[[Mapping[str, Any]], bool]] = None
    template: str = GENERIC_TEMPLATE
    notebook: str = ""
    notebook_intro: str = ""
    cells: Optional[tuple[Cell, ...]] = None
    figures: tuple[Figure, ...] = ()
    section_intro: str = ""
    doc_blocks: Mapping[str, DocBlock] = field(default_factory=dict, hash=False)
    measure_options: tuple[MeasureOption, ...] = ()
    session: bool = False

    def __post_init__(self) -> None:
        if (self.split is None) != (self.join is None):
            raise ValueError(f"investigation {self.name!r}: split and join come together")
        if not self.notebook:
            object.__setattr__(self, "notebook", f"{self.name}.ipynb")

    def notebook_cells(self) -> list[Cell]:
        """Its cells (default: headline, reading, gate rows), then a heading and cell per figure."""
        out = [*common.headline(self.name), md("## Gate"), code(common.GATE_CELL)]
        out = list(self.cells) if self.cells is not None else out
        for f in self.figures:
            out += [md(f"## {f.title}"), code(f'show(figure("{f.kind}", bundle))')]
        return out

    def invariant_defaults(self) -> dict[str, Any]:
        """Invariant key -> default limit (None: not gated unless the params file sets it)."""
        return self.invariants_model().model_dump()


_REGISTRY: dict[str, Investigation] = {}

#: what one investigation declares and no other may: (what, the declared set of an investigation)
_DECLARED_ONCE: tuple[tuple[str, Callable[[Investigation], set]], ...] = (
    ("invariant key", lambda s: set(s.invariants_model.model_fields)),
    ("figure kind", lambda s: {f.kind for f in s.figures}),
    ("figures block kind", lambda s: set(s.doc_blocks)),
    ("measure option", lambda s: {o.flag for o in s.measure_options}),
    ("session", lambda s: {True} & {s.session}),
)


def register(investigation: Investigation) -> Investigation:
    """Add ``investigation`` in run order. Raises ValueError: a duplicate name, an invariant key
    of the engine's, or what another one already declares (:data:`_DECLARED_ONCE`)."""
    if investigation.name in _REGISTRY:
        raise ValueError(f"investigation {investigation.name!r} is registered twice")
    taken = set(investigation.invariants_model.model_fields) & set(EngineInvariants.model_fields)
    if taken:
        raise ValueError(
            f"invariant keys {sorted(taken)} of {investigation.name!r} are the engine's (EngineInvariants)"
        )
    for other in _REGISTRY.values():
        for what, declared in _DECLARED_ONCE:
            clash = declared(investigation) & declared(other)
            if clash:
                mine, theirs = f"{sorted(map(str, clash))} of {investigation.name!r}", repr(other.name)
                raise ValueError(
                    f"invariant keys {mine} are already declared by {theirs}"
                    if what == "invariant key"
                    else f"{what} {mine} is {theirs}'s"
                )
    _REGISTRY[investigation.name] = investigation
    ordered = sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))
    _REGISTRY.clear()
    _REGISTRY.update((s.name, s) for s in ordered)
    return investigation


def register_module(namespace: Mapping[str, Any], **fields: Any) -> Investigation:
    """Register the investigation a module's ``namespace`` declares: ``NAME``, ``NOTEBOOK``,
    ``SECTION_INTRO`` and its own functions named as a callable field; ``fields`` override.
    Raises as :func:`register`."""
    module = namespace["__name__"]
    hooks = [f.name for f in dataclasses.fields(Investigation) if "Callable" in str(f.type)]
    found = {k: fn for k in hooks if callable(fn := namespace.get(k)) and fn.__module__ == module}
    for const, key in (("NAME", "name"), ("NOTEBOOK", "cells"), ("SECTION_INTRO", "section_intro")):
        if const in namespace:
            found[key] = namespace[const]
    return register(Investigation(**{**found, **fields}))


def unregister(name: str) -> None:
    """Remove investigation ``name``. Raises KeyError naming the known ones."""
    get(name)
    del _REGISTRY[name]


def figure(kind: str, bundle: ResultBundle) -> Any:
    """The matplotlib Figure of ``kind`` drawn from ``bundle``. Raises KeyError: no
    investigation declares ``kind`` (naming the known ones)."""
    kinds = {f.kind: f for s in _REGISTRY.values() for f in s.figures}
    if kind not in kinds:
        raise KeyError(f"unknown figure kind {kind!r}; known: {', '.join(kinds) or 'none'}")
    return kinds[kind].draw(bundle)


def doc_blocks() -> dict[str, tuple[Investigation, DocBlock]]:
    """Every ``perfkit figures`` block kind an investigation adds -> (that investigation, its declaration)."""
    return {k: (s, b) for s in _REGISTRY.values() for k, b in s.doc_blocks.items()}


def measure_options() -> list[tuple[Investigation, MeasureOption]]:
    """Every ``python -m perfkit.measure`` option the investigations declare, in run order."""
    return [(s, o) for s in _REGISTRY.values() for o in s.measure_options]


def session_name() -> str | None:
    """The investigation whose bundle ``perfkit figures kind=compare`` compares, or None."""
    return next((s.name for s in _REGISTRY.values() if s.session), None)


def get(name: str) -> Investigation:
    """The registered investigation ``name``. Raises KeyError naming the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown investigation {name!r}; known: {', '.join(_REGISTRY)}") from None


def all_investigations() -> list[Investigation]:
    """Every registered investigation, in run order."""
    return list(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """Registered investigation names, in run order."""
    return tuple(_REGISTRY)


def invariant_defaults() -> dict[str, Any]:
    """Every investigation's invariant defaults and the engine's, merged."""
    out: dict[str, Any] = EngineInvariants().model_dump()
    for s in _REGISTRY.values():
        out.update(s.invariant_defaults())
    return out


def merged_invariants(given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every invariant key -> limit (None: not gated): the defaults overlaid with ``given``.
    Raises ValueError: a key no investigation declares (with the closest known one), or a value
    its invariants model refuses (naming the key)."""
    out = invariant_defaults()
    if not given:
        return out
    unknown = [k for k in given if k not in out]
    if unknown:
        hints = [f"{k!r}{did_you_mean(k, out)}" for k in unknown]
        raise ValueError(f"invariants: unknown key {', '.join(hints)}; known: {', '.join(out)}")
    for model in (EngineInvariants, *(s.invariants_model for s in _REGISTRY.values())):
        mine = {k: v for k, v in given.items() if k in model.model_fields}
        try:
            model.model_validate(mine)
        except ValidationError as exc:
            e = exc.errors()[0]
            key = ".".join(map(str, e.get("loc") or ())) or "?"
            raise ValueError(f"invariants: {key}: {e.get('msg')}, got {e.get('input')!r}") from None
        out.update(mine)
    return out


def checks_for(
    results: Mapping[str, Mapping[str, Any]], invariants: Mapping[str, Any], only: str | None = None
) -> list[Check]:
    """Check rows of every investigation (or of ``only``) against the ``invariants`` given that it
    declares (pass :func:`merged_invariants`); a key left out or None is not gated."""
    rows: list[Check] = []
    for s in _REGISTRY.values():
        if only is not None and s.name != only:
            continue
        declared = s.invariants_model.model_fields
        mine = {k: v for k, v in invariants.items() if k in declared and v is not None}
        if not mine:
            continue
        rows += s.checks(results.get(s.name) or {}, mine)
    return rows


def _shared_bundles(out: Path, name: str) -> dict[str, ResultBundle]:
    """Bundles of investigations before ``name`` already written beside ``out`` in this run."""
    found: dict[str, ResultBundle] = {}
    for other in names():
        if other == name:
            break
        d = out.parent / other
        if (d / "meta.json").exists():
            try:
                found[other] = ResultBundle.load(d)
            except (OSError, ValueError) as exc:
                log.warning("%s bundle not reusable: %s", other, exc)
    return found


def load_or_run(
    investigation: str,
    *,
    out: str | Path,
    bundle_dir: str | Path | None = None,
    engine: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
    share_launches: bool = True,
    **section: Any,
) -> ResultBundle:
    """Replay ``bundle_dir`` or run ``investigation`` with the params ``section``; the bundle
    lands in ``out`` (``RUN/<investigation>``). Raises KeyError: unknown investigation;
    ValueError: invalid params, or another investigation's bundle; InvestigationError: no usable
    measurement."""
    s = get(investigation)
    out = Path(out)
    if bundle_dir:
        b = ResultBundle.load(bundle_dir)
        if b.investigation != investigation:
            raise ValueError(
                f"bundle_dir {bundle_dir} holds a {b.investigation!r} bundle, expected {investigation!r}"
            )
        if Path(bundle_dir).resolve() != out.resolve():
            b.save(out)
        log.info("replaying %s bundle from %s", investigation, bundle_dir)
        s.check_bundle(b)
        return b
    params = s.params_model.model_validate({k: v for k, v in section.items() if k != "enabled"})
    out.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(
        engine=EngineSpec.from_dict(dict(engine or {})),
        request=VideoRequestSpec.from_dict(dict(request or {})),
        work_dir=out / "launches",
        shared=_shared_bundles(out, investigation) if share_launches else {},
    )
    b = s.run(ctx, params)
    b.save(out)
    s.check_bundle(b)  # after saving, so that the bundle is there to look at
    return b

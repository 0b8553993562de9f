"""Units of work (each runs on its own: a CI shard, a Ray task), their estimates (after sglang's
``multimodal_gen/test/run_suite.py``), :func:`partition` and :class:`UnitOutcome`, what every
executor reports. See docs/scale-out.md ("Units of work").
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Mapping

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError

from perfkit.common import jsonsafe
from perfkit.engine.client import VideoRequestSpec
from perfkit.gate.run import case_namer
from perfkit.investigations import registry
from perfkit.params import SuiteParams

log = logging.getLogger(__name__)


#: sglang's fallback when a case has no estimate at all (s)
DEFAULT_ESTIMATE_S = 300.0
#: sglang's allowance over the expected end-to-end time of a case without an estimate (s)
E2E_OVERHEAD_S = 120.0

_SAFE = re.compile(r"^[A-Za-z0-9_.+-]+$")
#: a count in a manifest: an integer >= 0 (not a bool, not "1")
_Count = Annotated[int, Field(strict=True, ge=0)]


class PartitionError(ValueError):
    """A ``--partition`` value that is not ``I/N`` with 1 <= I <= N (exit 2)."""


@dataclass(frozen=True)
class Part:
    """One investigation, or one launch of an investigation that splits (``key``: the split
    part's key, None for the whole); ``launches`` and ``requests`` count only its own launches,
    not one it ``reuses`` (part ids)."""

    investigation: Annotated[
        str, Field(min_length=1, validation_alias=AliasChoices("investigation", "scenario"))
    ]
    key: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    launches: _Count = 1
    requests: _Count = 0
    case_ids: tuple[str, ...] = ()
    reuses: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``<investigation>`` or ``<investigation>.<key>``."""
        return self.investigation if self.key is None else f"{self.investigation}.{self.key}"


@dataclass
class WorkUnit:
    """Parts that run one after another in one process (``id``: its first part's). ``tier``:
    ``per-commit`` when any part is; ``estimate_source``: ``baseline``, ``e2e``, ``recorded`` or
    ``default``, joined with ``+`` when its parts differ; ``shard``: 1-based, set by :func:`partition`.
    """

    id: Annotated[str, Field(min_length=1)]
    parts: list[Part]
    launches: _Count = 0
    requests: _Count = 0
    gpus: _Count = 0
    tier: Literal["per-commit", "extra"] = "per-commit"
    estimate_s: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] = DEFAULT_ESTIMATE_S
    estimate_source: str = "default"
    shard: Annotated[int, Field(strict=True, ge=1)] | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)

    @property
    def investigations(self) -> list[str]:
        """Investigation names of its parts, each once."""
        return list(dict.fromkeys(p.investigation for p in self.parts))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (what executors receive; :meth:`from_dict` reads it)."""
        d = asdict(self)
        d["investigations"] = self.investigations
        for p in d["parts"]:
            p["case_ids"] = list(p["case_ids"])
            p["reuses"] = list(p["reuses"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WorkUnit":
        """Inverse of :meth:`to_dict`, every field checked. Raises KeyError for a missing required
        key, ValueError naming a field of the wrong type or range (``parts[1].launches``)."""
        try:
            return _UNIT.validate_python(d)
        except ValidationError as exc:
            e = exc.errors()[0]
            if e["type"] == "missing":
                raise KeyError(e["loc"][-1]) from None
            where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]).lstrip(".")
            raise ValueError(f"{where or 'unit'}: {e['msg']}, got {e.get('input')!r}") from None


_UNIT = TypeAdapter(WorkUnit)


def _gpus(eng: Any) -> int:
    """``num_gpus``, 1 on a CUDA device, 0 on CPU."""
    if str(getattr(eng, "device", "") or "").startswith("cpu"):
        return 0
    n = getattr(eng, "num_gpus", None)
    return n if isinstance(n, int) and n > 0 else 1


def _estimate(
    part_cases: Iterable[str], baseline: Mapping[str, Any] | None
) -> tuple[float | None, str | None]:
    """(seconds, source) of a part's cases from a baseline; (None, None) when a case has none."""
    cases = list(part_cases)
    entries = (baseline or {}).get("scenarios") or {}
    if not cases or not entries:
        return None, None
    total, sources = 0.0, set()
    for c in cases:
        e = entries.get(c)
        if not isinstance(e, Mapping):
            return None, None
        est = e.get("estimated_full_test_time_s")
        e2e = e.get("expected_e2e_ms")
        if isinstance(est, (int, float)) and est > 0:
            total += float(est)
            sources.add("baseline")
        elif isinstance(e2e, (int, float)) and e2e > 0:
            total += float(e2e) / 1000.0 + E2E_OVERHEAD_S
            sources.add("e2e")
        else:
            return None, None
    return total, "+".join(sorted(sources))


def plan_units(
    params: SuiteParams,
    names: Iterable[str],
    baseline: Mapping[str, Any] | None = None,
    recorded: Mapping[str, float] | None = None,
) -> list[WorkUnit]:
    """The units of the investigations ``names``, in run order of their first part; ``recorded``:
    unit id -> wall seconds of an earlier run. Raises KeyError for an unknown investigation,
    ValueError for a split key that makes a unit id that is not filesystem-safe."""
    wanted = set(names)
    unknown = wanted - set(registry.names())
    if unknown:
        raise KeyError(f"unknown investigation(s) {sorted(unknown)}; known: {', '.join(registry.names())}")
    engine, request_d = params.engine_spec(), params.request.model_dump()
    engine_d, request = engine.to_dict(), VideoRequestSpec.from_dict(request_d)
    namer = case_namer(engine_d, request_d)
    gpus = _gpus(engine)
    units: list[WorkUnit] = []
    reusable: dict[str, tuple[WorkUnit, int, str]] = {}
    for s in registry.all_investigations():
        if s.name not in wanted:
            continue
        sec = params.section(s.name)
        split = s.split(sec) if s.split is not None else [(None, sec)]
        whole = len(split) == 1
        for key, sub in split:
            planned = s.launches(sub, engine, request) if s.launches is not None else []
            dump = sub.model_dump()
            host = None
            reused: list[str] = []
            fresh = []
            for pl in planned:
                hit = None
                if pl.reuses:
                    for k in pl.keys:
                        h = reusable.get(k)
                        if h is not None and h[1] >= pl.requests and (host is None or h[0] is host):
                            hit = h
                            break
                if hit is None:
                    fresh.append(pl)
                else:
                    host = hit[0]
                    reused.append(hit[2])
            part = Part(
                investigation=s.name,
                key=key if not whole else None,
                params=dump,
                launches=len(fresh) if planned else 1,
                requests=sum(p.requests for p in fresh) if planned else sum(s.plan(sub)),
                case_ids=tuple(s.case_ids(sub, namer)) if s.case_ids is not None else (),
                reuses=tuple(dict.fromkeys(reused)),
            )
            if not _SAFE.match(part.id):
                raise ValueError(f"unit id {part.id!r} is not filesystem-safe (split key of {s.name})")
            if host is None:
                host = WorkUnit(part.id, [], gpus=gpus, tier=sec.tier, engine=engine_d, request=request_d)
                units.append(host)
            elif sec.tier == "per-commit":
                host.tier = "per-commit"
            host.parts.append(part)
            if whole and len(planned) == 1:  # a single-launch bundle: later parts may reuse it
                for k in planned[0].keys:
                    reusable.setdefault(k, (host, planned[0].requests, part.id))
    for u in units:
        u.launches = sum(p.launches for p in u.parts)
        u.requests = sum(p.requests for p in u.parts)
        ests = [_estimate(p.case_ids, baseline) if p.launches else (0.0, "shared launch") for p in u.parts]
        if all(e is not None for e, _ in ests):
            total = sum(e for e, _ in ests)
            sources = [src for _, src in ests]
        elif recorded and recorded.get(u.id):
            total, sources = float(recorded[u.id]), ["recorded"]
        else:
            total = sum(e if e is not None else DEFAULT_ESTIMATE_S for e, _ in ests)
            sources = [src or "default" for _, src in ests]
        u.estimate_s = round(total, 1)
        u.estimate_source = "+".join(dict.fromkeys(sources))
    return units


#: the most shards a suite is split into (one runner per shard; the suite has far fewer units)
MAX_SHARDS = 1024


def parse_partition(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N <= :data:`MAX_SHARDS`; PartitionError naming anything
    else."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise PartitionError(f"--partition {text!r}: expected I/N, e.g. 1/2 (shard I of N, 1-based)")
    i, n = int(m.group(1)), int(m.group(2))
    if not 1 <= n <= MAX_SHARDS:
        raise PartitionError(f"--partition {text!r}: N must be between 1 and {MAX_SHARDS}")
    if not 1 <= i <= n:
        raise PartitionError(f"--partition {text!r}: I must be between 1 and {n} (shards are 1-based)")
    return i, n


def partition(units: Iterable[WorkUnit], n: int) -> list[list[WorkUnit]]:
    """Set ``unit.shard`` (1..n): longest estimate first (ties: id order) onto the least-loaded
    shard (ties: the lower). Returns n lists, each in run order; PartitionError when n < 1."""
    if n < 1:
        raise PartitionError(f"partition into {n} shards: need at least 1")
    units = list(units)
    load = [0.0] * n
    for u in sorted(units, key=lambda u: (-u.estimate_s, u.id)):
        k = min(range(n), key=lambda j: (load[j], j))
        u.shard = k + 1
        load[k] += u.estimate_s
    return [[u for u in units if u.shard == k + 1] for k in range(n)]


#: a unit's record beside its bundles (every executor writes it: :func:`settle`)
UNIT_FILE = "unit.json"

#: measure one unit (a dict with at least ``id``, ``gpus``), bundles under the dir; raise on failure
RunUnit = Callable[[Mapping[str, Any], Path], None]

#: ``(event, unit id, outcome or None)``: "started", "launch" (optional), "retry", "finished"
OnEvent = Callable[[str, str, "UnitOutcome | None"], None]


class ExecutorError(ValueError):
    """An executor that cannot be used (unknown name, its module or package missing): exit 2."""


@dataclass
class UnitOutcome:
    """One unit's result as the driver sees it (a manifest's checked by :data:`OUTCOME`, numbers
    strict and finite). Times are of the last attempt: ``wall_s`` on the worker, ``started_at``
    and ``ended_at`` epoch seconds; ``gpu_uuids`` by NVML UUID; ``out_dir`` None when nothing came
    back."""

    unit_id: Annotated[str, Field(min_length=1)]
    status: Literal["ok", "error"]
    out_dir: Path | None = None
    wall_s: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)] | None = None
    attempts: Annotated[int, Field(strict=True, ge=1)] = 1
    error: str | None = None
    log_tail: str | None = None
    host: str | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    started_at: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None
    ended_at: Annotated[float, Field(strict=True, allow_inf_nan=False)] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``out_dir`` as a string)."""
        d = asdict(self)
        d["out_dir"] = str(self.out_dir) if self.out_dir is not None else None
        return d


OUTCOME = TypeAdapter(UnitOutcome)


def newest_log_tail(d: Path, chars: int = 4000) -> str:
    """The end of the newest ``*.log`` under ``d`` (an engine's stdout/stderr) under a header, or ""."""
    try:
        logs = sorted((p for p in d.rglob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
        if not logs:
            return ""
        return f"\n--- {logs[-1].relative_to(d)} (end) ---\n" + logs[-1].read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def check_retries(retries: int, on_event: OnEvent | None) -> OnEvent:
    """``on_event`` or a no-op, for an executor given ``retries``; ValueError when ``retries`` < 0."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    return on_event or (lambda *_: None)


def settle(unit: Mapping[str, Any], oc: UnitOutcome, retries: int, out_dir: Path, emit: OnEvent) -> bool:
    """After an attempt: ``retry`` emitted while ``retries`` are left (False); else
    ``out_dir/unit.json`` written and ``finished`` emitted (True)."""
    if oc.status != "ok" and oc.attempts <= retries:
        log.warning(
            "unit %s failed (attempt %d of %d): %s: retrying", oc.unit_id, oc.attempts, retries + 1, oc.error
        )
        emit("retry", oc.unit_id, oc)
        return False
    if oc.status != "ok":
        log.error("unit %s failed after %d attempt(s): %s", oc.unit_id, oc.attempts, oc.error)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"unit": dict(unit), "outcome": oc.to_dict()}
    (out_dir / UNIT_FILE).write_text(jsonsafe.dumps(doc, indent=2, default=str) + "\n")
    emit("finished", oc.unit_id, oc)
    return True

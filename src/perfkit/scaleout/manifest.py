"""Shard manifests and merge documents: the layout's names (:data:`MANIFEST`, :data:`UNITS_DIR`,
:data:`MERGED_DIR`, :data:`MERGE_FILE`), the params digest (:func:`params_hash`), a manifest read
and checked, the units that ran side by side (:func:`concurrent_pairs`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.params import SuiteParams
from perfkit.scaleout.units import MAX_SHARDS, WorkUnit

MANIFEST = "shard.json"
UNITS_DIR = "units"
MERGED_DIR = "merged"
MERGE_FILE = "merge.json"
TIERS = ("per-commit", "extra")
#: the note on a part measured by a perfkit that did not record its plan (merged, not checked)
PLAN_NOT_RECORDED = "plan not recorded: not checked"


def params_hash(params: SuiteParams) -> str:
    """sha256 of the validated params (canonical JSON): equal for the same settings whatever
    the file's comments, key order or path, and whether a number was written 0 or 0.0 (a
    value typed loosely, such as an invariant, keeps YAML's int but a manifest's float)."""
    doc = json.dumps(_same_numbers(params.model_dump()), sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def _same_numbers(v: Any) -> Any:
    """``v`` with every whole float as an int (0.0 -> 0), in nested dicts and lists."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, Mapping):
        return {k: _same_numbers(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_same_numbers(x) for x in v]
    return v


def concurrent_pairs(outcomes: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """Pairs of unit ids whose last attempts overlapped in time (``started_at``/``ended_at``,
    epoch seconds), sorted: [[a, b], ...] with a < b."""
    spans = [
        (str(o["unit_id"]), float(o["started_at"]), float(o["ended_at"]))
        for o in outcomes
        if o.get("started_at") is not None and o.get("ended_at") is not None
    ]
    pairs = []
    for i, (a, s1, e1) in enumerate(spans):
        for b, s2, e2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1:
                pairs.append(sorted([a, b]))
    return sorted(pairs)


class _OutcomeDoc(BaseModel):
    """The shape of one ``outcomes`` entry of a manifest (:class:`UnitOutcome`'s fields):
    numbers strict (a string ``"164.26"`` or ``true`` is a mistyped key, not a time) and finite."""

    model_config = ConfigDict(extra="allow")
    unit_id: str = Field(min_length=1)
    status: Literal["ok", "error"]
    out_dir: str | None = None
    wall_s: float | None = Field(None, strict=True, allow_inf_nan=False, ge=0)
    attempts: int = Field(1, strict=True, ge=1)
    error: str | None = None
    log_tail: str | None = None
    host: str | None = None
    gpu_uuids: list[str] = Field(default_factory=list)
    started_at: float | None = Field(None, strict=True, allow_inf_nan=False)
    ended_at: float | None = Field(None, strict=True, allow_inf_nan=False)


def _read_manifest(d: Path) -> tuple[dict[str, Any] | None, str | None]:
    f = d / MANIFEST
    if not f.is_file():
        return None, f"{d}: not a shard output (no {MANIFEST})"
    try:
        doc = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        return None, f"{f}: unreadable shard manifest ({exc})"
    except RecursionError:
        return None, f"{f}: unreadable shard manifest (nested too deeply)"
    if not isinstance(doc, dict) or doc.get("kind") != "perfkit-shard":
        return None, f"{f}: not a perfkit shard manifest"
    missing = [k for k in ("partition", "params_sha256", "params", "units") if k not in doc]
    part = doc.get("partition")
    if missing or not isinstance(part, dict) or not {"index", "total"} <= set(part):
        return (
            None,
            f"{f}: incomplete shard manifest (missing {', '.join(missing) or 'partition index/total'})",
        )
    # the shapes merge relies on, checked here so that a hand-edited file is a named problem
    try:
        for k in ("index", "total"):
            if not isinstance(part[k], int) or isinstance(part[k], bool):
                raise ValueError(f"partition.{k} must be an integer, got {part[k]!r}")
        if not 1 <= part["index"] <= part["total"] <= MAX_SHARDS:
            raise ValueError(
                f"partition {part['index']}/{part['total']}: expected 1 <= index <= total <= {MAX_SHARDS}"
            )
        if not isinstance(doc["units"], list):
            raise ValueError(f"units must be a list, got {type(doc['units']).__name__}")
        for i, u in enumerate(doc["units"]):
            if not isinstance(u, dict):
                raise ValueError(f"units[{i}] must be a mapping, got {u!r}")
            try:
                unit = WorkUnit.from_dict(u)
            except ValueError as exc:
                raise ValueError(f"units[{i}].{exc}") from None
            if not isinstance(u.get("shard"), int) or isinstance(u.get("shard"), bool):
                raise ValueError(f"units[{i}] ({unit.id}).shard must be an integer, got {u.get('shard')!r}")
        outcomes = doc.get("outcomes") or []
        if not isinstance(outcomes, list) or not all(
            isinstance(o, dict) and o.get("unit_id") and o.get("status") in ("ok", "error") for o in outcomes
        ):
            raise ValueError("outcomes must be a list of mappings with unit_id and status ok|error")
        for i, o in enumerate(outcomes):
            try:
                _OutcomeDoc.model_validate(o)
            except ValidationError as exc:
                e = exc.errors()[0]
                key = ".".join(str(x) for x in e["loc"])
                raise ValueError(
                    f"outcomes[{i}] ({o['unit_id']}).{key}: {e['msg']}, got {e.get('input')!r}"
                ) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        return None, f"{f}: malformed shard manifest: {what}"
    return doc, None


def _params_from(manifest: Mapping[str, Any]) -> SuiteParams:
    from perfkit.params import parse_params

    return parse_params(manifest["params"], source=f"{manifest.get('params_file')} (from the shard manifest)")

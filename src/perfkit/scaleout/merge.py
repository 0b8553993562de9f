"""``perfkit merge``'s library: :func:`params_hash` and :func:`merge_shards`; layout in
docs/scale-out.md, what is compared in docs/robustness.md ("Merge identity").
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import ValidationError

from perfkit.bundle import TABLES, ResultBundle, read_meta, redact
from perfkit.bundle_schema import TABLES as TABLE_SCHEMAS
from perfkit.common import jsonsafe
from perfkit.investigations import registry
from perfkit.params import ParamsError, SuiteParams, parse_params
from perfkit.scaleout.units import MAX_SHARDS, OUTCOME, WorkUnit

log = logging.getLogger(__name__)

MANIFEST = "shard.json"
UNITS_DIR = "units"
MERGED_DIR = "merged"
MERGE_FILE = "merge.json"
TIERS = ("per-commit", "extra")
PLAN_NOT_RECORDED = "plan not recorded: not checked"


def params_hash(params: SuiteParams) -> str:
    """sha256 of the validated params as canonical JSON, whole floats as ints (0 == 0.0)."""
    doc = json.dumps(_same_numbers(params.model_dump()), sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def _same_numbers(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, Mapping):
        return {k: _same_numbers(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_same_numbers(x) for x in v]
    return v


def concurrent_pairs(outcomes: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """Pairs [a, b] (a < b, sorted) of unit ids whose last attempts overlapped in time."""
    spans = [
        (str(o["unit_id"]), float(o["started_at"]), float(o["ended_at"]))
        for o in outcomes
        if o.get("started_at") is not None and o.get("ended_at") is not None
    ]
    pairs = combinations(spans, 2)
    return sorted(sorted([a, b]) for (a, s1, e1), (b, s2, e2) in pairs if s1 < e2 and s2 < e1)


def _read_manifest(d: Path) -> dict[str, Any]:
    f = d / MANIFEST
    if not f.is_file():
        raise ValueError(f"{d}: not a shard output (no {MANIFEST})")
    try:
        doc = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise ValueError(f"{f}: unreadable shard manifest ({exc})") from None
    except RecursionError:
        raise ValueError(f"{f}: unreadable shard manifest (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("kind") != "perfkit-shard":
        raise ValueError(f"{f}: not a perfkit shard manifest")
    missing = [k for k in ("partition", "params_sha256", "params", "units") if k not in doc]
    part = doc.get("partition")
    if missing or not isinstance(part, dict) or not {"index", "total"} <= set(part):
        raise ValueError(
            f"{f}: incomplete shard manifest (missing {', '.join(missing) or 'partition index/total'})"
        )
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
            if not isinstance(u.get("shard"), int) or isinstance(u.get("shard"), bool):
                raise ValueError(
                    f"units[{i}] ({u.get('id')}).shard must be an integer, got {u.get('shard')!r}"
                )
            try:
                WorkUnit.from_dict(u)
            except ValueError as exc:
                raise ValueError(f"units[{i}].{exc}") from None
        outcomes = doc.get("outcomes") or []
        if not isinstance(outcomes, list) or not all(
            isinstance(o, dict) and o.get("unit_id") and o.get("status") in ("ok", "error") for o in outcomes
        ):
            raise ValueError("outcomes must be a list of mappings with unit_id and status ok|error")
        for i, o in enumerate(outcomes):
            try:
                OUTCOME.validate_python(o)
            except ValidationError as exc:
                e = exc.errors()[0]
                key = ".".join(str(x) for x in e["loc"])
                raise ValueError(
                    f"outcomes[{i}] ({o['unit_id']}).{key}: {e['msg']}, got {e.get('input')!r}"
                ) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{f}: malformed shard manifest: {what}") from None
    return doc


def _params_from(manifest: Mapping[str, Any]) -> SuiteParams:
    return parse_params(manifest["params"], source=f"{manifest.get('params_file')} (from the shard manifest)")


_SHARD_KEYS = ("params_file", "params_sha256", "perfkit_commit", "perfkit_version", "executor", "wall_s")

_IDENTITY_KEYS = ("commit", "perfkit version", "engine spec", "request", "engine program")


def _program(argv: Any) -> str | None:
    """The executable's name and the tokens before the first ``--option``."""
    if not isinstance(argv, list) or not argv:
        return None
    out = [Path(str(argv[0])).name]
    for tok in argv[1:]:
        if str(tok).startswith("--"):
            break
        out.append(str(tok))
    return " ".join(out)


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _part_identity(meta: Mapping[str, Any]) -> dict[str, Any]:
    params = meta.get("params") if isinstance(meta.get("params"), Mapping) else {}
    cmds = meta.get("commands") if isinstance(meta.get("commands"), Mapping) else {}
    so = meta.get("scaleout") if isinstance(meta.get("scaleout"), Mapping) else {}
    return {
        "commit": meta.get("git_commit"),
        "perfkit version": meta.get("perfkit_version"),
        "engine spec": params.get("spec"),
        "request": params.get("request"),
        "engine program": sorted({p for p in map(_program, cmds.values()) if p}),
        "plan": so.get("planned"),
    }


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """``key: A ≠ B`` for each leaf that differs (at most 5 named)."""
    out: list[str] = []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
    elif _canon(a) != _canon(b):
        out.append(f"{prefix or 'value'} {_short(a)} ≠ {_short(b)}")
    return out


def _short(v: Any) -> str:
    t = _canon(v)
    return t if len(t) <= 60 else t[:57] + "…"


def _identity_problems(
    items: list[tuple[str, Mapping[str, Any]]], *, allow_mixed_commits: bool = False
) -> list[str]:
    if not items:
        return []
    ref_name, ref = items[0]
    out: list[str] = []
    for name, ident in items[1:]:
        for key in _IDENTITY_KEYS:
            if key not in ref or ref[key] in (None, []):
                continue
            if key == "commit" and allow_mixed_commits:
                continue
            got = ident.get(key)
            if got == [] and key == "engine program":
                continue
            if got in (None, []):
                out.append(f"{name}: records no {key} ({ref_name} has {_short(ref[key])})")
                continue
            diff = _differences(got, ref[key])
            if diff:
                more = f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""
                hint = " (pass --allow-mixed-commits to merge builds on purpose)" if key == "commit" else ""
                out.append(
                    f"{name}: measured with another {key} than {ref_name}: {'; '.join(diff[:5])}{more}{hint}"
                )
    return out


def merge_shards(
    dirs: Iterable[str | Path],
    dest: str | Path,
    params: SuiteParams | None = None,
    *,
    allow_mixed_commits: bool = False,
) -> dict[str, Any]:
    """Join shard outputs into ``dest/<investigation>/`` bundles; returns the document written to
    ``dest/merge.json`` (docs/scale-out.md, "Merge"). ``params``: default the shards'. Raises
    ValueError when no shard manifest could be read (naming the dirs)."""
    dest = Path(dest)
    problems: list[str] = []
    manifests: list[tuple[Path, dict[str, Any]]] = []
    for d in map(Path, dirs):
        try:
            manifests.append((d.resolve(), _read_manifest(d)))
        except ValueError as exc:
            problems.append(str(exc))
    if not manifests:
        raise ValueError("nothing to merge: " + "; ".join(problems or ["no shard directories given"]))
    ref_dir, ref = manifests[0]
    notes: list[str] = []
    the_params = params if params is not None else _params_from(ref)
    want_hash = params_hash(the_params)
    want_name = "--params" if params is not None else f"{ref.get('params_file')} (shard {ref_dir})"
    total = int(ref["partition"]["total"])
    by_index = _usable_shards(manifests, the_params, want_hash, want_name, problems)
    problems += _identity_problems(
        [(f"shard {i}/{total} ({d})", _shard_identity(m)) for i, (d, m) in sorted(by_index.items())],
        allow_mixed_commits=allow_mixed_commits,
    )
    for i in range(1, total + 1):
        if i not in by_index:
            ids = [u["id"] for u in ref["units"] if u.get("shard") == i]
            problems.append(
                f"shard {i}/{total} missing: its units {', '.join(ids) or '(none)'} were not measured"
            )
    units = [WorkUnit.from_dict(u) for u in ref["units"]]
    found = _Found()
    for u in units:
        if u.shard in by_index:
            _collect_unit(u, by_index[u.shard], total, found, problems, notes)
    if found.identities:
        if units and units[0].shard in by_index:
            d0, m0 = by_index[units[0].shard]
            first = (f"shard {units[0].shard}/{total} ({d0})", _shard_identity(m0))
            problems += _identity_problems(
                [first, found.identities[0]], allow_mixed_commits=allow_mixed_commits
            )
        problems += _identity_problems(found.identities, allow_mixed_commits=allow_mixed_commits)
    dest.mkdir(parents=True, exist_ok=True)
    pairs = concurrent_pairs(found.outcomes.values())
    merged = _join_bundles(
        ref.get("selected") or [], units, found.part_dirs, pairs, the_params, dest, problems
    )
    doc = {
        "kind": "perfkit-merge",
        "shards": [
            {"dir": str(d), "partition": m["partition"], **{k: m.get(k) for k in _SHARD_KEYS}}
            for d, m in manifests
        ],
        "params_sha256": want_hash,
        "params": the_params.model_dump(),
        "selected": ref.get("selected") or [],
        "skipped": ref.get("skipped") or {},
        "only": ref.get("only"),
        "tier": ref.get("tier"),
        "units": [u.to_dict() for u in units],
        "outcomes": list(found.outcomes.values()),
        "concurrent": pairs,
        "merged": merged,
        "parts": found.part_info,
        "commits": sorted({str(v["commit"]) for v in found.part_info.values() if v["commit"]}),
        "allow_mixed_commits": allow_mixed_commits,
        "problems": problems,
        "notes": notes,
    }
    (dest / MERGE_FILE).write_text(jsonsafe.dumps(doc, indent=2, default=str) + "\n")
    if params is None:
        (dest / "params.yaml").write_text(
            f"# the params of the shards merged here ({ref.get('params_file')})\n"
            + yaml.safe_dump(the_params.model_dump(), sort_keys=False)
        )
    for n in notes:
        log.warning("merge: %s", n)
    for p in problems:
        log.error("merge: %s", p)
    return doc


def _usable_shards(
    manifests: list[tuple[Path, dict[str, Any]]],
    the_params: SuiteParams,
    want_hash: str,
    want_name: str,
    problems: list[str],
) -> dict[int, tuple[Path, dict[str, Any]]]:
    """Shard index -> (dir, manifest) of the shards measured for these params; others are problems."""
    ref_dir, ref = manifests[0]
    total = int(ref["partition"]["total"])
    by_index: dict[int, tuple[Path, dict[str, Any]]] = {}
    for d, m in manifests:
        shard = f"shard {m['partition']['index']}/{m['partition']['total']} ({d})"
        try:
            recorded = _params_from(m)
        except ParamsError as exc:
            problems.append(f"{shard}: its recorded params are not valid today: {exc}")
            continue
        if params_hash(recorded) != want_hash:
            diff = _differences(recorded.model_dump(mode="json"), the_params.model_dump(mode="json"))
            more = f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""
            problems.append(
                f"{shard} was measured with other params ({m.get('params_file')}) than {want_name}: "
                f"{'; '.join(diff[:5]) or 'digests differ'}{more}"
            )
            continue
        if int(m["partition"]["total"]) != total or [u["id"] for u in m["units"]] != [
            u["id"] for u in ref["units"]
        ]:
            problems.append(
                f"{d}: planned another partition ({m['partition']}) than {ref_dir} ({ref['partition']})"
            )
            continue
        i = int(m["partition"]["index"])
        if m.get("interrupted"):
            problems.append(f"shard {i}/{total} ({d}) was {m['interrupted']}")
        if i in by_index:
            problems.append(f"shard {i}/{total} given twice: {by_index[i][0]} and {d} (the first is used)")
            continue
        by_index[i] = (d, m)
    return by_index


def _shard_identity(m: dict[str, Any]) -> dict[str, Any]:
    return {"commit": m.get("perfkit_commit"), "perfkit version": m.get("perfkit_version")}


@dataclass
class _Found:
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    part_dirs: dict[str, Path] = field(default_factory=dict)
    identities: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    part_info: dict[str, dict[str, Any]] = field(default_factory=dict)


def _collect_unit(
    u: WorkUnit,
    shard: tuple[Path, dict[str, Any]],
    total: int,
    found: _Found,
    problems: list[str],
    notes: list[str],
) -> None:
    d, m = shard
    oc = next((o for o in m.get("outcomes") or [] if o.get("unit_id") == u.id), None)
    where = f"shard {u.shard}/{total} ({d})"
    if oc is None:
        why = "the shard was interrupted" if m.get("interrupted") else "the shard did not finish"
        problems.append(f"unit {u.id} of {where}: no outcome ({why})")
        return
    found.outcomes[u.id] = oc
    if oc.get("status") != "ok":
        problems.append(
            f"unit {u.id} of {where} failed after {oc.get('attempts')} attempt(s): {oc.get('error')}"
        )
        return
    for p in u.parts:
        pd_ = d / UNITS_DIR / u.id / p.id
        if not (pd_ / "meta.json").is_file():
            problems.append(f"unit {u.id} of {where}: its output {pd_} is missing")
            continue
        try:
            meta = read_meta(pd_)
        except (OSError, ValueError, RecursionError) as exc:
            problems.append(f"unit {u.id}: part {p.id}: unreadable {pd_ / 'meta.json'} ({exc})")
            continue
        # a missing table is lost data, unless additive and older than the bundle
        written = meta.get("tables") if isinstance(meta.get("tables"), list) else None
        absent = [t for t in TABLES if not (pd_ / f"{t}.parquet").is_file()]
        older = [t for t in absent if TABLE_SCHEMAS[t].additive and (written is None or t not in written)]
        lost = [f"{t}.parquet" for t in absent if t not in older]
        lost += [] if (pd_ / "results.json").is_file() else ["results.json"]
        if lost:
            problems.append(f"unit {u.id}: part {p.id} lacks {', '.join(lost)} ({where}: {pd_})")
            continue
        part_notes = [f"{t}.parquet absent: saved before the table existed, read as empty" for t in older]
        ident = _part_identity(meta)
        planned = jsonsafe.finite(redact({"engine": u.engine, "request": u.request, "params": p.params}))
        if ident["plan"] is None:
            part_notes.insert(0, PLAN_NOT_RECORDED)
        elif _canon(ident["plan"]) != _canon(planned):
            diff = "; ".join(_differences(ident["plan"], planned)[:5])
            problems.append(
                f"part {p.id} ({where}): measured for another plan than the manifest's unit {u.id}: {diff}"
            )
        found.identities.append((f"part {p.id} ({where})", ident))
        found.part_info[p.id] = {
            "unit": u.id,
            "shard": u.shard,
            "commit": ident["commit"],
            "perfkit_version": ident["perfkit version"],
            **({"notes": part_notes} if part_notes else {}),
        }
        notes += [f"part {p.id} ({where}): {n}" for n in part_notes]
        found.part_dirs[p.id] = pd_


def _join_bundles(
    selected: list[str],
    units: list[WorkUnit],
    part_dirs: dict[str, Path],
    pairs: list[list[str]],
    the_params: SuiteParams,
    dest: Path,
    problems: list[str],
) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name in selected:
        s = registry.get(name)
        parts = [p for u in units for p in u.parts if p.investigation == name]
        if not parts or any(p.id not in part_dirs for p in parts):
            continue
        try:
            bundles = [ResultBundle.load(part_dirs[p.id]) for p in parts]
            if len(parts) > 1:
                assert s.join is not None
                b = s.join(bundles, the_params.section(name))
            else:
                b = bundles[0]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{name}: cannot join its parts ({', '.join(p.id for p in parts)}): {exc}")
            continue
        unit_of = {p.id: u.id for u in units for p in u.parts}
        mine = sorted({unit_of[p.id] for p in parts})
        b.meta["scaleout"] = {
            "units": mine,
            "parts": [p.id for p in parts],
            "wall_s": {p.id: (bb.meta.get("scaleout") or {}).get("wall_s") for p, bb in zip(parts, bundles)},
            "concurrent_with": sorted(
                {x for a, c in pairs for x in (a, c) if (a in mine or c in mine)} - set(mine)
            ),
            "concurrent_pairs": [[a, c] for a, c in pairs if a in mine or c in mine],
        }
        b.save(dest / name)
        merged[name] = str(dest / name)
    return merged

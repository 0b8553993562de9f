"""CI partitions and merging: ``perfkit suite --partition I/N`` runs shard I's units into
bundles plus a shard manifest; ``perfkit merge`` joins shard outputs into one run's bundles.

Shard output layout::

    SHARD/shard.json               the manifest (see :func:`run_shard`)
    SHARD/units/<unit id>/         unit.json and one bundle per part (<part id>/)

Merged layout (what ``perfkit merge DIR... --out RUN`` replays from)::

    RUN/merged/<scenario>/         the bundle the unsplit run would have written
    RUN/merged/merge.json          shards read, problems, units with outcomes, concurrency
    RUN/merged/params.yaml         the shards' params (when ``--params`` is not given)

A shard whose manifest is missing, a planned unit without outputs, a failed unit and shards
measured with other params are *problems*: each is named (shard, unit) in ``merge.json`` and,
through the suite, in run.json, summary.md and the report, and the verdict is an error (2).
Honest older data is merged with a *note* instead: a part of a perfkit that recorded no plan
("plan not recorded: not checked") and an additive table absent from a bundle saved before it
existed (:data:`perfkit.bundle_schema.Table.additive`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfkit.bundle import TABLES, ResultBundle, redact
from perfkit.bundle_schema import TABLES as TABLE_SCHEMAS
from perfkit.common import jsonsafe
from perfkit.common.provenance import git_commit
from perfkit.gate import baseline as bl
from perfkit.gate.run import resolve_baseline_file
from perfkit.params import ParamsError, SuiteParams, load_params
from perfkit.scaleout.executor import executor as get_executor
from perfkit.scaleout.executor import progress_events, run_unit
from perfkit.scaleout.outcome import UnitOutcome
from perfkit.scaleout.units import WorkUnit, partition, plan_units
from perfkit.scenarios import registry

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST",
    "MERGE_FILE",
    "MERGED_DIR",
    "UNITS_DIR",
    "params_hash",
    "select",
    "run_shard",
    "merge_shards",
    "identity_problems",
    "part_identity",
    "concurrent_pairs",
    "recorded_durations",
]

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


def select(
    params: SuiteParams, only: Iterable[str] | None = None, tier: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """(selected scenario names in run order, {left-out name: why}): enabled in the params,
    picked by ``only`` (when given) and of ``tier`` (when given).

    Raises:
        ValueError: an unknown tier (naming the known ones).
    """
    if tier is not None and tier not in TIERS:
        raise ValueError(f"--tier {tier!r}: unknown tier; known: {', '.join(TIERS)}")
    only_set = set(only) if only else None
    enabled = params.enabled()
    selected, skipped = [], {}
    for n in registry.names():
        if n not in enabled:
            skipped[n] = "disabled in the params"
        elif only_set is not None and n not in only_set:
            skipped[n] = "not selected by --only"
        elif tier is not None and params.section(n).tier != tier:
            skipped[n] = f"tier {params.section(n).tier}, not selected by --tier {tier}"
        else:
            selected.append(n)
    return selected, skipped


def _baseline_doc(params: SuiteParams) -> dict[str, Any] | None:
    f = params.baseline.file
    if not f:
        return None
    try:
        return bl.load_baseline(resolve_baseline_file(f))
    except (OSError, ValueError) as exc:
        log.warning("no estimates from baseline %s: %s", f, exc)
        return None


def recorded_durations(paths: Iterable[str | Path]) -> dict[str, float]:
    """Unit id -> measured wall seconds from shard manifests or merge files (``shard.json``,
    ``merge.json``, or directories holding one); unreadable ones are logged and skipped."""
    out: dict[str, float] = {}
    for p in paths:
        p = Path(p)
        for f in [p] if p.is_file() else [p / MANIFEST, p / MERGED_DIR / MERGE_FILE, p / MERGE_FILE]:
            if not f.is_file():
                continue
            try:
                doc = json.loads(f.read_text())
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable (%s): no recorded durations from it", f, exc)
                continue
            for oc in doc.get("outcomes") or []:
                if oc.get("status") == "ok" and oc.get("wall_s"):
                    out[str(oc["unit_id"])] = float(oc["wall_s"])
    return out


def run_shard(
    params_path: str | Path,
    out: str | Path,
    index: int,
    total: int,
    *,
    only: Iterable[str] | None = None,
    tier: str | None = None,
    executor: str = "inprocess",
    executor_options: Mapping[str, Any] | None = None,
    recorded: Mapping[str, float] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run shard ``index`` of ``total`` (1-based): plan every unit of the selection, partition
    them (:func:`perfkit.scaleout.units.partition`), run this shard's with ``executor``; writes
    bundles under ``out/units/`` and the manifest ``out/shard.json``.

    The manifest holds: ``kind`` ("perfkit-shard"), ``params_file``, ``params_sha256``
    (:func:`params_hash`), ``params`` (validated), ``partition`` {index, total}, ``selected``
    and ``skipped`` (name -> why), ``units`` (every planned unit of ALL shards, with its shard,
    estimate and source), ``outcomes`` (this shard's :class:`UnitOutcome` dicts),
    ``perfkit_commit``, ``executor``, ``wall_s``.

    Returns:
        the manifest.

    Raises:
        ParamsError, FileNotFoundError: bad params. ExecutorError: unknown or missing executor.
        ValueError: bad tier, or index/total out of range.
    """
    if not (total >= 1 and 1 <= index <= total):
        raise ValueError(f"shard {index}/{total}: need 1 <= I <= N")
    params = load_params(params_path)
    run_units = get_executor(executor)
    selected, skipped = select(params, only, tier)
    units = plan_units(params, selected, baseline=_baseline_doc(params), recorded=recorded)
    shards = partition(units, total)
    mine = shards[index - 1]
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "kind": "perfkit-shard",
        "params_file": str(params_path),
        "params_sha256": params_hash(params),
        "params": params.model_dump(),
        "partition": {"index": index, "total": total},
        "selected": selected,
        "skipped": skipped,
        "only": list(only) if only else None,
        "tier": tier,
        "units": [u.to_dict() for u in units],
        "outcomes": [],
        "perfkit_commit": git_commit(),
        "perfkit_version": perfkit_version(),
        "executor": executor,
    }
    _write_manifest(out, manifest)
    log.info(
        "shard %d/%d: %d of %d units (%s)", index, total, len(mine), len(units), ", ".join(u.id for u in mine)
    )
    bar_event, close = progress_events(mine, enabled=progress)
    t0 = time.monotonic()
    done: dict[str, dict[str, Any]] = {}

    def on_event(event: str, unit_id: str, outcome: UnitOutcome | None) -> None:
        bar_event(event, unit_id, outcome)
        if event == "finished" and outcome is not None:  # a run cut short keeps what finished
            done[unit_id] = outcome.to_dict()
            manifest["outcomes"] = list(done.values())
            _write_manifest(out, manifest)

    try:
        outcomes = run_units(
            [u.to_dict() for u in mine],
            run_unit,
            out / UNITS_DIR,
            retries=params.scaleout.retries,
            on_event=on_event,
            **dict(executor_options or {}),
        )
    except KeyboardInterrupt as exc:
        left = [u.id for u in mine if u.id not in done]
        manifest["interrupted"] = (
            f"interrupted ({exc or 'Ctrl-C'}) after {len(done)} of {len(mine)} units; "
            f"not finished: {', '.join(left) or '(none)'}"
        )
        manifest["wall_s"] = round(time.monotonic() - t0, 2)
        _write_manifest(out, manifest)
        raise ShardInterrupted(
            f"shard {index}/{total}: {manifest['interrupted']} ({out / MANIFEST})"
        ) from None
    finally:
        close()
    manifest["outcomes"] = [o.to_dict() for o in outcomes]
    manifest["wall_s"] = round(time.monotonic() - t0, 2)
    _write_manifest(out, manifest)
    return manifest


class ShardInterrupted(RuntimeError):
    """A shard run stopped by Ctrl-C or SIGTERM; its manifest keeps the units that finished and
    says which did not (exit 2)."""


def _write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``out/shard.json`` whole or not at all (a temporary file, then a rename)."""
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(jsonsafe.dumps(manifest, indent=2, default=str) + "\n")
    tmp.replace(out / MANIFEST)


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


def perfkit_version() -> str:
    """This perfkit's version (``perfkit.__version__``)."""
    from perfkit.common import version as perfkit  # the leaf module, not the root package

    return str(perfkit.__version__)


#: what every part and shard of one merged run must share (see :func:`part_identity`)
IDENTITY_KEYS = ("commit", "perfkit version", "engine spec", "request", "engine program")


def _program(argv: Any) -> str | None:
    """The engine program of an argv: the executable's file name and the tokens before the first
    ``--option`` (``python -m perfkit.refengine``, ``sglang serve``); values and ports, which
    a scenario varies per launch, are left out."""
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


def part_identity(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a part bundle's ``meta.json`` says it was measured with: ``commit``, ``perfkit
    version``, ``engine spec`` and ``request`` (``meta.params.spec``/``request``: every scenario
    records the unit's engine and request there), ``engine program`` (:func:`_program` of
    each launch's argv, sorted, unique) and ``plan`` (the unit's engine, request and part params
    that :func:`perfkit.scaleout.executor.run_unit` stamped in ``meta.scaleout.planned``, which
    merge compares with the manifest's unit, not across parts)."""
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


def identity_problems(
    items: list[tuple[str, Mapping[str, Any]]], *, allow_mixed_commits: bool = False
) -> list[str]:
    """Every way the parts or shards in ``items`` (``(name, identity)``, the first the
    reference) differ from the first: one named problem per item and key of
    :data:`IDENTITY_KEYS` (``part cold_warm (shard 2/2, DIR): measured at another commit than
    part X: abc ≠ def``). ``allow_mixed_commits`` accepts other commits (the page then shows each
    part's). A key the reference lacks (None) is not compared; an item lacking what the
    reference has is named."""
    if not items:
        return []
    ref_name, ref = items[0]
    out: list[str] = []
    for name, ident in items[1:]:
        for key in IDENTITY_KEYS:
            if key not in ref or ref[key] in (None, []):
                continue
            if key == "commit" and allow_mixed_commits:
                continue
            got = ident.get(key)
            if got == [] and key == "engine program":
                continue  # a part that launched nothing (it reused a launch, or was refused)
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
    """Join shard outputs into ``dest/<scenario>/`` bundles (``Scenario.join`` for split
    scenarios) and write ``dest/merge.json``.

    Args:
        dirs: shard output directories (``--partition`` ``--out`` of each shard).
        dest: where the merged bundles go (``RUN/merged``).
        params: the params to merge for (``perfkit merge --params``); default: the shards'.
        allow_mixed_commits: accept shards and parts measured at other commits (each part's
            commit is then in ``parts`` and on the page); otherwise each is a problem.

    Returns:
        the merge document: ``shards`` (dir, partition, params hash, commit), ``problems``
        (each naming the shard or unit), ``units`` (planned, with shard and outcome),
        ``outcomes``, ``concurrent`` (:func:`concurrent_pairs`), ``selected``, ``skipped``,
        ``merged`` (scenario -> bundle dir), ``params_sha256``, ``params`` (validated dict),
        ``parts`` (part id -> {unit, shard, commit, perfkit_version}), ``commits`` (the distinct
        commits measured), ``allow_mixed_commits``, ``notes`` (honest older data merged:
        "part P (shard …): plan not recorded: not checked", an additive table absent; each
        part's too, in ``parts.<id>.notes``).

    Every shard and every part is compared with the first (:func:`identity_problems`): commit,
    perfkit version, params (each manifest's re-validated with today's model, digested like
    ``params``: a changed value is named by key), engine spec, request, engine program and the
    planned unit (a part that records none: a note);
    each difference is a named problem (exit 2), other commits only without
    ``allow_mixed_commits``.

    Raises:
        ValueError: no shard manifest could be read at all (nothing to merge; naming the dirs).
    """
    dest = Path(dest)
    problems: list[str] = []
    manifests: list[tuple[Path, dict[str, Any]]] = []
    for d in map(Path, dirs):
        doc, err = _read_manifest(d)
        if err:
            problems.append(err)
        else:
            manifests.append((d.resolve(), doc))
    if not manifests:
        raise ValueError("nothing to merge: " + "; ".join(problems or ["no shard directories given"]))
    ref_dir, ref = manifests[0]
    notes: list[str] = []
    # what the user means, digested the same way on both sides: each manifest's recorded params
    # re-validated with today's model (fields added since get their defaults) versus --params
    # (or the first shard's) validated the same way; a changed value is refused by name
    the_params = params if params is not None else _params_from(ref)
    want_hash = params_hash(the_params)
    want_name = "--params" if params is not None else f"{ref.get('params_file')} (shard {ref_dir})"
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
    problems += identity_problems(
        [
            (
                f"shard {i}/{total} ({d})",
                {"commit": m.get("perfkit_commit"), "perfkit version": m.get("perfkit_version")},
            )
            for i, (d, m) in sorted(by_index.items())
        ],
        allow_mixed_commits=allow_mixed_commits,
    )
    for i in range(1, total + 1):
        if i not in by_index:
            ids = [u["id"] for u in ref["units"] if u.get("shard") == i]
            problems.append(
                f"shard {i}/{total} missing: its units {', '.join(ids) or '(none)'} were not measured"
            )
    units = [WorkUnit.from_dict(u) for u in ref["units"]]
    outcomes: dict[str, dict[str, Any]] = {}
    part_dirs: dict[str, Path] = {}
    identities: list[tuple[str, dict[str, Any]]] = []
    part_info: dict[str, dict[str, Any]] = {}
    for u in units:
        if u.shard not in by_index:
            continue
        d, m = by_index[u.shard]
        oc = next((o for o in m.get("outcomes") or [] if o.get("unit_id") == u.id), None)
        where = f"shard {u.shard}/{total} ({d})"
        if oc is None:
            why = "the shard was interrupted" if m.get("interrupted") else "the shard did not finish"
            problems.append(f"unit {u.id} of {where}: no outcome ({why})")
            continue
        outcomes[u.id] = oc
        if oc.get("status") != "ok":
            problems.append(
                f"unit {u.id} of {where} failed after {oc.get('attempts')} attempt(s): {oc.get('error')}"
            )
            continue
        for p in u.parts:
            pd_ = d / UNITS_DIR / u.id / p.id
            if not (pd_ / "meta.json").is_file():
                problems.append(f"unit {u.id} of {where}: its output {pd_} is missing")
                continue
            try:
                meta = json.loads((pd_ / "meta.json").read_text(encoding="utf-8"))
                if not isinstance(meta, dict):
                    raise ValueError(f"is {type(meta).__name__}, expected an object")
            except (OSError, ValueError, RecursionError) as exc:
                problems.append(f"unit {u.id}: part {p.id}: unreadable {pd_ / 'meta.json'} ({exc})")
                continue
            # a saved bundle writes every table (empty ones too): a missing file is lost data,
            # which ResultBundle.load would read as an empty table; except an additive table
            # absent from a bundle saved before it existed (meta.tables, written since, lacks it)
            written = meta.get("tables") if isinstance(meta.get("tables"), list) else None
            absent = [t for t in TABLES if not (pd_ / f"{t}.parquet").is_file()]
            older = [t for t in absent if TABLE_SCHEMAS[t].additive and (written is None or t not in written)]
            lost = [f"{t}.parquet" for t in absent if t not in older]
            lost += [] if (pd_ / "results.json").is_file() else ["results.json"]
            if lost:
                problems.append(f"unit {u.id}: part {p.id} lacks {', '.join(lost)} ({where}: {pd_})")
                continue
            part_notes = [f"{t}.parquet absent: saved before the table existed, read as empty" for t in older]
            ident = part_identity(meta)
            # as the bundle saved it (secrets redacted, NaN as null)
            planned = jsonsafe.finite(redact({"engine": u.engine, "request": u.request, "params": p.params}))
            if ident["plan"] is None:
                # measured by an older perfkit (before run_unit stamped the plan): merged, said so
                part_notes.insert(0, PLAN_NOT_RECORDED)
            elif _canon(ident["plan"]) != _canon(planned):
                diff = "; ".join(_differences(ident["plan"], planned)[:5])
                problems.append(
                    f"part {p.id} ({where}): measured for another plan than the manifest's unit {u.id}: {diff}"
                )
            identities.append((f"part {p.id} ({where})", ident))
            part_info[p.id] = {
                "unit": u.id,
                "shard": u.shard,
                "commit": ident["commit"],
                "perfkit_version": ident["perfkit version"],
                **({"notes": part_notes} if part_notes else {}),
            }
            notes += [f"part {p.id} ({where}): {n}" for n in part_notes]
            part_dirs[p.id] = pd_
    # every part against the first, and the first against its shard's manifest
    if identities:
        ref_shard = by_index.get(units[0].shard) if units else None
        if ref_shard is not None:
            identities.insert(
                0,
                (
                    f"shard {units[0].shard}/{total} ({ref_shard[0]})",
                    {
                        "commit": ref_shard[1].get("perfkit_commit"),
                        "perfkit version": ref_shard[1].get("perfkit_version"),
                    },
                ),
            )
            problems += identity_problems(identities[:2], allow_mixed_commits=allow_mixed_commits)
            identities.pop(0)
        problems += identity_problems(identities, allow_mixed_commits=allow_mixed_commits)
    dest.mkdir(parents=True, exist_ok=True)
    merged: dict[str, str] = {}
    pairs = concurrent_pairs(outcomes.values())
    for name in ref.get("selected") or []:
        s = registry.get(name)
        parts = [p for u in units for p in u.parts if p.scenario == name]
        if not parts or any(p.id not in part_dirs for p in parts):
            continue  # named above; the suite skips its notebook (no bundle)
        try:
            bundles = [ResultBundle.load(part_dirs[p.id]) for p in parts]
            if len(parts) > 1:
                assert s.join is not None  # split scenarios have join (registry checks)
                b = s.join(bundles, the_params.section(name))
            else:
                b = bundles[0]
        except Exception as exc:  # noqa: BLE001 - a bad part is a named problem, not a traceback
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
            # every pair of units that overlapped in time where one is this bundle's, its own
            # parts' units among them (a split scenario whose launches ran side by side)
            "concurrent_pairs": [[a, c] for a, c in pairs if a in mine or c in mine],
        }
        b.save(dest / name)
        merged[name] = str(dest / name)
    doc = {
        "kind": "perfkit-merge",
        "shards": [
            {
                "dir": str(d),
                "partition": m["partition"],
                "params_file": m.get("params_file"),
                "params_sha256": m.get("params_sha256"),
                "perfkit_commit": m.get("perfkit_commit"),
                "perfkit_version": m.get("perfkit_version"),
                "executor": m.get("executor"),
                "wall_s": m.get("wall_s"),
            }
            for d, m in manifests
        ],
        "params_sha256": want_hash,
        "params": the_params.model_dump(),
        "selected": ref.get("selected") or [],
        "skipped": ref.get("skipped") or {},
        "only": ref.get("only"),
        "tier": ref.get("tier"),
        "units": [u.to_dict() for u in units],
        "outcomes": list(outcomes.values()),
        "concurrent": pairs,
        "merged": merged,
        "parts": part_info,
        "commits": sorted({str(v["commit"]) for v in part_info.values() if v["commit"]}),
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


def _params_from(manifest: Mapping[str, Any]) -> SuiteParams:
    from perfkit.params import parse_params

    return parse_params(manifest["params"], source=f"{manifest.get('params_file')} (from the shard manifest)")


def outcome_of(doc: Mapping[str, Any], unit_id: str) -> UnitOutcome | None:
    """The :class:`UnitOutcome` of ``unit_id`` in a shard manifest or merge document."""
    for o in doc.get("outcomes") or []:
        if o.get("unit_id") == unit_id:
            keep = {k: v for k, v in o.items() if k in UnitOutcome.__dataclass_fields__}
            keep["out_dir"] = Path(keep["out_dir"]) if keep.get("out_dir") else None
            return UnitOutcome(**keep)
    return None


def refresh_estimates(baseline_file: str | Path, sources: Iterable[str | Path]) -> dict[str, float]:
    """Set ``estimated_full_test_time_s`` of the baseline's cases from measured unit wall times
    (shard manifests or merge files, or run directories holding ``merged/merge.json``): each
    finished unit's wall seconds are shared evenly among its parts' case ids; cases the file
    lacks are left out (write them with ``perfkit baseline update --bundle`` first). The file
    is replaced atomically.

    Returns:
        case id -> the estimate written (s).

    Raises:
        ValueError: no source holds a finished unit, or the baseline file is not valid.
        OSError: the file cannot be read or written.
    """
    doc = bl.load_baseline(Path(baseline_file))
    cases = doc.setdefault("scenarios", {})
    written: dict[str, float] = {}
    found = 0
    for src in sources:
        p = Path(src)
        files = [p] if p.is_file() else [p / MANIFEST, p / MERGED_DIR / MERGE_FILE, p / MERGE_FILE]
        for f in files:
            if not f.is_file():
                continue
            try:
                m = json.loads(f.read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{f}: unreadable ({exc})") from None
            units = {u["id"]: WorkUnit.from_dict(u) for u in m.get("units") or []}
            for oc in m.get("outcomes") or []:
                u = units.get(oc.get("unit_id"))
                if u is None or oc.get("status") != "ok" or not oc.get("wall_s"):
                    continue
                found += 1
                ids = [c for part in u.parts for c in part.case_ids]
                if not ids:
                    continue
                share = round(float(oc["wall_s"]) / len(ids), 1)
                for c in ids:
                    if c in cases:
                        cases[c]["estimated_full_test_time_s"] = share
                        written[c] = share
    if not found:
        raise ValueError(
            "no finished unit in " + ", ".join(map(str, sources)) + f" (expected {MANIFEST} or {MERGE_FILE})"
        )
    bl.save_baseline(doc, Path(baseline_file))
    return written

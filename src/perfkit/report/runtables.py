"""The run's tables beside the verdict: its units of work (:func:`units_frame`), the launches that
did not end by perfkit's plain teardown (:func:`engine_ends_frame`) and the requests whose
performance.log record was refused (:func:`refused_records`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from perfkit.common.slugs import clip
from perfkit.report.runinfo import run_info
from perfkit.scenarios import registry

log = logging.getLogger(__name__)


def _part_id(part: Mapping[str, Any]) -> str:
    """A planned part's id (``scaleout.units.Part.id``): ``scenario`` or ``scenario.key``."""
    return str(part.get("scenario", "")) + (f".{part['key']}" if part.get("key") else "")


def units_frame(info: Mapping[str, Any]) -> pd.DataFrame | None:
    """The units of work of a merged run (``run.json``'s ``scaleout``), one row each: unit,
    parts, shard, status, attempts, wall (s), GPUs (NVML UUIDs, shortened), the units it ran
    beside, the commit (only when the merge holds several), the merge's notes (when any) and the
    error. None for a run without units."""
    so = info.get("scaleout") or {}
    units = so.get("units") or []
    if not units:
        return None
    outcomes = {o.get("unit_id"): o for o in so.get("outcomes") or [] if isinstance(o, Mapping)}
    beside: dict[str, set[str]] = {}
    for pair in so.get("concurrent") or []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            a, b = (str(x) for x in pair)
            beside.setdefault(a, set()).add(b)
            beside.setdefault(b, set()).add(a)
    parts_info = so.get("parts") if isinstance(so.get("parts"), Mapping) else {}
    mixed = len(so.get("commits") or []) > 1  # merged on purpose (--allow-mixed-commits): say whose
    noted = any((v or {}).get("notes") for v in parts_info.values() if isinstance(v, Mapping))
    rows = []
    for u in units:
        uid = u.get("id")
        o = outcomes.get(uid) or {}
        commits = {
            str((parts_info.get(_part_id(p)) or {}).get("commit") or "")[:12] for p in u.get("parts") or []
        } - {""}
        rows.append(
            {
                "unit": uid,
                "parts": ", ".join(_part_id(p) for p in u.get("parts") or []),
                "shard": u.get("shard"),
                "status": o.get("status") or "not run",
                "attempts": o.get("attempts"),
                "wall (s)": o.get("wall_s"),
                "GPUs": ", ".join(g[:12] + "…" for g in o.get("gpu_uuids") or []) or None,
                "ran beside": ", ".join(sorted(beside.get(uid, ()))) or None,
                **({"commit": ", ".join(sorted(commits)) or None} if mixed else {}),
                **({"notes": _unit_notes(u, parts_info)} if noted else {}),
                "error": clip(o.get("error")),
            }
        )
    return pd.DataFrame(rows)


def _unit_notes(unit: Mapping[str, Any], parts_info: Mapping[str, Any]) -> str | None:
    """The merge's notes on ``unit``'s parts, distinct, in order ("; "-joined); None without."""
    out: list[str] = []
    for p in unit.get("parts") or []:
        for n in (parts_info.get(_part_id(p)) or {}).get("notes") or []:
            if n not in out:
                out.append(str(n))
    return "; ".join(out) or None


def refused_records(run_dir: str | Path) -> list[str]:
    """One line per request that failed because the engine's performance.log record for it was
    refused (a NaN, infinite or negative time, invalid UTF-8, a wrong type: the reason names the
    file and line), from every bundle's ``requests`` table under ``run_dir`` (merged bundles
    included). [] when there are none or no bundle is readable."""
    from perfkit.readings.records import REFUSED

    out: list[str] = []
    run_dir = Path(run_dir)
    paths = sorted(run_dir.glob("*/requests.parquet")) + sorted(run_dir.glob("merged/*/requests.parquet"))
    for p in paths:
        try:
            df = pd.read_parquet(p, columns=["launch", "request_id", "index", "error"])
        except Exception as exc:  # noqa: BLE001 - the summary is written in every case
            log.warning("summary: cannot read %s: %r", p, exc)
            continue
        for r in df.itertuples(index=False):
            if isinstance(r.error, str) and r.error.startswith(REFUSED):
                out.append(
                    f"{p.parent.name}: request {r.request_id} ({r.launch} #{r.index}) failed: {r.error}"
                )
    return out


def _na(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def engine_ends_frame(run_dir: str | Path) -> pd.DataFrame | None:
    """The launches that did not end by perfkit's plain teardown, one row each (investigation,
    launch, the failed request's index, how the engine ended, the host's OOM-kill record), from
    each bundle's ``launches`` table (the units' under ``RUN/shards/`` too), then the processes
    a notebook's kernel left running that the suite ended (run.json's ``outlived`` and
    ``in_flight``). None when there is none."""
    from perfkit.bundle import ResultBundle

    run_dir = Path(run_dir)
    rows = []
    # the run's bundles, then those of its units (--executor: RUN/shards/<i>/units/<unit>/<part>)
    dirs = [(name, run_dir / name) for name in registry.names()]
    dirs += [(d.name, d) for d in sorted(run_dir.glob("shards/*/units/*/*")) if d.is_dir()]
    seen: set[tuple[Any, ...]] = set()
    for name, d in dirs:
        if not (d / "meta.json").exists():
            continue
        try:
            la = ResultBundle.load(d).table("launches")
        except (OSError, ValueError, KeyError) as exc:
            log.warning("%s: launches not readable: %s", d, exc)
            continue
        for r in la.to_dict("records"):
            failed, by_perfkit = r.get("failed_request"), r.get("end_by_perfkit")
            if _na(failed) and (_na(r.get("ended")) or by_perfkit is True or _na(r.get("end_signal"))):
                continue
            key = (name.split(".")[0], r.get("launch"), r.get("ended"), str(failed))
            if key in seen:  # a merged bundle and its unit's own copy
                continue
            seen.add(key)
            rows.append(
                {
                    "investigation": name,
                    "launch": r.get("launch"),
                    "failed request": None if _na(failed) else int(failed),
                    "how the engine ended": r.get("ended") or "not recorded",
                    "OOM-kill record": r.get("oom_record") or "–",
                }
            )
    for n in run_info(run_dir).get("notebooks", []):
        fl = n.get("in_flight") or {}
        for e in n.get("outlived") or []:
            label = str(e.get("label") or "")
            mine = fl and label.split(" ")[0] == str(fl.get("launch"))
            rows.append(
                {
                    "investigation": n.get("name"),
                    "launch": f"pid {e.get('pid')} {label}".strip(),
                    "failed request": fl.get("request") if mine else None,
                    "how the engine ended": f"found after its notebook's kernel ended: {e.get('how')}",
                    "OOM-kill record": "–",
                }
            )
    return pd.DataFrame(rows) if rows else None

"""Allocation sites of what grew: the ``snapshot`` setting's allocator snapshots on request
boundaries read into the bundle's ``memory_sites`` rows (:func:`collect`); see
docs/below-the-stage.md.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from perfkit.bundle import conform
from perfkit.common.slugs import md_text
from perfkit.engine.spec import EngineSpec
from perfkit.readings.memsnapshot import MemSnapshotError, diff_snapshots, peak_by_site, read_snapshot

log = logging.getLogger(__name__)

NOT_ON_CPU = "not available on cpu"


class SnapshotParams(BaseModel):
    """``snapshot`` setting of a scenario: allocator snapshots on request boundaries (CUDA).

    ``warm``: which warm request k to compare with the cold one (None: the last); ``max_entries``:
    allocation history kept (bounds a file's size); ``top``: sites kept per table;
    ``max_file_mib``: a snapshot (gzipped) over this is summarised but not kept in the bundle.
    """

    model_config = ConfigDict(extra="forbid")
    warm: int | None = Field(None, ge=1)
    max_entries: int = Field(20000, ge=100)
    top: int = Field(10, ge=1, le=100)
    max_file_mib: float = Field(8.0, gt=0)

    def indices(self, repeats: int) -> list[int]:
        """[0, k]: the cold request and warm request k (< repeats)."""
        k = repeats - 1 if self.warm is None else min(self.warm, repeats - 1)
        return [0, k]


def ask_engine(spec: EngineSpec, params: SnapshotParams, repeats: int) -> tuple[EngineSpec, str | None]:
    """``spec`` with the snapshot flags set, and None; or ``spec`` unchanged and why not (an
    engine kind without the flags: sglang's server has no such option)."""
    if spec.kind != "reference":
        return (
            spec,
            f"not available for engine kind {spec.kind!r} (the reference engine's --memory-snapshot-after)",
        )
    return spec.replace(
        memory_snapshot_after=params.indices(repeats), memory_snapshot_entries=params.max_entries
    ), None


def _snapshot_entries(record_lines: list[str]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for ln in record_lines:
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        pk = rec.get("perfkit") if isinstance(rec, dict) else None
        snap = pk.get("memory_snapshot") if isinstance(pk, dict) else None
        if isinstance(snap, dict) and isinstance(snap.get("request_index"), int):
            out[snap["request_index"]] = {**snap, "t_start": pk.get("t_start")}
    return out


def collect(
    launch: str, record_lines: list[str], params: SnapshotParams, repeats: int, why_not: str | None = None
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Path]]:
    """Read the snapshots a launch's records name and compare them.

    ``why_not``: :func:`ask_engine`'s reason; then nothing is read and it is the status.

    Returns:
        (``memory_sites`` table, results entry, bundle files ``name -> path``). The results
        entry: ``status`` (``ok``, :data:`NOT_ON_CPU`, or why not), ``from``/``to`` request
        indices, ``grew`` (top sites: site, grown_mib) and ``peak_mib``.
    """
    first, k = params.indices(repeats)
    entries = _snapshot_entries(record_lines)
    res: dict[str, Any] = {"from": first, "to": k, "grew": [], "peak_mib": None}
    if why_not:
        return conform("memory_sites", pd.DataFrame()), {**res, "status": why_not}, {}
    errors = [e["error"] for e in entries.values() if e.get("error")]
    if any(err == NOT_ON_CPU for err in errors):
        return conform("memory_sites", pd.DataFrame()), {**res, "status": NOT_ON_CPU}, {}
    missing = [i for i in (first, k) if not entries.get(i, {}).get("path")]
    if missing:
        why = "; ".join(errors) or f"no snapshot named in the records for request(s) {missing}"
        return conform("memory_sites", pd.DataFrame()), {**res, "status": f"no snapshot: {why}"}, {}
    try:
        a, b = (read_snapshot(entries[i]["path"]) for i in (first, k))
        grew = diff_snapshots(a, b)
        peak = peak_by_site(b, since_s=entries[k].get("t_start"))
    except MemSnapshotError as exc:
        return conform("memory_sites", pd.DataFrame()), {**res, "status": f"unreadable: {exc}"}, {}

    def row(kind: str, frm: int, g: Any, blocks: Any, mib: Any) -> dict[str, Any]:
        site = {"site": g["site"], "library_line": g["library_line"], "in_engine": bool(g["in_engine"])}
        return {
            "launch": launch,
            "kind": kind,
            "from_index": frm,
            "to_index": k,
            **site,
            "blocks": int(blocks),
            "mib": float(mib),
        }

    rows = [
        row("grew", first, g, g["new_blocks"] - g["gone_blocks"], g["grown_mib"])
        for _, g in grew.head(params.top).iterrows()
    ]
    rows += [row("peak", k, g, g["blocks"], g["mib"]) for _, g in peak.by_site.head(params.top).iterrows()]
    res.update(
        {
            "status": "ok",
            "grew": [
                # sites that grew (one whose blocks were only replaced, same MiB, did not)
                {"site": g["site"], "grown_mib": float(g["grown_mib"])}
                for _, g in grew[grew["grown_mib"] > 0].head(3).iterrows()
            ],
            "peak_mib": peak.mib,
        }
    )
    files: dict[str, Path] = {}
    kept = []
    for i in (first, k):
        src = Path(entries[i]["path"])
        dst = src.with_name(f"memsnap-{launch}-request-{i}.pickle.gz")
        with open(src, "rb") as fi, gzip.open(dst, "wb") as fo:
            shutil.copyfileobj(fi, fo)
        size = dst.stat().st_size / 2**20
        if size <= params.max_file_mib:
            files[dst.name] = dst
            kept.append(dst.name)
        else:
            log.warning(
                "snapshot %s is %.1f MiB, over the cap of %g MiB: not kept", src, size, params.max_file_mib
            )
    res["files"] = kept
    return conform("memory_sites", pd.DataFrame(rows)), res, files


def sites_markdown(r: Mapping[str, Any]) -> str:
    """Markdown: what grew between the snapshots and where it was allocated; the status line
    when there is nothing to show (``not available on cpu``); empty when no snapshot was asked."""
    ms = r.get("memory_sites")
    if not isinstance(ms, Mapping):
        return ""
    status = ms.get("status")
    if status != "ok":
        return f"**Allocation sites** (allocator snapshots): {md_text(status)}."
    grew = [g for g in ms.get("grew") or [] if isinstance(g, Mapping) and float(g["grown_mib"]) >= 1.0]
    head = (
        f"**Allocation sites**: between the snapshot after request {ms.get('from')} (cold) and after "
        f"warm request {ms.get('to')}"
    )
    if not grew:
        return head + ", no allocation site grew by 1 MiB or more."
    items = [f"{md_text(g['site'], code=True)} {float(g['grown_mib']):+.1f} MiB" for g in grew]
    return head + " the live memory grew at: " + "; ".join(items) + "."


def top_sites_text(r: Mapping[str, Any], n: int = 2) -> str:
    """``"top allocation sites: f (file:line) +192.0 MiB"`` for a leak verdict, or the status
    (``not available on cpu``), or empty when no snapshot was asked."""
    ms = r.get("memory_sites")
    if not isinstance(ms, Mapping):
        return ""
    if ms.get("status") != "ok":
        return f"allocation sites: {ms.get('status')}"
    grew = [g for g in ms.get("grew") or [] if isinstance(g, Mapping) and float(g["grown_mib"]) >= 1.0][:n]
    if not grew:
        return "allocation sites: none grew by 1 MiB or more"
    return "top allocation sites: " + "; ".join(f"{g['site']} {float(g['grown_mib']):+.1f} MiB" for g in grew)

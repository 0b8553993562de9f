"""Profiled requests (torch.profiler traces via sglang's per-request API) in an extra launch, rows
in the ``traces`` table (docs/below-the-stage.md), and the allocation sites of what grew between
allocator snapshots (``memory_sites`` rows, :func:`collect`)."""

from __future__ import annotations

import gzip
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Any, Literal, Mapping

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfkit.bundle import ResultBundle, conform
from perfkit.common.slugs import md_text
from perfkit.engine.caps import MemoryCaps
from perfkit.engine.client import VideoRequestSpec
from perfkit.engine.spec import EngineSpec
from perfkit.measuring.launch_rows import LaunchData, measure_launch
from perfkit.readings import traces as tr
from perfkit.readings.memsnapshot import MemSnapshotError, diff_snapshots, peak_by_site, read_snapshot
from perfkit.readings.records import parse_lines

log = logging.getLogger(__name__)

#: the label of the extra launch that runs profiled requests
LAUNCH = "profiled"
#: sglang's directory variable for diffusion profiler traces
DIR_VARIABLE = "SGLANG_DIFFUSION_TORCH_PROFILER_DIR"
#: the roles of the extra launch's request 0 and the next (``profiled warm 2``, ...)
ROLES = {"cold": "profiled cold", "warm": "profiled warm"}
#: sglang's trace file name (``runtime/utils/profiler.py``)
MODE_IN_NAME = re.compile(r"-(full_stages|(\d+)_steps)-global-rank\d+\.trace\.json(\.gz)?$")
#: the role of request 0 in warmup_shapes' extra launch
FIRST_OF_NEW_SHAPE = "profiled first of new shape"


class ProfileParams(BaseModel):
    """``profile`` setting: ``steps`` sglang's ``num_profiled_timesteps`` (-1: all), ``warm`` warm
    requests profiled; a trace over ``max_trace_mib`` is listed, not kept."""

    model_config = ConfigDict(extra="forbid")

    requests: list[Literal["cold", "warm"]] = Field(default_factory=lambda: ["cold", "warm"], min_length=1)
    steps: int = 5
    all_stages: bool = False
    warm: int = Field(1, ge=1, le=9)
    max_trace_mib: float = Field(64.0, gt=0)

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: int) -> int:
        # 1000: the reference engine's MAX_PROFILED_STEPS (refengine.profiling)
        if v != -1 and not 1 <= v <= 1000:
            raise ValueError(
                f"steps must be -1 (all) or between 1 and 1000 (sglang's num_profiled_timesteps), got {v}"
            )
        return v

    def fields(self) -> dict[str, Any]:
        """sglang's request fields for a profiled request."""
        return {
            "profile": True,
            "num_profiled_timesteps": self.steps,
            "profile_all_stages": self.all_stages,
        }


def profile_requests(
    request: VideoRequestSpec, profile: ProfileParams, first_role: str = ROLES["cold"]
) -> list[tuple[str | None, VideoRequestSpec]]:
    """The extra launch's (role or None when not profiled, request): cold, then warm ones."""
    extra = {**request.extra, **profile.fields()}
    profiled = VideoRequestSpec(**{**request.__dict__, "extra": extra})
    out: list[tuple[str | None, VideoRequestSpec]] = [
        (first_role, profiled) if "cold" in profile.requests else (None, request)
    ]
    if "warm" in profile.requests:
        out += [(ROLES["warm"] + (f" {k}" if k > 1 else ""), profiled) for k in range(1, profile.warm + 1)]
    return out


def run_profiled(
    spec: EngineSpec,
    request: VideoRequestSpec,
    profile: ProfileParams,
    run_dir: Path,
    caps: MemoryCaps | None = None,
    label: str = LAUNCH,
    first_role: str = ROLES["cold"],
) -> tuple[pd.DataFrame, dict[str, Path]]:
    """Run the extra launch and collect its traces. Returns the ``traces`` table (a row per
    profiled request, failed ones too) and ``{file name: path}`` of the traces to keep."""
    tdir = (Path(run_dir) / f"{label}-traces").resolve()
    tdir.mkdir(parents=True, exist_ok=True)
    env = {**spec.env, DIR_VARIABLE: str(tdir)}
    plan = profile_requests(request, profile, first_role)
    data = measure_launch(spec.replace(env=env), [r for _, r in plan], Path(run_dir), label, caps=caps)
    recs = {r.request_id: r for r in data.report.records}
    rows, files = [], {}
    for i, (role, _req) in enumerate(plan):
        if role is None:
            continue
        out = data.outcomes[i] if i < len(data.outcomes) else None
        rec = recs.get(out.request_id) if out is not None and out.request_id else None
        pk = rec.perfkit if rec is not None else {}
        prof = pk.get("profile") or {}
        row: dict[str, Any] = {
            "launch": label,
            "request_id": out.request_id if out is not None else None,
            "index": i,
            "role": role,
            "status": out.status if out is not None else "not sent",
            "mode": prof.get("mode"),
            "steps_recorded": prof.get("steps_recorded"),
            "stages": "; ".join(n for n, _ in rec.stages) if rec is not None and rec.stages else None,
            "kept": False,
            "e2e_ms": math.nan if rec is None or rec.total_duration_ms is None else rec.total_duration_ms,
            "injected_ms": sum(injected.values())
            if (injected := pk.get("debug_stage_delay_wall_ms"))
            else math.nan,
        }
        # the trace the record names, else the one sglang's file name finds
        rid = out.request_id if out is not None else None
        found = sorted(tdir.glob(f"{rid}-*-global-rank0.trace.json*")) if rid else []
        named = prof.get("path")
        path = Path(named) if named and Path(named).is_file() else next(iter(found), None)
        if out is None or not out.ok:
            row["note"] = (out.error if out is not None else data.error) or "the request did not complete"
        elif path is None:
            row["note"] = prof.get("error") or (
                "the engine wrote no trace (does it implement sglang's profile field?)"
            )
        else:
            size = path.stat().st_size / 2**20
            row["size_mib"] = size
            if size > profile.max_trace_mib:
                row["note"] = (
                    f"trace {size:.1f} MiB is over the cap of {profile.max_trace_mib:g} MiB: not kept"
                )
            else:
                row["kept"] = True
                row["file"] = f"traces/{path.name}"
                files[path.name] = path
            row.update(_steps_of(path, row["mode"], row["steps_recorded"]))
        rows.append(row)
    if data.error:
        log.warning("profiled launch: %s", data.error)
    return conform("traces", pd.DataFrame(rows)), files


def _steps_of(path: Path, mode: str | None, recorded: int | None) -> dict[str, Any]:
    """``mode``, ``steps_asked``, ``steps_recorded``: from the record, else from the file."""
    m = MODE_IN_NAME.search(path.name)
    mode = mode or (m.group(1) if m else None)
    n = re.fullmatch(r"(\d+)_steps", mode or "")
    out: dict[str, Any] = {"mode": mode, "steps_asked": int(n.group(1)) if n else None}
    if recorded is None and n:
        try:
            recorded = len(tr.step_ranges(tr.load_trace(path)))
        except tr.TraceError as exc:
            log.warning("profiled: %s", exc)
    out["steps_recorded"] = recorded
    return out


def attach(bundle: ResultBundle, table: pd.DataFrame, files: dict[str, Path]) -> ResultBundle:
    """Put the ``traces`` table and the trace files into ``bundle`` (returned)."""
    bundle.tables["traces"] = table
    bundle.traces.update(files)
    return bundle


NOT_ON_CPU = "not available on cpu"


class SnapshotParams(BaseModel):
    """``snapshot`` setting: allocator snapshots after the cold and warm request ``warm`` (None:
    the last); ``max_entries`` history kept; ``top`` sites kept; over ``max_file_mib``: not kept."""

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
    """``spec`` with the snapshot flags set, and None; or ``spec`` unchanged and why not."""
    if spec.kind != "reference":
        return (
            spec,
            f"not available for engine kind {spec.kind!r} (the reference engine's --memory-snapshot-after)",
        )
    return spec.replace(
        memory_snapshot_after=params.indices(repeats), memory_snapshot_entries=params.max_entries
    ), None


def collect(
    data: LaunchData, params: SnapshotParams, repeats: int, why_not: str | None = None
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Path]]:
    """Read and compare the snapshots ``data``'s records name (``why_not``: none, the status).
    Returns (``memory_sites`` table, results entry: ``status``, ``from``, ``to``, ``grew``,
    ``peak_mib``, bundle files ``name -> path``)."""
    launch = data.label
    entries = {
        snap["request_index"]: {**snap, "t_start": r.perfkit.get("t_start")}
        for r in (data.report or parse_lines(data.record_lines)).records
        if isinstance(snap := r.perfkit.get("memory_snapshot"), dict)
        and isinstance(snap.get("request_index"), int)
    }
    first, k = params.indices(repeats)
    res: dict[str, Any] = {"from": first, "to": k, "grew": [], "peak_mib": None}
    errors = [e["error"] for e in entries.values() if e.get("error")]
    missing = [i for i in (first, k) if not entries.get(i, {}).get("path")]
    if why_not or NOT_ON_CPU in errors or missing:
        why = "; ".join(errors) or f"no snapshot named in the records for request(s) {missing}"
        status = why_not or (NOT_ON_CPU if NOT_ON_CPU in errors else f"no snapshot: {why}")
        return conform("memory_sites", pd.DataFrame()), {**res, "status": status}, {}
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
    """Markdown: where the memory grew between the snapshots, or the status; "" when not asked."""
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
    """``"top allocation sites: f (file:line) +192.0 MiB"``, or the status; "" when not asked."""
    ms = r.get("memory_sites")
    if not isinstance(ms, Mapping):
        return ""
    if ms.get("status") != "ok":
        return f"allocation sites: {ms.get('status')}"
    grew = [g for g in ms.get("grew") or [] if isinstance(g, Mapping) and float(g["grown_mib"]) >= 1.0][:n]
    if not grew:
        return "allocation sites: none grew by 1 MiB or more"
    return "top allocation sites: " + "; ".join(f"{g['site']} {float(g['grown_mib']):+.1f} MiB" for g in grew)

"""What warmup_shapes computes per (warmup setting, request shape) from a measured launch: the
shapes the warmup ran, the ``coverage`` entries (ms, MiB), per-rank facts, the warm medians
across warmup settings (docs/DESIGN.md, "covered shape")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.bundle import WARMUP_INDEX
from perfkit.checks import is_reported, number, reported_any, reported_count, reported_sum
from perfkit.common.frames import latent_frames
from perfkit.common.numfmt import json_float
from perfkit.engine.handle import WarmupShape, parse_warmup_shapes
from perfkit.investigations.common import first_vs_warm, warm_stage_medians
from perfkit.measuring.launch_rows import LaunchData
from perfkit.readings.records import PerfRecord, parse_lines

RECORD, ENGINE_LOG = "record", "engine log"


@dataclass(frozen=True)
class Warmed:
    """The shapes one launch's startup warmup ran, from its record (``latent_shape``), the engine
    log's warmup lines (``shapes``) or neither (None: nothing is covered)."""

    source: str | None
    latent_shape: str | None = None
    shapes: tuple[WarmupShape, ...] = ()

    def covers(self, latent_shape: Any, width: int | None, height: int | None, frames: int) -> bool | None:
        """Whether a request ran a warmed latent shape (engine log: by width, height and LTX
        latent frames); None when its width or height is the engine's default."""
        if self.source == RECORD:
            return bool(latent_shape is not None and latent_shape == self.latent_shape)
        if self.source == ENGINE_LOG:
            if width is None or height is None:
                return None
            want = (int(width), int(height), latent_frames(int(frames)))
            return any((s.width, s.height, s.latent_frames) == want for s in self.shapes)
        return False


def warmed_shapes(requests: pd.DataFrame, logs: Mapping[str, str]) -> Warmed:
    """The startup warmup's shapes for one launch: its warmup record's, else every ``server
    warmup req`` line in its engine ``logs`` (sglang 0.5.23 writes no warmup record)."""
    if not requests.empty:
        rec = requests[requests["index"] == WARMUP_INDEX]["latent_shape"].dropna()
        if not rec.empty:
            return Warmed(RECORD, latent_shape=rec.iloc[0])
    shapes: list[WarmupShape] = []
    for text in logs.values():
        shapes += [s for s in parse_warmup_shapes(text) if s not in shapes]
    return Warmed(ENGINE_LOG, shapes=tuple(shapes)) if shapes else Warmed(None)


def coverage_entry(
    data: LaunchData,
    ok: pd.DataFrame,
    stages: pd.DataFrame,
    warmed: Warmed,
    w: int,
    f: int,
    first_index: int,
    width: int | None = None,
    height: int | None = None,
) -> dict[str, Any]:
    """One ``coverage`` entry (docs/suite.md, "Results"): request shape ``f`` frames after warmup
    ``w`` frames, from its completed rows ``ok`` (the first at ``first_index``, then the warm)."""
    entry: dict[str, Any] = {
        "warmup_frames": int(w),
        "request_frames": int(f),
        "warmup_latent_frames": latent_frames(w) if w > 0 else 0,
        "request_latent_frames": latent_frames(f),
        "warmup_source": warmed.source,
        "error": data.error,
    }
    if warmed.source == ENGINE_LOG:
        keys = ("width", "height", "num_frames", "latent_frames")
        entry["warmed_shapes"] = [{k: getattr(s, k) for k in keys} for s in warmed.shapes]
    if len(ok) < 2 or ok["index"].iloc[0] != first_index:
        entry.update(dict.fromkeys(("covered", "first_ms", "warm_median_ms", "penalty_ms", "ratio")))
        entry.update(ratio_ci=[None, None], compiles=None, penalty_stage=None)
        return entry
    first, warm, wmed, pen, penalty_stage = first_vs_warm(ok, stages)
    shape = ok["latent_shape"].iloc[0]
    entry.update(
        {
            "covered": warmed.covers(shape, width, height, f),
            "request_latent_shape": shape,
            "warmup_latent_shape": warmed.latent_shape,
            "first_ms": first,
            "warm_median_ms": wmed,
            "penalty_ms": first - wmed,
            "ratio": first / wmed,
            "ratio_lower": first / float(np.max(warm)),
            "ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci([first], warm)],
            "compiles": reported_sum(ok["compiles"], count=True),
            "compile_ms": reported_sum(ok["compile_ms"]),
            "first_compiles": reported_count(ok["compiles"].iloc[0]),
            "recompile_reasons": (
                [r for r in ok["recompile_reasons"] if is_reported(r) and r]
                if any(is_reported(r) for r in ok["recompile_reasons"])
                else None
            ),
            "recompile_limit_hit": reported_any(ok["recompile_limit_hit"]),
            "penalty_stage": penalty_stage,
            "penalty_by_stage_ms": pen,
            "warm_ms": [json_float(v) for v in warm],
            "warm_stage_median_ms": {
                str(k): json_float(v)
                for k, v in warm_stage_medians(stages, ok["request_id"].iloc[1:]).items()
            },
        }
    )
    report = data.report or parse_lines(data.record_lines)
    ranks = _rank_facts(report.records, list(ok["request_id"]))
    if ranks:
        entry["ranks"] = ranks
    return entry


def _rank_facts(records: list[PerfRecord], request_ids: list[str]) -> list[dict[str, Any]]:
    """Per rank of a CFG-parallel engine, one shape's first-request penalty and warm step parts (ms, MiB); [] for one rank."""
    recs = {r.request_id: r for r in records}
    chosen = [recs[i] for i in request_ids if i in recs]
    if len(chosen) < 2 or not chosen[0].perfkit.get("ranks"):
        return []
    out = []
    for k, first in enumerate(chosen[0].perfkit["ranks"]):
        warm = [r.perfkit["ranks"][k] for r in chosen[1:] if len(r.perfkit.get("ranks") or []) > k]

        def stage_ms(rep: dict) -> dict[str, float]:
            return {s["name"]: float(s["execution_time_ms"]) for s in rep.get("stages") or []}

        first_st = stage_ms(first)
        warm_st = [stage_ms(w) for w in warm]
        pen = {
            name: ms - float(np.median([w[name] for w in warm_st if name in w]))
            for name, ms in first_st.items()
            if any(name in w for w in warm_st)
        }

        def med(key: str) -> float | None:
            vals = [v for w in warm for v in (w.get(key) or [])]
            return json_float(float(np.median(vals))) if vals else None

        warm_compiles = [_count(w.get("compiles")) for w in warm]
        peaks = [v for v in (number(r.get("peak_reserved_mb")) for r in [first, *warm]) if v is not None]
        out.append(
            {
                "rank": first.get("rank", k),
                "device": first.get("device"),
                "first_compiles": _count(first.get("compiles")),
                "warm_compiles": sum(warm_compiles) if None not in warm_compiles else None,
                "first_recompile_reasons": (
                    list(first["recompile_reasons"]) if first.get("recompile_reasons") is not None else None
                ),
                "penalty_by_stage_ms": {n: json_float(v) for n, v in pen.items()},
                "penalty_stage": max(pen, key=pen.get) if pen else None,
                "warm_step_median_ms": med("steps"),
                "warm_refinement_step_median_ms": med("refinement_steps"),
                "warm_compute_median_ms": med("cfg_compute_ms"),
                "warm_gather_median_ms": med("cfg_gather_ms"),
                "peak_reserved_mib": json_float(max(peaks, default=None)),
            }
        )
    return out


def _count(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def warm_across_warmups(coverage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per request shape measured after several warmup settings: each later setting's warm
    median over the first's, with a 95 % bootstrap interval, and per stage (medians only)."""
    out = []
    by_frames: dict[int, list[dict[str, Any]]] = {}
    for c in coverage:
        if c.get("warm_ms"):
            by_frames.setdefault(int(c["request_frames"]), []).append(c)
    for frames, entries in by_frames.items():
        if len(entries) < 2:
            continue
        ref = entries[0]
        for other in entries[1:]:
            a = [v for v in other["warm_ms"] if v is not None]
            b = [v for v in ref["warm_ms"] if v is not None]
            lo, hi = stats.bootstrap_ratio_ci(a, b)
            st_a, st_b = other.get("warm_stage_median_ms") or {}, ref.get("warm_stage_median_ms") or {}
            out.append(
                {
                    "request_frames": frames,
                    "warmup_frames": other["warmup_frames"],
                    "vs_warmup_frames": ref["warmup_frames"],
                    "warm_median_ms": json_float(float(np.median(a))),
                    "vs_warm_median_ms": json_float(float(np.median(b))),
                    "ratio": json_float(float(np.median(a)) / float(np.median(b))),
                    "ratio_ci": [json_float(lo), json_float(hi)],
                    "n": [len(a), len(b)],
                    "stage_ratio": {
                        k: json_float(st_a[k] / st_b[k])
                        for k in st_a
                        if st_b.get(k) and st_a.get(k) is not None
                    },
                }
            )
    return out

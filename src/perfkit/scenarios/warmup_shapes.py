"""Warmup shapes: does the server's startup warmup cover the shapes users send?

A 17-frame warmup gives 3 latent frames; a 25-frame request gives 4, so its first call pays shape
setup (recompilation, graph capture) — seed case 003. One launch per warmup setting, each with
fresh compile caches; for each request shape: first-request latency vs the warm median, compiles
in the measured window, covered or not (same latent shape as the warmup run).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.client import VideoRequestSpec
from perfkit.engine import EngineSpec
from perfkit.frames import latent_frames
from perfkit.scenarios.common import assemble, json_float, measure_launch, reuse_launch, stage_penalty

log = logging.getLogger(__name__)


def warmup_shapes(spec: EngineSpec, warmup_frames: list[int] = (17, 25), request_frames: list[int] = (25,),
                  repeats: int = 3, request: VideoRequestSpec | dict | None = None,
                  run_dir: str | Path = "outputs/warmup_shapes", sample_interval_s: float = 0.1,
                  reuse: Any = None) -> ResultBundle:
    """Run the warmup-shapes investigation.

    Args:
        spec: the engine (its ``warmup_frames`` is replaced per launch).
        warmup_frames: startup warmup settings, one launch each.
        request_frames: request num_frames to probe; each is sent ``repeats`` times in a row.
        repeats: requests per shape (>= 2: the first and at least one warm).
        request: other request fields (resolution, steps, prompt).
        reuse: a cold_warm ResultBundle of this run; a warmup setting whose launch it already
            measured (same spec and warmup, one request shape equal to its request, at least
            ``repeats`` requests) takes that session's first requests instead of launching again
            (:func:`perfkit.scenarios.common.reuse_launch`; results ``reused_launches``).

    Returns:
        ResultBundle ``warmup_shapes``; results ``coverage`` is a list with one entry per
        (warmup setting, request shape): ``covered`` (the warmup record's latent shape equals the
        request's), ``first_ms``, ``warm_median_ms``, ``penalty_ms``, ``ratio`` (first / warm
        median) with ``ratio_ci`` (95 % bootstrap), ``compiles`` and ``compile_ms`` inside the
        measured window, ``penalty_stage``, and ``recompile_reasons``.

    Raises:
        ValueError: repeats < 2 or an empty setting list.
    """
    if repeats < 2:
        raise ValueError(f"warmup_shapes: repeats must be >= 2, got {repeats}")
    if not warmup_frames or not request_frames:
        raise ValueError("warmup_shapes: warmup_frames and request_frames must not be empty")
    base = request if isinstance(request, VideoRequestSpec) else VideoRequestSpec.from_dict(request or {})
    launches = []
    reused: list[str] = []
    coverage: list[dict[str, Any]] = []
    for w in warmup_frames:
        s = dataclasses.replace(spec, warmup_frames=int(w), share_compile_cache=False)
        reqs = [dataclasses.replace(base, num_frames=int(f)) for f in request_frames for _ in range(repeats)]
        data = None
        if reuse is not None and len(request_frames) == 1:
            data = reuse_launch(reuse, s, reqs[0], repeats, f"warmup{w}")
            if data is not None:
                reused.append(f"warmup{w}")
        if data is None:
            data = measure_launch(s, reqs, Path(run_dir), f"warmup{w}", sample_interval_s=sample_interval_s)
        launches.append(data)
        df = pd.DataFrame(data.requests)
        warm_rec = df[df["index"] < 0] if not df.empty else df
        warm_shape = warm_rec["latent_shape"].iloc[0] if not warm_rec.empty else None
        stages = pd.DataFrame(data.stages)
        for j, f in enumerate(request_frames):
            idx = list(range(j * repeats, (j + 1) * repeats))
            rows = df[df["index"].isin(idx)].sort_values("index") if not df.empty else df
            ok = rows[rows["status"] == "completed"] if not rows.empty else rows
            entry: dict[str, Any] = {"warmup_frames": int(w), "request_frames": int(f),
                                     "warmup_latent_frames": latent_frames(w) if w > 0 else 0,
                                     "request_latent_frames": latent_frames(f), "error": data.error}
            if len(ok) < 2 or ok["index"].iloc[0] != idx[0]:
                entry.update({"covered": None, "first_ms": None, "warm_median_ms": None, "penalty_ms": None,
                              "ratio": None, "ratio_ci": [None, None], "compiles": None, "penalty_stage": None})
                coverage.append(entry)
                continue
            first = float(ok["e2e_ms"].iloc[0])
            warm = ok["e2e_ms"].iloc[1:].to_numpy(float)
            wmed = float(np.median(warm))
            shape = ok["latent_shape"].iloc[0]
            pen = stage_penalty(stages, ok["request_id"].iloc[0], list(ok["request_id"].iloc[1:]))
            finite = {k: v for k, v in pen.items() if not math.isnan(v)}
            entry.update({
                "covered": bool(warm_shape is not None and shape == warm_shape),
                "request_latent_shape": shape, "warmup_latent_shape": warm_shape,
                "first_ms": first, "warm_median_ms": wmed, "penalty_ms": first - wmed,
                "ratio": first / wmed, "ratio_ci": [json_float(v) for v in stats.bootstrap_ratio_ci([first], warm)],
                "compiles": int(ok["compiles"].sum()), "compile_ms": float(ok["compile_ms"].sum()),
                "first_compiles": int(ok["compiles"].iloc[0]),
                "recompile_reasons": [r for r in ok["recompile_reasons"] if r],
                "recompile_limit_hit": bool(ok["recompile_limit_hit"].any()),
                "penalty_stage": max(finite, key=finite.get) if finite else None,
                "penalty_by_stage_ms": {k: json_float(v) for k, v in pen.items()},
            })
            coverage.append(entry)
    params = {"spec": spec.to_dict(), "warmup_frames": list(map(int, warmup_frames)),
              "request_frames": list(map(int, request_frames)), "repeats": repeats, "request": base.payload()}
    return assemble("warmup_shapes", launches, params, {"coverage": coverage, "reused_launches": reused})

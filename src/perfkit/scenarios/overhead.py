"""The cost of perfkit's own instrumentation, measured inside one engine session.

Two A/B comparisons on warm requests of the same shape, interleaved (ABBA order) so drift hits
both sides equally, each judged on the server's end-to-end time (``total_duration_ms``):

- stage timing: device synchronised and clock read at every stage and step boundary (on) vs
  one synchronisation at the end (off; request field ``perfkit_stage_timing: false``);
- the memory sampler: a MemorySampler polling NVML and /proc every ``interval_s`` (on) vs none.

Overhead = median(on) / median(off) - 1 (target: under 1 % of e2e on a GPU, 2 % for timing).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from perfkit import stats
from perfkit.client import VideoClient, VideoRequestSpec
from perfkit.scenarios.common import json_float

log = logging.getLogger(__name__)


def _summary(on: list[float], off: list[float]) -> dict[str, Any]:
    if not on or not off:
        return {"n_on": len(on), "n_off": len(off), "overhead": None}
    ratio_ci = stats.bootstrap_ratio_ci(on, off)
    mw = stats.mann_whitney(on, off)
    return {"n_on": len(on), "n_off": len(off), "median_on_ms": float(np.median(on)),
            "median_off_ms": float(np.median(off)), "overhead": float(np.median(on) / np.median(off) - 1),
            "overhead_ci": [json_float(ratio_ci[0] - 1), json_float(ratio_ci[1] - 1)],
            "mann_whitney_p": json_float(mw.get("pvalue")), "on_ms": on, "off_ms": off}


def overhead_probe(request: VideoRequestSpec, pairs: int = 10, sampler_interval_s: float = 0.1,
                   warmup: int = 1) -> Callable[[Any, VideoClient, Any], dict[str, Any]]:
    """An ``after`` hook for :func:`perfkit.scenarios.common.measure_launch`.

    Returns a dict ``{"stage_timing": {...}, "sampler": {...}, "request_ids": [...]}`` where each
    part has median_on_ms, median_off_ms, overhead (fraction), overhead_ci and the samples (ms).
    """

    def run(handle, client: VideoClient, sampler) -> dict[str, Any]:
        ids: list[str] = []

        def e2e(spec: VideoRequestSpec) -> float | None:
            out = client.generate(spec)
            ids.append(out.request_id)
            if not out.ok or out.record is None or out.record.total_duration_ms is None:
                log.warning("overhead probe request failed: %s", out.error)
                return None
            return out.record.total_duration_ms

        timed = request
        untimed = dataclasses.replace(request, extra={**request.extra, "perfkit_stage_timing": False})
        for _ in range(warmup):
            e2e(timed)
        on, off = [], []
        for i in range(pairs):
            for flag in ((True, False) if i % 2 == 0 else (False, True)):
                v = e2e(timed if flag else untimed)
                if v is not None:
                    (on if flag else off).append(v)
        sampler.stop()
        s_on, s_off = [], []
        for i in range(pairs):
            for flag in ((True, False) if i % 2 == 0 else (False, True)):
                probe = handle.sampler(interval_s=sampler_interval_s) if flag else None
                if probe is not None:
                    probe.start()
                v = e2e(timed)
                if probe is not None:
                    probe.stop()
                if v is not None:
                    (s_on if flag else s_off).append(v)
        return {"stage_timing": _summary(on, off), "sampler": _summary(s_on, s_off),
                "sampler_interval_s": sampler_interval_s, "request_ids": ids}

    return run

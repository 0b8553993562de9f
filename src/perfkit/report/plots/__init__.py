"""Matplotlib figures, one module per family (:mod:`.base`: shared helpers and colours), re-exported
here with the request roles; each takes a bundle's DataFrames and returns a pyplot-free Figure."""

from __future__ import annotations

from perfkit.report.plots.base import (
    COLD_COLOR,
    OTHER_STAGE_COLORS,
    STAGE_CLASS_COLORS,
    STAGE_ORDER,
    alt_text,
    figure_to_png_bytes,
    launch_names,
    stage_colors,
)
from perfkit.report.plots.baseline import AB_DECISION_COLORS, STATUS_COLORS, ab_forest, baseline_vs_actual
from perfkit.report.plots.concurrency import (
    latency_vs_concurrency,
    memory_under_concurrency,
    offload_memory_latency,
    queue_vs_service,
)
from perfkit.report.plots.stages import coverage_heatmap, stage_breakdown
from perfkit.report.plots.steps import e2e_per_request, step_timeline, step_times
from perfkit.report.plots.timeline import memory_timeline
from perfkit.roles import ROLE_COLD, ROLE_NEW_SHAPE, ROLE_WARM, ROLE_WARMUP, request_label, request_roles

__all__ = [
    "AB_DECISION_COLORS",
    "COLD_COLOR",
    "OTHER_STAGE_COLORS",
    "ROLE_COLD",
    "ROLE_NEW_SHAPE",
    "ROLE_WARM",
    "ROLE_WARMUP",
    "STAGE_CLASS_COLORS",
    "STAGE_ORDER",
    "STATUS_COLORS",
    "ab_forest",
    "alt_text",
    "baseline_vs_actual",
    "coverage_heatmap",
    "e2e_per_request",
    "figure_to_png_bytes",
    "latency_vs_concurrency",
    "launch_names",
    "memory_timeline",
    "memory_under_concurrency",
    "offload_memory_latency",
    "queue_vs_service",
    "request_label",
    "request_roles",
    "stage_breakdown",
    "stage_colors",
    "step_timeline",
    "step_times",
]

"""Matplotlib figures for perfkit bundles: one module per kind of figure, each function takes a
:class:`perfkit.bundle.ResultBundle`'s DataFrames (:mod:`perfkit.bundle_schema`: ms, MiB,
``t*_s`` epoch seconds) and returns a pyplot-free :class:`matplotlib.figure.Figure` (any
backend, no global figure list, nothing to close; matplotlib is imported only when one is
drawn, :func:`perfkit.report.plots.base.new_figure`). Show one with ``display(fig)``;
:func:`figure_to_png_bytes` renders it for reports.

:mod:`.stages` (:func:`stage_breakdown`), :mod:`.e2e` (:func:`e2e_per_request`),
:mod:`.steps` (:func:`step_times`, :func:`step_timeline`), :mod:`.timeline`
(:func:`memory_timeline`), :mod:`.coverage` (:func:`coverage_heatmap`), :mod:`.baseline`
(:func:`baseline_vs_actual`), :mod:`.offload` (:func:`offload_memory_latency`), :mod:`.ab`
(:func:`ab_forest`), :mod:`.concurrency` (:func:`latency_vs_concurrency`,
:func:`queue_vs_service`, :func:`memory_under_concurrency`); :mod:`.base` and :mod:`.style`
are shared. A new kind of figure gets a module here, its names re-exported below. Request
roles (:func:`request_roles`, ``ROLE_*``) are :mod:`perfkit.roles`', re-exported for notebooks.
"""

from __future__ import annotations

from perfkit.report.plots.ab import AB_DECISION_COLORS, ab_forest
from perfkit.report.plots.base import alt_text, figure_to_png_bytes, launch_names
from perfkit.report.plots.baseline import STATUS_COLORS, baseline_vs_actual
from perfkit.report.plots.concurrency import (
    latency_vs_concurrency,
    memory_under_concurrency,
    queue_vs_service,
)
from perfkit.report.plots.coverage import coverage_heatmap
from perfkit.report.plots.e2e import e2e_per_request
from perfkit.report.plots.offload import offload_memory_latency
from perfkit.report.plots.stages import stage_breakdown
from perfkit.report.plots.steps import step_timeline, step_times
from perfkit.report.plots.style import (
    COLD_COLOR,
    OTHER_STAGE_COLORS,
    STAGE_CLASS_COLORS,
    STAGE_ORDER,
    stage_colors,
)
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

"""Matplotlib figures for perfkit bundles: one module per kind of figure, each function returns a Figure.

Every function takes the DataFrames of a :class:`perfkit.bundle.ResultBundle` (columns as in
:mod:`perfkit.bundle_schema`: times in ms, memory in MiB, ``t*_s`` in epoch seconds) and returns a
:class:`matplotlib.figure.Figure`. Nothing here calls ``plt.show``; figures are built with
``matplotlib.figure.Figure`` directly, not through pyplot, so they work under any backend
(Agg included), are not kept alive by pyplot's global figure list (no leak in long loops,
no double display in Jupyter when a cell returns one) and need no closing; ``plt.close(fig)``
on them is a harmless no-op. In a notebook, show one with ``display(fig)`` or by returning
it as the cell's value; :func:`figure_to_png_bytes` renders one to PNG for reports.
matplotlib itself is imported when a figure is drawn
(:func:`perfkit.report.plots.base.new_figure`), not when this package is: a notebook or report
that draws nothing never pays for it (0.2-0.5 s of CPU).

The modules, by what they draw:

- :mod:`.stages`: :func:`stage_breakdown`, per-stage latency, cold vs warm median;
- :mod:`.e2e`: :func:`e2e_per_request`, end-to-end latency per request;
- :mod:`.steps`: :func:`step_times` (per denoising step) and :func:`step_timeline` (one
  profiled step's ops over time);
- :mod:`.timeline`: :func:`memory_timeline`, device and host memory since launch;
- :mod:`.coverage`: :func:`coverage_heatmap`, first-request penalty by warmup and request shape;
- :mod:`.baseline`: :func:`baseline_vs_actual`, the baseline gate's verdicts;
- :mod:`.offload`: :func:`offload_memory_latency`, memory and latency per offload mode;
- :mod:`.ab`: :func:`ab_forest`, an A/B's ratios;
- :mod:`.concurrency`: :func:`latency_vs_concurrency`, :func:`queue_vs_service` and
  :func:`memory_under_concurrency`, serving under load;
- :mod:`.base` (bundle unpacking, launch names, ms axes, PNG and alt text) and :mod:`.style`
  (colours) are shared by all of them.

A new kind of figure gets a module of its own here and its public names re-exported below.
Request roles (:func:`request_roles`, :func:`request_label`, ``ROLE_*``) are a domain idea of
the bundle layer, :mod:`perfkit.roles`; they are re-exported here for notebook code.

Words follow the design doc: cold request (index 0), warm request (index >= 1), startup
warmup (``index == WARMUP_INDEX``, -1; excluded by default), first-request penalty, covered
shape; stage names are sglang's.
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

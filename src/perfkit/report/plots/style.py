"""Colours shared by the figures of :mod:`perfkit.report.plots`: stages by class
(:data:`STAGE_CLASS_COLORS`, :func:`stage_colors`) and the cold request (:data:`COLD_COLOR`)."""

from __future__ import annotations

from typing import Any

from perfkit.readings import stages as _stages

#: Pipeline stage order (:data:`perfkit.readings.stages.PIPELINE_ORDER`: the reference engine's and
#: sglang's stage names, LTX-2 included); stages not listed are drawn after these, in order of
#: appearance.
STAGE_ORDER = _stages.PIPELINE_ORDER

#: Stage colours by class (:func:`perfkit.readings.stages.stage_class`): denoising in blues, refinement in
#: purples, decoding in greens (the n-th stage of a class in one figure takes the n-th shade),
#: every other stage from :data:`OTHER_STAGE_COLORS` in pipeline order.
STAGE_CLASS_COLORS = {
    _stages.DENOISING: ("tab:blue", "#6baed6", "#08519c", "#c6dbef"),
    _stages.REFINEMENT: ("tab:purple", "#9e9ac8", "#54278f", "#dadaeb"),
    _stages.DECODING: ("tab:green", "#74c476", "#006d2c", "#c7e9c0"),
}
OTHER_STAGE_COLORS = (
    "tab:orange",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
    "#ffbb78",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#c7c7c7",
)


#: Colour of the cold request (index 0) in every figure.
COLD_COLOR = "tab:red"


def stage_colors(stage_cols: list[str]) -> dict[str, Any]:
    """Stage -> colour: by stage class (see :data:`STAGE_CLASS_COLORS`)."""
    out: dict[str, Any] = {}
    used = {c: 0 for c in STAGE_CLASS_COLORS}
    j = 0
    for s in stage_cols:
        cls = _stages.stage_class(s)
        if cls in STAGE_CLASS_COLORS:
            shades = STAGE_CLASS_COLORS[cls]
            out[s] = shades[used[cls] % len(shades)]
            used[cls] += 1
        else:
            out[s] = OTHER_STAGE_COLORS[j % len(OTHER_STAGE_COLORS)]
            j += 1
    return out

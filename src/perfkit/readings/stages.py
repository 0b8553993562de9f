"""Stage classes (:func:`stage_class`: denoising, refinement, decoding, other) and pipeline order;
the substring rules and their sources: docs/sglang.md, "Readers"."""

from __future__ import annotations

from typing import Iterable

DENOISING = "denoising"
REFINEMENT = "refinement"
DECODING = "decoding"
OTHER = "other"

#: pipeline order for plots: the reference engine's stages interleaved with sglang's (LTX-2 too)
PIPELINE_ORDER = tuple(
    (
        "InputValidationStage TextEncodingStage LTX2TextConnectorStage LTX2DurationStage "
        "ConditioningStage LTX2HalveResolutionStage LTX2LoRASwitchStage LTX2SigmaPreparationStage "
        "TimestepPreparationStage LatentPreparationStage LTX2AVLatentPreparationStage ImageEncodingStage "
        "ImageVAEEncodingStage LTX2ImageEncodingStage DenoisingStage LTX2DenoisingStage "
        "LTX2AVDenoisingStage UpsampleStage LTX2UpsampleStage ltx2_lora_switch_stage2 "
        "ltx2_image_encoding_stage2 RefinementStage LTX2RefinementStage DecodingStage LTX2AVDecodingStage"
    ).split()
)

#: every stage name the reference engine and sglang 0.5.23 write (``ab`` suggests from these)
KNOWN_STAGES = (*PIPELINE_ORDER, "DmdDenoisingStage", "CausalDMDDenoisingStage", "CausalVaeDecodingStage")

#: stage class -> the baseline gate's class (``perfkit.gate.baseline.classify_stage``).
BASELINE_CLASS = {DENOISING: "denoise", REFINEMENT: "denoise", DECODING: "decoding", OTHER: "non_denoise"}


def stage_class(name: str) -> str:
    """``denoising``, ``refinement``, ``decoding`` or ``other`` for a stage name, by substrings."""
    low = str(name).lower()
    if "decod" in low:
        return DECODING
    if "refine" in low:
        return REFINEMENT
    if "beforedenois" in low or "preparation" in low:
        return OTHER
    if "denois" in low:
        return DENOISING
    return OTHER


def baseline_class(name: str) -> str:
    """The baseline gate's class: ``denoise`` (with refinement), ``decoding`` or ``non_denoise``."""
    return BASELINE_CLASS[stage_class(name)]


def order_stages(names: Iterable[str]) -> list[str]:
    """Distinct names in :data:`PIPELINE_ORDER`, unlisted ones after them as they appear."""
    seen = list(dict.fromkeys(str(n) for n in names))
    rank = {s: i for i, s in enumerate(PIPELINE_ORDER)}
    known = sorted((s for s in seen if s in rank), key=rank.__getitem__)
    return known + [s for s in seen if s not in rank]


def denoising_stage(names: Iterable[str]) -> str | None:
    """The first stage classed ``denoising`` among ``names`` (pipeline order), or None."""
    return next((s for s in order_stages(names) if stage_class(s) == DENOISING), None)

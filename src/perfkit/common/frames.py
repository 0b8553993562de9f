"""LTX frame math (its VAE compresses time by 8 with a causal first frame: ``8k + 1`` frames),
and the reference engine's presets and request limits, for validating params without torch."""

from __future__ import annotations

TEMPORAL_COMPRESSION = 8
#: the reference engine's presets (:data:`perfkit.refengine.models.PRESETS` checks it has these)
PRESET_NAMES = ("tiny", "ltx-2b")
#: the reference engine answers 400 to a height/width not a multiple of this (pixels)
PIXEL_MULTIPLE = 32
#: the reference engine's default ``--max-frames`` (requests above it get a 400)
MAX_FRAMES = 257


def align_frames(num_frames: int, temporal: int = TEMPORAL_COMPRESSION) -> int:
    """Round ``num_frames`` up to the next ``temporal*k + 1`` (24 -> 25); ValueError below 1."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    k = -(-(num_frames - 1) // temporal)
    return temporal * k + 1


def latent_frames(num_frames: int, temporal: int = TEMPORAL_COMPRESSION) -> int:
    """Latent frames of ``num_frames`` once aligned (17 -> 3, 25 -> 4)."""
    return (align_frames(num_frames, temporal) - 1) // temporal + 1

"""LTX frame math, and the reference engine's presets and request limits, for validating params
without importing torch (:mod:`perfkit.refengine.models` checks at import that its presets have
exactly :data:`PRESET_NAMES`).

Source: LTX-Video's VAE compresses time by 8 with a causal first frame, so the pipeline accepts
``8k + 1`` frames and yields ``(num_frames - 1) // 8 + 1`` latent frames (17 -> 3, 25 -> 4).
"""

from __future__ import annotations

TEMPORAL_COMPRESSION = 8
#: ``tiny``: 2 CPU cores, 64x64, 4 steps. ``ltx-2b``: diffusers' LTX-Video transformer
#: (~1.9 B parameters), full VAE, T5-XXL-shaped encoder (13.5 GiB bf16).
PRESET_NAMES = ("tiny", "ltx-2b")
#: the reference engine answers 400 to a height/width not a multiple of this (pixels)
PIXEL_MULTIPLE = 32
#: the reference engine's default ``--max-frames`` (requests above it get a 400)
MAX_FRAMES = 257


def align_frames(num_frames: int, temporal: int = TEMPORAL_COMPRESSION) -> int:
    """Round ``num_frames`` up to the next ``temporal*k + 1`` (24 -> 25, 17 -> 17, 1 -> 1).

    Raises:
        ValueError: when ``num_frames`` < 1.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    k = -(-(num_frames - 1) // temporal)
    return temporal * k + 1


def latent_frames(num_frames: int, temporal: int = TEMPORAL_COMPRESSION) -> int:
    """Latent frames for an (aligned) frame count: ``(num_frames - 1) // temporal + 1``."""
    return (align_frames(num_frames, temporal) - 1) // temporal + 1

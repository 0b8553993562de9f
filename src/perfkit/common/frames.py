"""LTX frame math.

Source: LTX-Video's VAE compresses time by 8 with a causal first frame, so the pipeline accepts
``8k + 1`` frames and yields ``(num_frames - 1) // 8 + 1`` latent frames (17 -> 3, 25 -> 4);
spatial compression is 32 for the full VAE (diffusers ``LTXPipeline``).
"""

from __future__ import annotations

TEMPORAL_COMPRESSION = 8
SPATIAL_COMPRESSION = 32


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


def latent_shape(
    num_frames: int, height: int, width: int, channels: int = 128, spatial: int = SPATIAL_COMPRESSION
) -> tuple[int, int, int, int]:
    """(channels, latent frames, latent height, latent width) for a request."""
    return (channels, latent_frames(num_frames), height // spatial, width // spatial)

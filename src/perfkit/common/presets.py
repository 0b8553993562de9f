"""Names of the reference engine's model presets, for validating params without importing torch.

The presets themselves (layer sizes) live in :mod:`perfkit.refengine.models`, which checks at
import that its table has exactly these names.
"""

#: ``tiny``: 2 CPU cores, 64x64, 4 steps. ``ltx-2b``: diffusers' LTX-Video transformer
#: (~1.9 B parameters), full VAE, T5-XXL-shaped encoder (13.5 GiB bf16).
PRESET_NAMES = ("tiny", "ltx-2b")
#: the reference engine answers 400 to a height/width not a multiple of this (pixels)
PIXEL_MULTIPLE = 32
#: the reference engine's default ``--max-frames`` (requests above it get a 400)
MAX_FRAMES = 257

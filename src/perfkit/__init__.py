"""perfkit: performance investigation suite for diffusion video serving engines."""

__version__ = "0.1.0"

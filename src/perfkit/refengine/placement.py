"""Device placement under a memory cap.

Honours ``PERFKIT_CAP_DEVICE_MEMORY_GIB`` and ``SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB``
(as sglang's CI worker does: ``torch.cuda.set_per_process_memory_fraction(cap / total)``). When the
weights do not fit under the cap with working headroom, the transformer and the text encoder are
placed with diffusers' group (layerwise) offload instead of failing.
"""

from __future__ import annotations

import logging
import os

import torch

from perfkit.refengine.models import Components

log = logging.getLogger(__name__)

CAP_ENV_VARS = ("PERFKIT_CAP_DEVICE_MEMORY_GIB", "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB")
#: Fraction of the cap the resident weights may take; the rest is left for activations.
WEIGHTS_SHARE_OF_CAP = 0.7
GIB = 2**30


def device_cap_gib() -> float | None:
    """The device cap from the environment in GiB (first of :data:`CAP_ENV_VARS` set), or None.

    Raises:
        ValueError: when the variable is not a positive number (names the variable).
    """
    for var in CAP_ENV_VARS:
        raw = os.environ.get(var)
        if raw:
            try:
                val = float(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a number of GiB") from None
            if val <= 0:
                raise ValueError(f"{var} must be > 0 GiB, got {val}")
            return val
    return None


def apply_device_cap(device: torch.device) -> float | None:
    """Set the per-process memory fraction for the cap; returns the cap in GiB (None: none)."""
    cap = device_cap_gib()
    if cap is None or device.type != "cuda":
        return cap
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    frac = min(1.0, cap / total)
    torch.cuda.set_per_process_memory_fraction(frac, device)
    log.info("device cap %.2f GiB of %.1f GiB (fraction %.4f)", cap, total, frac)
    return cap


def place(comps: Components, device: torch.device, cap_gib: float | None, force: str | None = None) -> str:
    """Move components to ``device`` or group-offload them; returns the placement name.

    Placements: ``cpu`` (CPU engine), ``device`` (everything resident), ``group_offload``
    (transformer and text encoder offloaded layer-wise to host, onloaded per block with a CUDA
    stream; VAE and upsampler resident).
    """
    if device.type != "cuda":
        return "cpu"
    total = sum(comps.param_bytes.values())
    mode = force
    if mode is None:
        mode = "device"
        if cap_gib is not None and total > WEIGHTS_SHARE_OF_CAP * cap_gib * GIB:
            mode = "group_offload"
    log.info("weights %.2f GiB, cap %s GiB -> placement %s", total / GIB, cap_gib, mode)
    if mode == "device":
        for key in ("transformer", "vae", "text_encoder", "upsampler"):
            m = getattr(comps, key)
            if m is not None:
                m.to(device)
        return mode
    from diffusers.hooks import apply_group_offloading

    for key in ("vae", "upsampler"):
        m = getattr(comps, key)
        if m is not None:
            m.to(device)
    for key in ("transformer", "text_encoder"):
        apply_group_offloading(
            getattr(comps, key),
            onload_device=device,
            offload_device=torch.device("cpu"),
            offload_type="leaf_level",
            use_stream=True,
        )
    return "group_offload"

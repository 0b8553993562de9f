"""Device placement and offload modes (``none``, ``model``, ``group-block``, ``group-leaf`` per
component), under a memory cap (``PERFKIT_CAP_DEVICE_MEMORY_GIB``,
``SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB``) or as asked: :func:`place_components`,
:func:`auto_modes`. Modes, sources and the diffusers limits: docs/refengine.md, "Placement and
offload".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Mapping

import torch

from perfkit.refengine.flags import COMPONENTS
from perfkit.refengine.models import Components

log = logging.getLogger(__name__)

CAP_ENV_VARS = ("PERFKIT_CAP_DEVICE_MEMORY_GIB", "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB")
#: Fraction of the cap the resident weights may take; the rest is left for activations.
WEIGHTS_SHARE_OF_CAP = 0.7
GIB = 2**30

#: Components the automatic rule offloads, in this order, until the resident rest fits the cap.
AUTO_OFFLOAD_ORDER = ("text_encoder", "transformer")
#: Offload modes of the transformer under which torch.compile is kept (diffusers PR #11605).
COMPILE_COMPATIBLE = ("none", "group-block")
#: dynamo recompile limit set for a compiled block-level offloaded transformer when none is
#: given: each of its blocks is a separate graph of the same code (diffusers' test
#: ``test_compile_with_group_offloading`` raises the limit for the same reason).
GROUP_COMPILE_RECOMPILE_LIMIT = 1024
#: Execution order of every component that can be placed (model offload chains them so).
_ORDER = ("text_encoder", "transformer", "upsampler", "vae")
#: Submodules whose blocks are the groups of block-level offload, per component (absent: the
#: component's own ``ModuleList`` children; diffusers' ``block_modules`` argument).
_BLOCK_MODULES: dict[str, list[str] | None] = {"text_encoder": ["encoder"], "vae": ["decoder"]}


@dataclass
class Placement:
    """Where each component's weights went: ``name`` the summary (``cpu``, ``device``,
    ``group_offload`` when any component is group-offloaded, else ``model_offload``), ``offload``
    the mode applied and ``requested`` the one asked (None: automatic) per component, whether
    group offload prefetches on a CUDA stream (per component: ``streams``)."""

    name: str
    offload: dict[str, str] = field(default_factory=dict)
    requested: dict[str, str | None] = field(default_factory=dict)
    streams: dict[str, bool] = field(default_factory=dict)

    def info(self, device: torch.device) -> dict[str, object]:
        """The engine facts (``/v1/models`` and each record's ``perfkit`` extras); a component's
        place is the device (``"cuda:0"``) when resident, else ``"cpu->cuda:0"``."""
        dev = str(device)
        return {
            "placement": self.name,
            "placement_by_component": {
                k: dev if m == "none" else f"cpu->{dev}" for k, m in self.offload.items()
            },
            "offload": dict(self.offload),
            "offload_requested": dict(self.requested),
            "offload_use_stream": any(self.streams.values()),
            "offload_streams": dict(self.streams),
        }


def apply_device_cap(device: torch.device) -> float | None:
    """The device cap in GiB from the environment (first of :data:`CAP_ENV_VARS` set; None: no
    cap), applied on CUDA as the per-process memory fraction ``cap / total``.

    Raises:
        ValueError: when the variable is not a positive number (names the variable).
    """
    var = next((v for v in CAP_ENV_VARS if os.environ.get(v)), None)
    if var is None:
        return None
    raw = os.environ[var]
    try:
        cap = float(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a number of GiB") from None
    if cap <= 0:
        raise ValueError(f"{var} must be > 0 GiB, got {cap}")
    if device.type != "cuda":
        return cap
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    frac = min(1.0, cap / total)
    torch.cuda.set_per_process_memory_fraction(frac, device)
    log.info("device cap %.2f GiB of %.1f GiB (fraction %.4f)", cap, total, frac)
    return cap


def auto_modes(
    param_bytes: Mapping[str, int], cap_gib: float | None, requested: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    """component -> its mode: the requested one, else ``none``, or ``group-leaf`` for the
    components of :data:`AUTO_OFFLOAD_ORDER` that must leave the device, one at a time, for the
    resident weights (bytes per component; a requested ``none`` counts, the upsampler with the
    VAE) to fit ``WEIGHTS_SHARE_OF_CAP * cap_gib`` (None: all resident). Example: ltx-2b in bf16
    (text encoder 9.1 GiB, transformer 3.6 GiB, VAE 0.8 GiB) under a 12 GiB cap offloads the
    text encoder only; under 4 GiB the transformer too."""
    req = dict(requested or {})
    out = {c: req.get(c) or "none" for c in COMPONENTS}
    if cap_gib is None:
        return out
    budget = WEIGHTS_SHARE_OF_CAP * cap_gib * GIB
    resident = sum(
        b for c, b in param_bytes.items() if req.get("vae" if c == "upsampler" else c) in (None, "none")
    )
    for comp in AUTO_OFFLOAD_ORDER:
        if resident <= budget:
            break
        if req.get(comp) is None and comp in param_bytes:
            out[comp] = "group-leaf"
            resident -= param_bytes[comp]
    return out


def _summary(device: torch.device, modes: Mapping[str, str]) -> str:
    if device.type == "cpu":
        return "cpu"
    if any(m.startswith("group-") for m in modes.values()):
        return "group_offload"
    if any(m == "model" for m in modes.values()):
        return "model_offload"
    return "device"


def place_components(
    comps: Components,
    device: torch.device,
    cap_gib: float | None,
    requested: Mapping[str, str | None] | None = None,
) -> Placement:
    """Place every component by its mode (the requested one, else :func:`auto_modes`; the
    upsampler follows the VAE; on a CPU device only ``none``, as the command line checked) and
    return what was applied."""
    req = {c: (requested or {}).get(c) for c in COMPONENTS}
    modes = auto_modes(comps.param_bytes, cap_gib if device.type == "cuda" else None, req)
    if comps.upsampler is not None:
        modes["upsampler"] = modes["vae"]
    streams = {
        # block_modules with a stream clash in diffusers 0.42.1 (docs/refengine.md)
        c: device.type == "cuda" and not (m == "group-block" and _BLOCK_MODULES.get(c))
        for c, m in modes.items()
        if m.startswith("group-")
    }
    total = sum(comps.param_bytes.values())
    log.info("weights %.2f GiB, cap %s GiB -> offload %s", total / GIB, cap_gib, modes)
    chain = []
    for comp in _ORDER:
        mode = modes.get(comp)
        m = getattr(comps, comp)
        if m is None or mode is None:
            continue
        if mode == "none":
            m.to(device)
        elif mode == "model":
            chain.append(comp)
        else:
            from diffusers.hooks import apply_group_offloading

            level = "block_level" if mode == "group-block" else "leaf_level"
            kw: dict[str, object] = {}
            if level == "block_level":
                kw["num_blocks_per_group"] = 1
                if _BLOCK_MODULES.get(comp):
                    kw["block_modules"] = _BLOCK_MODULES[comp]
            apply_group_offloading(
                m,
                onload_device=device,
                offload_device=torch.device("cpu"),
                offload_type=level,
                use_stream=streams[comp],
                **kw,
            )
    if chain:
        from accelerate import cpu_offload_with_hook

        hooks = []
        prev = None
        for comp in chain:
            _, prev = cpu_offload_with_hook(getattr(comps, comp), device, prev_module_hook=prev)
            hooks.append(prev)
        if len(hooks) > 1:  # close the cycle: the first component offloads the last one
            hooks[0].hook.prev_module_hook = hooks[-1]
    return Placement(name=_summary(device, modes), offload=modes, requested=req, streams=streams)

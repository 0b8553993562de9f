"""The offload modes asked for, and whether the device can run them: no torch needed, so the
engine refuses an accelerator mode on a CPU device before it imports torch (seconds of CPU).

:mod:`perfkit.refengine.placement` applies the modes; its docstring describes each one.
"""

from __future__ import annotations

from typing import Any, Mapping

#: Offload modes, one per component (``--offload``, ``--offload-<component>``).
OFFLOAD_MODES = ("none", "model", "group-block", "group-leaf")
#: Modes that move weights between host and an accelerator (refused on a CPU device).
ACCELERATOR_MODES = ("model", "group-block", "group-leaf")
#: Components with their own offload flag, in execution order (the upsampler follows ``vae``).
COMPONENTS = ("text_encoder", "transformer", "vae")


class OffloadNotApplicable(ValueError):
    """An offload mode that the device cannot run (every mode but ``none`` on a CPU device)."""


def requested_modes(
    offload: str | None = None,
    per_component: Mapping[str, str | None] | None = None,
    legacy: str | None = None,
) -> dict[str, str | None]:
    """component -> the mode asked for (None: automatic) from ``--offload`` (every component),
    ``--offload-<component>`` (overrides it for that component) and the older ``--placement``
    (``device``: ``none`` everywhere; ``group_offload``: leaf-level group offload of the
    transformer and text encoder, VAE resident).

    Raises:
        ValueError: an unknown mode or component.
    """
    out: dict[str, str | None] = {c: None for c in COMPONENTS}
    if legacy == "device":
        out = {c: "none" for c in COMPONENTS}
    elif legacy == "group_offload":
        out = {"text_encoder": "group-leaf", "transformer": "group-leaf", "vae": "none"}
    elif legacy is not None:
        raise ValueError(f"unknown placement {legacy!r}; known: device, group_offload")
    if offload is not None:
        out = {c: offload for c in COMPONENTS}
    for comp, mode in (per_component or {}).items():
        if comp not in COMPONENTS:
            raise ValueError(f"unknown component {comp!r}; known: {', '.join(COMPONENTS)}")
        if mode is not None:
            out[comp] = mode
    for comp, mode in out.items():
        if mode is not None and mode not in OFFLOAD_MODES:
            raise ValueError(f"unknown offload mode {mode!r} for {comp}; known: {', '.join(OFFLOAD_MODES)}")
    return out


def check_applicable(requested: Mapping[str, str | None], device: Any) -> None:
    """Raise :class:`OffloadNotApplicable` when a requested mode needs an accelerator and
    ``device`` (a ``torch.device``, or its type as a string: ``"cpu"``) is the CPU. The message
    names the mode and the device: ``offload mode 'model' needs an accelerator; device is cpu``
    (then the components asking)."""
    kind = device if isinstance(device, str) else device.type
    bad = {c: m for c, m in requested.items() if m in ACCELERATOR_MODES}
    if kind != "cpu" or not bad:
        return
    mode = next(iter(dict.fromkeys(bad.values())))
    comps = ", ".join(f"{c}={m}" for c, m in bad.items())
    raise OffloadNotApplicable(f"offload mode {mode!r} needs an accelerator; device is {kind} ({comps})")

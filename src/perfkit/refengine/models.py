"""The reference engine's models: diffusers LTX-Video components with seeded weights or from a
local checkpoint, and their placement and offload on the device (docs/refengine.md, "Models" and
"Placement and offload")."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from perfkit.common.frames import PRESET_NAMES
from perfkit.refengine.flags import COMPONENTS

log = logging.getLogger(__name__)

#: Words the local tokenizer is trained on (a deterministic BPE; only its shape matters).
_CORPUS = (
    "a cat walks on the beach at sunset, waves roll in, cinematic lighting, slow camera pan. "
    "a red car drives through a neon city at night, rain on the street, reflections. "
    "an astronaut floats above the earth, stars in the background, detailed, 4k, smooth motion. "
    "low quality, worst quality, blurry, jittery, distorted, watermark, text, deformed."
)


@dataclass
class Preset:
    """A model configuration: the components' constructor kwargs (absent: diffusers' defaults),
    prompt tokens, serving defaults (ltx-2b's) and the weight dtype on GPU (CPU runs float32)."""

    transformer: dict[str, Any] = field(default_factory=dict)
    vae: dict[str, Any] = field(default_factory=dict)
    text_encoder: dict[str, Any] = field(default_factory=dict)
    upsampler: dict[str, Any] = field(default_factory=dict)
    max_sequence_length: int = 128
    height: int = 512
    width: int = 768
    steps: int = 30
    num_frames: int = 25
    dtype: str = "bfloat16"
    vocab_size: int = 32128


PRESETS: dict[str, Preset] = {
    # Small enough for 2 CPU cores; keeps the full VAE's compression (32x spatial, 8x temporal).
    "tiny": Preset(
        transformer=dict(
            in_channels=8,
            out_channels=8,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            num_layers=2,
            caption_channels=16,
        ),
        vae=dict(
            latent_channels=8,
            block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
        ),
        text_encoder=dict(
            d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, relative_attention_num_buckets=8
        ),
        upsampler=dict(in_channels=8, mid_channels=32, num_blocks_per_stage=1),
        max_sequence_length=16,
        height=64,
        width=64,
        steps=4,
        dtype="float32",
        vocab_size=512,
    ),
    # diffusers' default LTX-Video transformer (~1.9 B parameters), full-size VAE, T5-XXL encoder.
    "ltx-2b": Preset(
        text_encoder=dict(
            d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu"
        ),
    ),
}
if tuple(PRESETS) != PRESET_NAMES:
    raise ImportError(
        f"perfkit.common.frames.PRESET_NAMES {PRESET_NAMES} != refengine presets {tuple(PRESETS)}"
    )


@dataclass
class Components:
    """The built models and their metadata."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: Any
    scheduler: Any
    upsampler: torch.nn.Module | None
    preset: Preset
    source: str
    param_bytes: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.param_bytes = {
            k: sum(t.numel() * t.element_size() for t in getattr(self, k).parameters())
            for k in ("transformer", "vae", "text_encoder", "upsampler")
            if getattr(self, k) is not None
        }


def build_tokenizer(vocab_size: int, max_length: int):
    """A small BPE ``PreTrainedTokenizerFast`` trained locally, with ``<pad>``, ``</s>`` and ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 400), special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


@torch.no_grad()
def _seeded_init(module: torch.nn.Module, seed: int) -> None:
    """Fill every parameter with seeded values (docs/refengine.md, "Models")."""
    gen_dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    gen = torch.Generator(device=gen_dev).manual_seed(seed)
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            std = 1.0 / math.sqrt(max(math.prod(p.shape[1:]), 1))
            p.copy_(torch.empty(p.shape, dtype=p.dtype, device=gen_dev).normal_(0.0, std, generator=gen))
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)


def _materialise(cls_factory, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Construct on the meta device, allocate on ``device`` in ``dtype``, then seed-initialise."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = cls_factory()
    # real buffers (the VAE's latents_mean/std) keep their values
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b.device.type != "meta"}
    # torch's Module.to: diffusers' override warns on every cast, even with no module kept in float32
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    model = model.to(dtype) if keep else torch.nn.Module.to(model, dtype)
    model = model.to_empty(device=device)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in buffers:
                b.copy_(buffers[n].to(device=b.device, dtype=b.dtype))
    _seeded_init(model, seed)
    return model.eval()


def _modules(p: Preset, two_stage: bool, build: Callable[[Callable[[], Any], int], Any]) -> tuple[Any, ...]:
    """(transformer, VAE, text encoder, upsampler or None), each ``build(constructor, seed offset)``."""
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel
    from transformers import T5Config, T5EncoderModel

    transformer = build(lambda: LTXVideoTransformer3DModel(**p.transformer), 0)
    vae = build(lambda: AutoencoderKLLTXVideo(**p.vae), 1)
    t5cfg = T5Config(vocab_size=p.vocab_size, **p.text_encoder)
    text_encoder = build(lambda: T5EncoderModel(t5cfg), 2)
    up_cfg = {"in_channels": transformer.config.in_channels, **p.upsampler}
    upsampler = build(lambda: LTXLatentUpsamplerModel(**up_cfg), 3) if two_stage else None
    return transformer, vae, text_encoder, upsampler


def build_preset(
    name: str, dtype: torch.dtype, seed: int = 0, two_stage: bool = False, device: str | torch.device = "cpu"
) -> Components:
    """Preset ``name``'s components with seeded random weights on ``device``."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    p = PRESETS[name]
    dev = torch.device(device)
    transformer, vae, text_encoder, upsampler = _modules(
        p, two_stage, lambda make, k: _materialise(make, seed + k, dev, dtype)
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        shift_terminal=0.1,
    )
    tokenizer = build_tokenizer(p.vocab_size, p.max_sequence_length)
    return Components(transformer, vae, text_encoder, tokenizer, scheduler, upsampler, p, f"preset:{name}")


def estimate_param_bytes(name: str, dtype: torch.dtype, two_stage: bool = False) -> int:
    """Bytes the preset's weights take in ``dtype``, counted on the meta device (nothing allocated)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        mods = [m for m in _modules(PRESETS[name], two_stage, lambda make, _k: make()) if m is not None]
    return sum(t.numel() for m in mods for t in m.parameters()) * dtype.itemsize


def ltx_pipeline(c: Components) -> Any:
    """diffusers' ``LTXPipeline`` over the components (the upsampler is not part of it)."""
    from diffusers import LTXPipeline

    return LTXPipeline(
        scheduler=c.scheduler,
        vae=c.vae,
        text_encoder=c.text_encoder,
        tokenizer=c.tokenizer,
        transformer=c.transformer,
    )


def save_checkpoint(c: Components, path: str | Path) -> Path:
    """Save components as a diffusers-format directory (``model_index.json`` + subfolders)."""
    out = Path(path)
    ltx_pipeline(c).save_pretrained(out)
    if c.upsampler is not None:
        c.upsampler.save_pretrained(out / "latent_upsampler")
    return out


def load_checkpoint(
    path: str | Path, dtype: torch.dtype, two_stage: bool = False, preset: str = "tiny"
) -> Components:
    """A local diffusers-format LTX-Video checkpoint (``two_stage``: with ``latent_upsampler/``);
    serving defaults from ``preset``. FileNotFoundError: ``model_index.json`` or the upsampler missing."""
    from diffusers import LTXPipeline
    from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel

    d = Path(path)
    if not (d / "model_index.json").exists():
        raise FileNotFoundError(f"--model-path {d}: no model_index.json (not a diffusers checkpoint)")
    pipe = LTXPipeline.from_pretrained(d, torch_dtype=dtype, local_files_only=True)
    upsampler = None
    if two_stage:
        if not (d / "latent_upsampler").exists():
            raise FileNotFoundError(f"--two-stage needs {d / 'latent_upsampler'}")
        upsampler = LTXLatentUpsamplerModel.from_pretrained(d / "latent_upsampler", torch_dtype=dtype)
    return Components(
        pipe.transformer.eval(),
        pipe.vae.eval(),
        pipe.text_encoder.eval(),
        pipe.tokenizer,
        pipe.scheduler,
        upsampler.eval() if upsampler is not None else None,
        PRESETS.get(preset, PRESETS["tiny"]),
        f"path:{d}",
    )


CAP_ENV_VARS = ("PERFKIT_CAP_DEVICE_MEMORY_GIB", "SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB")
#: Fraction of the cap the resident weights may take; the rest is left for activations.
WEIGHTS_SHARE_OF_CAP = 0.7
GIB = 2**30

#: Components the automatic rule offloads, in this order, until the resident rest fits the cap.
AUTO_OFFLOAD_ORDER = ("text_encoder", "transformer")
#: Offload modes of the transformer under which torch.compile is kept (diffusers PR #11605).
COMPILE_COMPATIBLE = ("none", "group-block")
#: dynamo recompile limit for a compiled block-level offloaded transformer (a graph per block)
GROUP_COMPILE_RECOMPILE_LIMIT = 1024
#: Execution order of the components (model offload chains them so).
_ORDER = ("text_encoder", "transformer", "upsampler", "vae")
#: diffusers' ``block_modules`` of block-level offload per component (absent: its own ``ModuleList``)
_BLOCK_MODULES: dict[str, list[str] | None] = {"text_encoder": ["encoder"], "vae": ["decoder"]}


def apply_device_cap(device: torch.device) -> float | None:
    """The device cap (GiB) of the first of :data:`CAP_ENV_VARS` set, else None; applied on CUDA as
    the memory fraction ``cap / total``. ValueError naming the variable: not a positive number."""
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
    """component -> mode: the requested one, else ``none``, or ``group-leaf`` for those of
    :data:`AUTO_OFFLOAD_ORDER` that must leave, one at a time, for the resident weights (bytes; the
    upsampler counts with the VAE) to fit ``WEIGHTS_SHARE_OF_CAP * cap_gib`` (None: no cap)."""
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


def place_components(
    comps: Components,
    device: torch.device,
    cap_gib: float | None,
    requested: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Place every component by its mode (requested, else :func:`auto_modes`; the upsampler follows
    the VAE). Returns the engine facts: ``placement`` (``cpu``, ``device``, ``group_offload``,
    ``model_offload``); per component ``placement_by_component`` (``"cuda:0"`` or ``"cpu->cuda:0"``),
    ``offload``, ``offload_requested`` (None: automatic), ``offload_streams``; ``offload_use_stream``."""
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

            kw: dict[str, Any] = {"offload_type": "leaf_level"}
            if mode == "group-block":
                kw = {"offload_type": "block_level", "num_blocks_per_group": 1}
                if _BLOCK_MODULES.get(comp):
                    kw["block_modules"] = _BLOCK_MODULES[comp]
            apply_group_offloading(
                m, onload_device=device, offload_device=torch.device("cpu"), use_stream=streams[comp], **kw
            )
    if chain:
        from accelerate import cpu_offload_with_hook

        hooks, prev = [], None
        for comp in chain:
            _, prev = cpu_offload_with_hook(getattr(comps, comp), device, prev_module_hook=prev)
            hooks.append(prev)
        if len(hooks) > 1:  # close the cycle: the first component offloads the last one
            hooks[0].hook.prev_module_hook = hooks[-1]
    if device.type == "cpu":
        where = "cpu"
    elif any(m.startswith("group-") for m in modes.values()):
        where = "group_offload"
    else:
        where = "model_offload" if "model" in modes.values() else "device"
    dev = str(device)
    return {
        "placement": where,
        "placement_by_component": {k: dev if m == "none" else f"cpu->{dev}" for k, m in modes.items()},
        "offload": modes,
        "offload_requested": req,
        "offload_use_stream": any(streams.values()),
        "offload_streams": streams,
    }

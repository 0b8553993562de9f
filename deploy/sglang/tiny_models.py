"""Tiny random-weight model directories that real sglang 0.5.23 serves on a CPU (docs/sglang.md).

Run with the sglang venv's python (``make sglang-env``)::

    .sglang-venv/bin/python deploy/sglang/tiny_models.py FAMILY PARENT_DIR

It writes ``PARENT_DIR/<name>`` (a diffusers ``save_pretrained`` layout with ``model_index.json``)
and prints that path. Nothing is downloaded. The name is part of the model: sglang picks a
pipeline config by detectors on the path (``multimodal_gen/registry.py`` in the 0.5.23 wheel).

Families (name written, how sglang serves it):

- ``sana-video`` -> ``tiny-sana-video``: native ``SanaVideoPipeline`` ("sana-video" in the path).
- ``ltx-2`` -> ``tiny-ltx-2``: native ``LTX2Pipeline`` (not "ltx-2.3"/"ltx-2.5"); video + audio.
- ``ltx-video`` -> ``tiny-ltx-video``: LTX-Video 0.9, perfkit's reference-engine ``tiny`` preset
  (``perfkit.refengine.models``); no native sglang pipeline, serve with ``--backend diffusers``.
  The path needs both "ltx" and "video", else sglang takes it for text-to-image and
  ``POST /v1/videos`` answers 400.
- ``flux`` -> ``tiny-flux.1-dev``: native ``FluxPipeline`` (an image model: ``/v1/images/generations``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import diffusers
import torch

VOCAB = 256
WORDS = "a cat dog walks runs on in the beach park at sunset night city cinematic video photo of".split()


def _tokenizer(path: Path, specials: list[str], template: str | None, side: str = "right", **names) -> None:
    """A WordLevel tokenizer (ids: specials first, then WORDS, then fillers) saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + WORDS))}
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer, tok.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    if template:
        marks = [s for s in specials if s in template]
        tok.post_processor = processors.TemplateProcessing(
            single=template, pair=f"{template} $B", special_tokens=[(s, vocab[s]) for s in marks]
        )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", padding_side=side, model_max_length=2048, **names
    ).save_pretrained(path)


def _gemma_tokenizer(path: Path, side: str) -> None:
    names = dict(pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    _tokenizer(path, ["<pad>", "<eos>", "<bos>", "<unk>"], "<bos> $A", side, **names)


def _index(out: Path, cls: str, parts: dict[str, list]) -> None:
    index = {"_class_name": cls, "_diffusers_version": diffusers.__version__, **parts}
    (out / "model_index.json").write_text(json.dumps(index, indent=2))


def sana_video(out: Path) -> None:
    """SANA-Video: Gemma2 text encoder (width 64 = the DiT's caption_channels), Wan VAE, DPM++."""
    from diffusers import AutoencoderKLWan, DPMSolverMultistepScheduler, SanaVideoTransformer3DModel
    from transformers import Gemma2Config, Gemma2Model

    _gemma_tokenizer(out / "tokenizer", "right")
    gemma = dict(intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    Gemma2Model(Gemma2Config(vocab_size=VOCAB, hidden_size=64, head_dim=32, **gemma)).save_pretrained(
        out / "text_encoder"
    )
    SanaVideoTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=32, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=32, cross_attention_dim=64,
        caption_channels=64, sample_size=8, qk_norm="rms_norm_across_heads",
    ).save_pretrained(out / "transformer")  # fmt: skip
    AutoencoderKLWan(base_dim=16, z_dim=16, num_res_blocks=1, attn_scales=[]).save_pretrained(out / "vae")
    DPMSolverMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
    ).save_pretrained(out / "scheduler")
    _index(out, "SanaVideoPipeline", {
        "scheduler": ["diffusers", "DPMSolverMultistepScheduler"],
        "text_encoder": ["transformers", "Gemma2Model"],
        "tokenizer": ["transformers", "GemmaTokenizerFast"],
        "transformer": ["diffusers", "SanaVideoTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    })  # fmt: skip


def _gemma3_encoder(path: Path, layers: int) -> None:
    """Gemma3 with a one-layer SigLIP tower, its tower keys in the nested layout sglang 0.5.23 loads.

    transformers 5.x saves ``vision_tower.encoder...``; sglang's Gemma3ForConditionalGeneration
    .load_weights fuses q/k/v only under ``vision_tower.vision_model.`` (the real checkpoint's keys).
    """
    from safetensors.torch import load_file, save_file
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        max_position_embeddings=2048, sliding_window=512,
    )  # fmt: skip
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
    )
    specials = dict(boi_token_index=253, eoi_token_index=254, image_token_index=255)  # inside the vocab
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, **specials)
    Gemma3ForConditionalGeneration(cfg).save_pretrained(path)
    f = path / "model.safetensors"
    old, new = "vision_tower.", "vision_tower.vision_model."
    sd = {(new + k[len(old) :] if k.startswith(old) and not k.startswith(new) else k): v
          for k, v in load_file(f).items()}  # fmt: skip
    save_file(sd, f, metadata={"format": "pt"})


def ltx_2(out: Path) -> None:
    """LTX-2: Gemma3 encoder, text connectors, audio-video DiT, video VAE (32x, 8x), audio VAE, vocoder.

    sglang's LTX2PipelineConfig fixes 128 latent channels; it views the audio VAE's latents_mean
    [base_channels] as [1, latent_channels, 1, mel_bins / 4], so base_channels = 8 x 16 / 4 = 32.
    """
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    layers, mel, a_lat = 2, 16, 8
    _gemma_tokenizer(out / "tokenizer", "left")
    _gemma3_encoder(out / "text_encoder", layers)
    heads = dict(num_attention_heads=2, attention_head_dim=32, num_layers=1, num_learnable_registers=128)
    LTX2TextConnectors(
        caption_channels=64, text_proj_in_factor=layers + 1, rope_type="split", rope_double_precision=True,
        connector_rope_base_seq_len=4096, rope_theta=10000.0, causal_temporal_positioning=False,
        **{f"{side}_connector_{k}": v for side in ("video", "audio") for k, v in heads.items()},
    ).save_pretrained(out / "connectors")  # fmt: skip
    LTX2VideoTransformer3DModel(
        in_channels=128, out_channels=128, num_attention_heads=2, attention_head_dim=32,
        cross_attention_dim=64, audio_in_channels=a_lat * mel // 4, audio_out_channels=a_lat * mel // 4,
        audio_num_attention_heads=2, audio_attention_head_dim=16, audio_cross_attention_dim=32,
        num_layers=1, caption_channels=64, rope_type="split", rope_double_precision=True,
    ).save_pretrained(out / "transformer")  # fmt: skip
    AutoencoderKLLTX2Video(
        latent_channels=128, block_out_channels=(8, 16, 32, 64), decoder_block_out_channels=(16, 32, 64),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
        decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8,
    ).save_pretrained(out / "vae")  # fmt: skip
    AutoencoderKLLTX2Audio(
        base_channels=a_lat * mel // 4, ch_mult=(1, 2, 4), num_res_blocks=1, resolution=mel,
        latent_channels=a_lat, mel_bins=mel, sample_rate=16000, mel_hop_length=160,
    ).save_pretrained(out / "audio_vae")  # fmt: skip
    LTX2Vocoder(
        in_channels=2 * mel, hidden_channels=32, upsample_kernel_sizes=[4, 4, 4], upsample_factors=[2, 2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], output_sampling_rate=16000,
    ).save_pretrained(out / "vocoder")  # fmt: skip
    FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
        max_image_seq_len=4096, shift_terminal=0.1,
    ).save_pretrained(out / "scheduler")  # fmt: skip
    _index(out, "LTX2Pipeline", {
        "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
        "connectors": ["ltx2", "LTX2TextConnectors"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
        "tokenizer": ["transformers", "GemmaTokenizerFast"],
        "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLLTX2Video"],
        "vocoder": ["ltx2", "LTX2Vocoder"],
    })  # fmt: skip


def ltx_video(out: Path) -> None:
    """LTX-Video 0.9: the reference engine's ``tiny`` preset, saved as its ``LTXPipeline`` layout."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from perfkit.refengine.models import build_preset, save_checkpoint

    save_checkpoint(build_preset("tiny", torch.float32), out)


def flux(out: Path) -> None:
    """FLUX.1: CLIP + T5 encoders, a 1+1-block DiT (head dim 16 = sum of the rope axes), 16-ch VAE."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    clip = ["<|startoftext|>", "<|endoftext|>", "<unk>"]
    _tokenizer(out / "tokenizer", clip, "<|startoftext|> $A <|endoftext|>",
               bos_token=clip[0], eos_token=clip[1], pad_token=clip[1])  # fmt: skip
    _tokenizer(
        out / "tokenizer_2", ["<pad>", "</s>", "<unk>"], "$A </s>", pad_token="<pad>", eos_token="</s>"
    )
    CLIPTextModel(CLIPTextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=77, projection_dim=32, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )).save_pretrained(out / "text_encoder")  # fmt: skip
    T5EncoderModel(T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
    )).save_pretrained(out / "text_encoder_2")  # fmt: skip
    FluxTransformer2DModel(
        in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=64, pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 6, 6),
    ).save_pretrained(out / "transformer")  # fmt: skip
    AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16,) * 4, latent_channels=16, norm_num_groups=8, scaling_factor=0.3611,
        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
    ).save_pretrained(out / "vae")  # fmt: skip
    FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15
    ).save_pretrained(out / "scheduler")
    _index(out, "FluxPipeline", {
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "image_encoder": [None, None], "feature_extractor": [None, None],
    })  # fmt: skip


#: family -> (directory name sglang's detectors accept, builder)
FAMILIES = {
    "sana-video": ("tiny-sana-video", sana_video),
    "ltx-2": ("tiny-ltx-2", ltx_2),
    "ltx-video": ("tiny-ltx-video", ltx_video),
    "flux": ("tiny-flux.1-dev", flux),
}


def build(family: str, parent: str | os.PathLike) -> Path:
    """Write ``parent/<name>`` for ``family`` (seed 0, float32) and return it. KeyError: unknown family."""
    name, fn = FAMILIES[family]
    out = Path(parent) / name
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    fn(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        sys.exit(f"usage: tiny_models.py {{{','.join(FAMILIES)}}} PARENT_DIR")
    print(build(sys.argv[1], sys.argv[2]))

"""The reference engine serves a local diffusers-format checkpoint (``--model-path``)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from refengine_helpers import running_engine, spec

pytestmark = pytest.mark.slow


def test_engine_serves_a_saved_tiny_checkpoint(tmp_path):
    import torch

    from perfkit.refengine import models
    from perfkit.refengine.pipeline import GenRequest, StagedPipeline

    comps = models.build_preset("tiny", torch.float32, seed=0)
    ckpt = models.save_checkpoint(comps, tmp_path / "ckpt")
    assert (ckpt / "model_index.json").exists()
    index = json.loads((ckpt / "model_index.json").read_text())
    assert {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"} <= set(index)

    with (
        running_engine(tmp_path / "engine", "--model-path", str(ckpt), "--keep-outputs") as eng,
        eng.client() as c,
    ):
        out = c.generate(spec(25, steps=4, seed=3))
        models_body = httpx.get(c.base_url + "/v1/models").json()
    assert out.ok, out.error
    rec = out.record
    assert rec is not None
    assert rec.perfkit["model_source"] == f"path:{ckpt}"
    assert [n for n, _ in rec.stages] == [
        "TextEncodingStage",
        "LatentPreparationStage",
        "DenoisingStage",
        "DecodingStage",
    ]
    assert len(rec.steps) == 4 and rec.perfkit["latent_frames"] == 4
    assert models_body["data"][0]["id"] == f"path:{ckpt}"

    # the loaded weights are the saved ones: the same request in this process gives the same frames
    served = np.load(eng.perf_log_dir / "outputs" / f"{out.request_id}.npy")
    pipe = StagedPipeline(comps, torch.device("cpu"), torch.float32)
    ref = pipe.run(
        GenRequest(prompt=spec().prompt, num_frames=25, height=64, width=64, num_inference_steps=4, seed=3),
        keep_output=True,
    ).video
    assert served.shape == ref.shape
    assert np.abs(served.astype(np.int16) - ref.astype(np.int16)).max() <= 1

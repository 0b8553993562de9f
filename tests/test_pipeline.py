"""The staged pipeline in-process (no server): stage names, step counts, edge cases."""

from __future__ import annotations

import pytest
import torch

from perfkit.common.frames import align_frames, latent_frames
from perfkit.refengine.models import build_preset
from perfkit.refengine.pipeline import GenRequest, StagedPipeline


@pytest.fixture(scope="module")
def pipe():
    comps = build_preset("tiny", torch.float32, two_stage=True)
    return StagedPipeline(comps, torch.device("cpu"), torch.float32, two_stage=True, refine_steps=1)


@pytest.mark.parametrize("steps", [1, 3])
def test_one_and_more_steps(pipe, steps):
    r = pipe.run(GenRequest("a cat", 17, 64, 64, steps))
    assert len(r.steps) == steps and len(r.refinement_steps) == 1
    assert [s.name for s in r.stages] == [
        "TextEncodingStage",
        "LatentPreparationStage",
        "DenoisingStage",
        "UpsampleStage",
        "RefinementStage",
        "DecodingStage",
    ]
    assert r.latent_shape[1] == 3


def test_untimed_request_records_no_steps(pipe):
    r = pipe.run(GenRequest("a cat", 24, 64, 64, 2, stage_timing=False))
    assert r.steps == [] and r.effective_frames == 25 and r.total_ms > 0


@pytest.mark.parametrize("n,aligned,latent", [(1, 1, 1), (17, 17, 3), (24, 25, 4), (25, 25, 4), (26, 33, 5)])
def test_frame_math(n, aligned, latent):
    assert align_frames(n) == aligned and latent_frames(n) == latent


def test_frame_math_rejects_zero():
    with pytest.raises(ValueError, match="num_frames"):
        align_frames(0)


class _Rank1:
    """A CFG-parallel rank 1 without a process group: it computes its own (conditional) branch."""

    rank = 1

    def begin_request(self) -> None:
        pass

    def step_split(self) -> tuple[list[float], list[float]]:
        return [], []

    def noise(self, predict, latents, embeds, mask, cfg, guidance):
        b = slice(1, 2) if cfg else slice(None)
        return predict(latents, embeds[b], mask[b])


def test_non_zero_rank_total_ends_before_its_timings_are_resolved(pipe, monkeypatch):
    """A rank other than 0 skips decoding, and its total_ms, like rank 0's, excludes the sync
    that resolves the stage timings."""
    seen = []
    resolve = pipe._resolve
    monkeypatch.setattr(pipe, "cfg_parallel", _Rank1())
    monkeypatch.setattr(pipe, "_resolve", lambda out: (seen.append(out.total_ms), resolve(out)))
    r = pipe.run(GenRequest("a cat", 17, 64, 64, 2))
    assert seen == [r.total_ms] and r.total_ms > 0
    assert "DecodingStage" not in [s.name for s in r.stages] and len(r.steps) == 2

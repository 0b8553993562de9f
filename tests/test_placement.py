"""Automatic per-component placement under a device cap (perfkit.refengine.models.auto_modes).

The sizes are ltx-2b's in bf16 as the H200 engine recorded them (``param_mib`` in
examples/h200/bundles): the T5-XXL-shaped text encoder goes to the host first, the transformer
only when the rest still does not fit.
"""

from __future__ import annotations

import pytest

from perfkit.refengine.models import WEIGHTS_SHARE_OF_CAP, auto_modes

MIB = 2**20
LTX_2B = {"transformer": int(3668.6 * MIB), "vae": int(799.5 * MIB), "text_encoder": int(9334.4 * MIB)}


def test_no_cap_keeps_everything_resident():
    assert auto_modes(LTX_2B, None) == {"text_encoder": "none", "transformer": "none", "vae": "none"}


def test_12gib_offloads_only_the_text_encoder():
    # 8.4 GiB for weights: 13.5 GiB does not fit, 4.4 GiB without the encoder does
    assert auto_modes(LTX_2B, 12) == {"text_encoder": "group-leaf", "transformer": "none", "vae": "none"}


def test_4gib_offloads_the_transformer_too():
    assert auto_modes(LTX_2B, 4) == {"text_encoder": "group-leaf", "transformer": "group-leaf", "vae": "none"}


@pytest.mark.parametrize("cap", [14.0, 19.3])
def test_a_cap_that_holds_the_weights_offloads_nothing_at_the_boundary(cap):
    fits = sum(LTX_2B.values()) <= WEIGHTS_SHARE_OF_CAP * cap * 2**30
    modes = auto_modes(LTX_2B, cap)
    assert (modes["text_encoder"] == "none") is fits


def test_asked_modes_are_kept_and_counted():
    # a resident encoder asked for under 4 GiB stays; the transformer leaves instead
    assert auto_modes(LTX_2B, 4, {"text_encoder": "none"}) == {
        "text_encoder": "none",
        "transformer": "group-leaf",
        "vae": "none",
    }
    # a block-offloaded transformer does not count as resident: the encoder still must go at 12 GiB
    modes = auto_modes(LTX_2B, 12, {"transformer": "group-block"})
    assert modes == {"text_encoder": "group-leaf", "transformer": "group-block", "vae": "none"}

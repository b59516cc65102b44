"""A block's output read and replaced by an SAE's reconstruction: exact for an SAE that reconstructs exactly,
only the SAE's tokens touched, and no hook left behind after an exception."""
from __future__ import annotations

import pytest
import torch
from support import TINY_TIMM, tiny_handle

from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder
from vit_inspect.analysis.sae import encode, normalise
from vit_inspect.core.errors import CaptureError
from vit_inspect.passes.sae import block_output, edited_block_output, replaced_block_output


def exact_sae(width: int, layer: int, tokens: str = "all", flip: float = 1.0) -> SparseAutoencoder:
    """F = 2d features reading +x_i and -x_i with k = d: for each i one of the two is the positive part, so
    TopK_d(ReLU(.)) keeps all of them and x̂ = x exactly (times `flip` when the decoder is scaled)."""
    eye = torch.eye(width)
    info = SAEInfo(model="tiny", layer=layer, k=width, features=2 * width, width=width, tokens=tokens)
    return SparseAutoencoder(torch.cat([eye, -eye], 1), torch.zeros(2 * width), flip * torch.cat([eye, -eye], 0),
                             torch.zeros(width), info)


def _pixels(handle):
    torch.manual_seed(0)
    return torch.randn(2, 3, *TINY_TIMM["reg4"][1])


def test_an_exact_sae_changes_nothing_and_a_wrong_one_changes_only_its_tokens():
    handle = tiny_handle("reg4")
    pixels, layout = _pixels(handle), handle.layout()
    outputs = []
    with torch.no_grad(), block_output(handle, 0, outputs.append):
        reference = handle.forward(pixels)
    pairs = []
    with torch.no_grad(), replaced_block_output(handle, exact_sae(handle.embed_dim, 0), layout,
                                                lambda x, x_hat: pairs.append((x, x_hat))):
        replaced = handle.forward(pixels)
    assert torch.allclose(replaced, reference, atol=1e-5)
    assert torch.allclose(pairs[0][0], outputs[0]) and pairs[0][0].shape == (2, layout.num_tokens, handle.embed_dim)
    seen = []
    with torch.no_grad(), replaced_block_output(handle, exact_sae(handle.embed_dim, 0, "patches", flip=-1.0), layout), \
            block_output(handle, 0, seen.append):
        handle.forward(pixels)
    prefix = slice(0, layout.num_prefix_tokens)
    assert torch.equal(seen[0][:, prefix], outputs[0][:, prefix])
    assert torch.allclose(seen[0][:, layout.patch_slice], -outputs[0][:, layout.patch_slice], atol=1e-6)


def test_no_hook_is_left_behind_after_an_exception():
    handle = tiny_handle("cls")
    block = handle.blocks[1]
    before = dict(block._forward_hooks)
    with pytest.raises(RuntimeError, match="inside"):
        with replaced_block_output(handle, exact_sae(handle.embed_dim, 1), handle.layout()):
            raise RuntimeError("inside")
    with pytest.raises(RuntimeError, match="inside"):
        with block_output(handle, 1, lambda t: None):
            raise RuntimeError("inside")
    assert dict(block._forward_hooks) == before


def test_an_edited_block_equals_the_edit_applied_by_hand_and_only_at_the_chosen_patches():
    handle = tiny_handle("reg4")
    pixels, layout = _pixels(handle), handle.layout()
    torch.manual_seed(1)
    width, features = handle.embed_dim, 3 * handle.embed_dim
    info = SAEInfo(model="tiny", layer=1, k=4, features=features, width=width, tokens="patches")
    sae = SparseAutoencoder(torch.randn(width, features), torch.randn(features), torch.randn(features, width),
                            torch.randn(width), info, input_mean=torch.randn(width), input_scale=torch.tensor(1.5))
    outputs = []
    with torch.no_grad(), block_output(handle, 1, outputs.append):
        handle.forward(pixels)
    tokens = outputs[0][:, layout.patch_slice]
    z = encode(normalise(tokens, sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)
    feature = int(z[0, 2].nonzero()[0])  # a feature active at patch 2 of the first image
    seen = []
    with torch.no_grad(), edited_block_output(handle, sae, layout, {feature: 0.0}, patches=[2]), \
            block_output(handle, 1, seen.append):
        handle.forward(pixels)
    expected = outputs[0].clone()
    expected[:, layout.num_prefix_tokens + 2] -= (z[:, 2, feature, None] * sae.W_dec[feature]) * 1.5
    assert torch.allclose(seen[0], expected, atol=1e-5)
    assert not torch.allclose(seen[0][0], outputs[0][0])
    with pytest.raises(CaptureError, match="patches 0 to"):
        with edited_block_output(handle, sae, layout, {feature: 0.0}, patches=[layout.num_patches]):
            pass

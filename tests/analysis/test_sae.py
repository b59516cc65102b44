"""The top-k SAE's encoder, decoder, auxiliary loss and metrics on tiny hand-set weights and hand-made arrays, and
parity with overcomplete's TopKSAE given the same weights."""
from __future__ import annotations

import math

import pytest
import torch

from vit_inspect.analysis.sae import (auxk_loss, decode, decode_sparse, dead_fraction, densify, edited_tokens, encode,
                                      kl_divergence, l0, normalise, pre_activations, reconstruct, top_k,
                                      top1_agreement, variance_explained)
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder

# d = 2, F = 3: feature 0 reads x0, feature 1 reads x1, feature 2 reads -x0 - x1
W_ENC = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
B_ENC = torch.tensor([0.0, -0.5, 0.0])
W_DEC = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
B_DEC = torch.tensor([0.5, 0.0])


def test_encode_and_decode_by_hand():
    x = torch.tensor([[2.5, 3.0], [-1.5, -2.0]])
    # (x - b_dec) = [2, 3] -> pre = [2, 3 - 0.5, -5] = [2, 2.5, -5]; k = 1 keeps 2.5 at feature 1
    # (x - b_dec) = [-2, -2] -> pre = [-2, -2.5, 4]; k = 1 keeps 4 at feature 2
    assert torch.equal(pre_activations(x, W_ENC, B_ENC, B_DEC), torch.tensor([[2.0, 2.5, -5.0], [-2.0, -2.5, 4.0]]))
    z = encode(x, W_ENC, B_ENC, B_DEC, k=1)
    assert torch.equal(z, torch.tensor([[0.0, 2.5, 0.0], [0.0, 0.0, 4.0]]))
    # x̂ = z W_dec + b_dec: [0, 5] + [0.5, 0] and [4, 4] + [0.5, 0]
    assert torch.equal(decode(z, W_DEC, B_DEC), torch.tensor([[0.5, 5.0], [4.5, 4.0]]))
    z2 = encode(x, W_ENC, B_ENC, B_DEC, k=2)
    assert torch.equal(z2, torch.tensor([[2.0, 2.5, 0.0], [0.0, 0.0, 4.0]]))  # the ReLU zeroes the second of row 2
    assert torch.equal(l0(z2), torch.tensor([2, 1]))


def test_the_sparse_decoder_is_the_dense_one_with_the_same_gradients():
    x = torch.tensor([[2.5, 3.0], [-1.5, -2.0]])
    values, indices = top_k(pre_activations(x, W_ENC, B_ENC, B_DEC), 2)  # rows: (2.5 at 1, 2 at 0), (4 at 2, 0)
    assert torch.equal(decode_sparse(values, indices, W_DEC, B_DEC), torch.tensor([[2.5, 5.0], [4.5, 4.0]]))
    generator = torch.Generator().manual_seed(0)
    pre = torch.randn(64, 48, generator=generator)
    W, b = torch.randn(48, 8, generator=generator), torch.randn(8, generator=generator)
    grads = []
    for decoder in (lambda v, i, W, b: decode(densify(v, i, 48), W, b), decode_sparse):
        W_, b_, pre_ = (t.clone().requires_grad_() for t in (W, b, pre))
        values, indices = top_k(pre_, 6)
        out = decoder(values, indices, W_, b_)
        (out ** 2).sum().backward()
        grads.append((out.detach(), W_.grad, b_.grad, pre_.grad))
    for dense, sparse in zip(*grads):
        torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


def test_normalisation_is_applied_and_undone():
    info = SAEInfo(model="m", layer=0, k=1, features=3, width=2)
    sae = SparseAutoencoder(W_ENC, B_ENC, W_DEC, B_DEC, info, input_mean=torch.tensor([1.0, -1.0]),
                            input_scale=torch.tensor(2.0))
    tokens = torch.tensor([[6.0, 5.0]])  # normalised: ([6, 5] - [1, -1]) / 2 = [2.5, 3], the first row above
    assert torch.equal(normalise(tokens, sae), torch.tensor([[2.5, 3.0]]))
    assert torch.equal(reconstruct(tokens, sae), torch.tensor([[0.5, 5.0]]) * 2 + torch.tensor([1.0, -1.0]))


def test_auxk_loss_by_hand():
    residual = torch.tensor([[1.0, 2.0]])
    pre = torch.tensor([[3.0, 0.5, 1.0]])
    w_dec = torch.tensor([[9.0, 9.0], [0.0, 2.0], [1.0, 0.0]])
    dead = torch.tensor([False, True, True])
    # the two dead latents: ê = 0.5 [0, 2] + 1 [1, 0] = [1, 1]; ‖e - ê‖² / ‖e‖² = 1 / 5
    assert math.isclose(float(auxk_loss(residual, pre, dead, w_dec, k_aux=2)), 0.2, rel_tol=1e-6)
    # k_aux = 1: only latent 2 (pre 1.0): ê = [1, 0]; ‖[0, 2]‖² / 5 = 4 / 5
    assert math.isclose(float(auxk_loss(residual, pre, dead, w_dec, k_aux=1)), 0.8, rel_tol=1e-6)
    assert float(auxk_loss(residual, pre, torch.zeros(3, dtype=torch.bool), w_dec, k_aux=2)) == 0.0


def test_metrics_on_hand_made_arrays():
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # mean [2, 0], Σ‖x - mean‖² = 2
    x_hat = torch.tensor([[1.0, 0.0], [2.0, 0.0]])  # Σ‖x - x̂‖² = 1
    ve = variance_explained(float(((x - x_hat) ** 2).sum()), float((x ** 2).sum()), x.sum(0), len(x))
    assert math.isclose(ve, 0.5)
    assert dead_fraction(torch.tensor([0.0, 3.0, 0.0, 1.0])) == 0.5
    reference = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    replaced = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert top1_agreement(reference, replaced).tolist() == [True, False]
    p = torch.softmax(reference[0].double(), 0)
    q = torch.softmax(replaced[0].double(), 0)
    assert math.isclose(float(kl_divergence(reference, replaced)[0]), float((p * (p / q).log()).sum()), rel_tol=1e-12)
    assert float(kl_divergence(reference, reference).abs().max()) < 1e-12


@pytest.fixture
def overcomplete_topk():
    """overcomplete's TopKSAE class. Its package imports matplotlib's `cm.get_cmap`, removed in matplotlib 3.9;
    the same function under its current name is put back for the import only."""
    import matplotlib
    import matplotlib.cm

    missing = not hasattr(matplotlib.cm, "get_cmap")
    if missing:
        matplotlib.cm.get_cmap = matplotlib.colormaps.get_cmap
    try:
        pytest.importorskip("overcomplete")
        from overcomplete.sae import TopKSAE
    finally:
        if missing:
            del matplotlib.cm.get_cmap
    return TopKSAE


def test_encoder_and_decoder_equal_overcomplete(overcomplete_topk):
    """overcomplete (Fel et al.) encodes ReLU(x W + b) then keeps the top k, and decodes z D without a bias.
    Given W = W_enc, b = b_enc - b_dec W_enc and D = W_dec, its codes are ours and its x̂ + b_dec is ours."""
    torch.manual_seed(0)
    d, f, k = 24, 96, 8
    w_enc, b_enc, w_dec, b_dec = torch.randn(d, f), torch.randn(f) * 0.1, torch.randn(f, d), torch.randn(d)
    theirs = overcomplete_topk(d, nb_concepts=f, top_k=k, dictionary_params={"normalization": "identity"})
    linear = next(m for m in theirs.encoder.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        linear.weight.copy_(w_enc.T)
        linear.bias.copy_(b_enc - b_dec @ w_enc)
        theirs.dictionary._weights.copy_(w_dec)
    theirs.eval()
    x = torch.randn(50, d)
    with torch.no_grad():
        _, codes = theirs.encode(x)
        x_hat = theirs.decode(codes) + b_dec
    ours = encode(x, w_enc, b_enc, b_dec, k)
    assert torch.allclose(ours, codes, atol=1e-5)
    assert torch.allclose(decode(ours, w_dec, b_dec), x_hat, atol=1e-5)


def test_an_edit_moves_tokens_by_the_edited_features_decoder_rows_only():
    """Two features on a 2-d token, k = 2, input_scale 2, no biases or mean: t = (3, 1) in SAE units is
    x = (1.5, 0.5); W_enc = I gives z = (1.5, 0.5). Switching feature 0 off moves t by
    (0 - 1.5) * W_dec[0] * 2 = (-3, -6) with W_dec[0] = (1, 2); doubling feature 1 adds 0.5 * W_dec[1] * 2."""
    info = SAEInfo(model="hand", layer=0, k=2, features=2, width=2)
    sae = SparseAutoencoder(torch.eye(2), torch.zeros(2), torch.tensor([[1.0, 2.0], [0.0, -1.0]]), torch.zeros(2),
                            info, input_scale=torch.tensor(2.0))
    tokens = torch.tensor([[[3.0, 1.0], [4.0, 2.0]]])  # (1, 2 tokens, 2)
    off = edited_tokens(tokens, sae, {0: 0.0})
    assert torch.allclose(off, torch.tensor([[[0.0, -5.0], [0.0, -6.0]]]))
    doubled = edited_tokens(tokens, sae, {1: 2.0}, positions=torch.tensor([False, True]))
    assert torch.allclose(doubled, torch.tensor([[[3.0, 1.0], [4.0, 0.0]]]))  # second token: + 1 * (0, -1) * 2
    assert edited_tokens(tokens, sae, {}) is tokens
    assert torch.equal(edited_tokens(tokens, sae, {0: 1.0, 1: 1.0}), tokens)
    with pytest.raises(ValueError, match="features 0 to 1"):
        edited_tokens(tokens, sae, {2: 0.0})

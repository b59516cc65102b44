"""Top-k sparse autoencoders on a ViT's residual stream, and how well they reconstruct it.

Gao et al., "Scaling and evaluating sparse autoencoders", 2024 (arXiv:2406.04093), Sec. 2.3, Eq. (3):
    z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)),    x̂ = z W_dec + b_dec,
where x = (token - input_mean) / input_scale is a token of the block's output, normalised as the SAE says,
TopK_k keeps the k largest entries of each row and zeroes the rest, W_enc is (d, F) and W_dec is (F, d).
The auxiliary loss against dead latents is their Sec. A.2 (`auxk_loss`). All functions are pure and
differentiable where training needs them; the tensors come from a `core.sae_file.SparseAutoencoder`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vit_inspect.core.sae_file import SparseAutoencoder


def normalise(tokens: torch.Tensor, sae: SparseAutoencoder) -> torch.Tensor:
    """(..., d) tokens in the SAE's input units: (token - input_mean) / input_scale."""
    x = tokens if sae.input_mean is None else tokens - sae.input_mean
    return x if sae.input_scale is None else x / sae.input_scale


def denormalise(x: torch.Tensor, sae: SparseAutoencoder) -> torch.Tensor:
    """The inverse of `normalise`: (..., d) SAE units back to the model's token units."""
    tokens = x if sae.input_scale is None else x * sae.input_scale
    return tokens if sae.input_mean is None else tokens + sae.input_mean


def pre_activations(x: torch.Tensor, W_enc: torch.Tensor, b_enc: torch.Tensor, b_dec: torch.Tensor) -> torch.Tensor:
    """(..., F) encoder pre-activations (x - b_dec) W_enc + b_enc of (..., d) normalised tokens."""
    return (x - b_dec) @ W_enc + b_enc


def top_k(pre: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices), each (..., k): TopK_k(ReLU(pre)) in sparse form. ReLU and TopK commute, so this is
    the k largest pre-activations with the negative ones set to 0 (a row with fewer than k positive entries
    keeps zeros among its k)."""
    values, indices = torch.topk(pre, min(k, pre.shape[-1]), dim=-1)
    return F.relu(values), indices


def densify(values: torch.Tensor, indices: torch.Tensor, features: int) -> torch.Tensor:
    """(..., F) codes z with `values` at `indices` and zeros elsewhere."""
    return torch.zeros(*values.shape[:-1], features, dtype=values.dtype, device=values.device).scatter(
        -1, indices, values)


def encode(x: torch.Tensor, W_enc: torch.Tensor, b_enc: torch.Tensor, b_dec: torch.Tensor, k: int) -> torch.Tensor:
    """(..., F) codes z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)) of (..., d) normalised tokens (Gao et al.
    2024, Eq. 3); non-negative, at most k non-zero per token."""
    values, indices = top_k(pre_activations(x, W_enc, b_enc, b_dec), k)
    return densify(values, indices, W_enc.shape[1])


def feature_score(tokens: torch.Tensor, sae: SparseAutoencoder, feature: int) -> torch.Tensor:
    """(B,) the score a feature target explains: sum over the n tokens of feature ``feature``'s code z_i of
    (B, n, d) tokens in the model's units, z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)) with x the tokens
    normalised as the SAE says (Eq. 3 above). Differentiable: its gradient is W_enc[:, i] / input_scale at
    every token where feature i is among the k kept and positive, zero elsewhere (the TopK and ReLU gates)."""
    if not 0 <= feature < sae.info.features:
        raise ValueError(f"feature {feature} does not exist: this SAE has features 0 to {sae.info.features - 1}")
    z = encode(normalise(tokens, sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)  # (B, n, F)
    return z[..., feature].sum(-1)


def decode(z: torch.Tensor, W_dec: torch.Tensor, b_dec: torch.Tensor) -> torch.Tensor:
    """(..., d) reconstruction x̂ = z W_dec + b_dec of (..., F) codes, in normalised units."""
    return z @ W_dec + b_dec


def decode_sparse(values: torch.Tensor, indices: torch.Tensor, W_dec: torch.Tensor, b_dec: torch.Tensor
                  ) -> torch.Tensor:
    """(B, d) x̂ = z W_dec + b_dec for codes given in sparse form, (B, k) `values` at (B, k) `indices` (as
    `top_k` returns them): Σ_j values[:, j] · W_dec[indices[:, j]] + b_dec, the same sum as `decode(densify(...))`
    without the (B, F) zeros, in k/F of its multiplications. Differentiable in `values`, `W_dec` and `b_dec`."""
    return F.embedding_bag(indices, W_dec, per_sample_weights=values, mode="sum") + b_dec


def reconstruct(tokens: torch.Tensor, sae: SparseAutoencoder) -> torch.Tensor:
    """(..., d) the SAE's reconstruction of (..., d) tokens, in the model's units (normalised, encoded,
    decoded, denormalised)."""
    x = normalise(tokens, sae)
    z = encode(x, sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)
    return denormalise(decode(z, sae.W_dec, sae.b_dec), sae)


def edited_tokens(tokens: torch.Tensor, sae: SparseAutoencoder, scales: dict[int, float],
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """(..., n, d) tokens with features scaled, the SAE's reconstruction error kept:

        t' = t + denormalise((z' - z) W_dec) = t + ((z' - z) W_dec) * input_scale,

    where z = encode(normalise(t)) and z' is z with z'_f = scales[f] * z_f for every feature f in `scales`
    (0 switches it off, 2 doubles it), at the token positions `positions` ((n,) bool, or None for every token)
    and unchanged elsewhere. Only the edited features' decoder rows move the tokens; the part of t the SAE does
    not reconstruct (t - x̂) stays, as in the interventions of Templeton et al. 2024 ("Scaling
    Monosemanticity", feature steering with the error term). An empty `scales` returns `tokens` unchanged."""
    if not scales:
        return tokens
    features = torch.tensor(sorted(scales), dtype=torch.long, device=tokens.device)
    if int(features.min()) < 0 or int(features.max()) >= sae.info.features:
        raise ValueError(f"this SAE has features 0 to {sae.info.features - 1}")
    factor = torch.tensor([float(scales[int(f)]) for f in features], dtype=tokens.dtype, device=tokens.device)
    z = encode(normalise(tokens, sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)[..., features]  # (..., n, m)
    delta = z * (factor - 1)  # (..., n, m): z' - z on the edited features
    if positions is not None:
        delta = delta * positions.to(delta.dtype).unsqueeze(-1)
    shift = delta @ sae.W_dec[features]  # (..., n, d), SAE units
    return tokens + (shift if sae.input_scale is None else shift * sae.input_scale)


def auxk_loss(residual: torch.Tensor, pre: torch.Tensor, dead: torch.Tensor, W_dec: torch.Tensor, k_aux: int
              ) -> torch.Tensor:
    """Gao et al. 2024, Sec. A.2: ‖e - ê‖² with e = x - x̂ the (B, d) residual of the main reconstruction
    and ê = TopK_kaux(ReLU(pre) over the dead latents) W_dec, its reconstruction by the k_aux most active
    dead latents alone (no bias). Returned as a normalised MSE, ‖e - ê‖² / ‖e‖² summed over the batch,
    so that it is comparable to the main loss; 0 when no latent is dead. `dead`: (F,) bool."""
    if not bool(dead.any()):
        return residual.new_zeros(())
    masked = pre.masked_fill(~dead, float("-inf"))  # (B, F), live latents never chosen
    values, indices = torch.topk(masked, min(k_aux, int(dead.sum())), dim=-1)
    e_hat = densify(F.relu(values), indices, W_dec.shape[0]) @ W_dec  # (B, d)
    return ((residual - e_hat) ** 2).sum() / (residual ** 2).sum().clamp_min(1e-12)


def variance_explained(sum_squared_error: float, sum_squares: float, sum_vector: torch.Tensor, count: int) -> float:
    """1 - Σ‖x - x̂‖² / Σ‖x - mean(x)‖² over `count` tokens, from running sums: Σ‖x - x̂‖², Σ‖x‖² and the
    (d,) Σx (Σ‖x - mean‖² = Σ‖x‖² - ‖Σx‖² / n). Unitless, 1 for a perfect reconstruction, 0 for the mean."""
    total = sum_squares - float((sum_vector.double() ** 2).sum()) / max(count, 1)
    return 1.0 - sum_squared_error / total if total > 0 else float("nan")


def l0(z: torch.Tensor) -> torch.Tensor:
    """(...,) non-zero codes per token of (..., F) codes."""
    return (z != 0).sum(-1)


def dead_fraction(fired: torch.Tensor) -> float:
    """Fraction of features that never fired, from (F,) counts of tokens each one fired on."""
    return float((fired == 0).double().mean())


def top1_agreement(reference: torch.Tensor, replaced: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the top-1 class of (B, C) logits `replaced` equals that of `reference`."""
    return reference.argmax(-1) == replaced.argmax(-1)


def kl_divergence(reference: torch.Tensor, replaced: torch.Tensor) -> torch.Tensor:
    """(B,) KL(p_reference ‖ p_replaced) in nats, between the softmaxes of two (B, C) logits."""
    log_p = F.log_softmax(reference.double(), -1)
    return (log_p.exp() * (log_p - F.log_softmax(replaced.double(), -1))).sum(-1)


def rank_features(codes: torch.Tensor, top: int, patch: tuple[int, int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, values), each (≤ top,): the features of (grid_h, grid_w, F) codes with the largest summed
    activation over the image, or the largest code at one (row, col) `patch`, descending (ties: the smaller
    index first); features with activation 0 are left out."""
    scores = codes.sum((0, 1)) if patch is None else codes[patch[0], patch[1]]  # (F,)
    order = sorted(range(scores.shape[0]), key=lambda f: (-float(scores[f]), f))[:top]
    kept = torch.tensor([f for f in order if scores[f] > 0], dtype=torch.long)
    return kept, scores[kept]

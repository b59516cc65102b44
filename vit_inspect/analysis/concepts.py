"""Deep feature factorisation (Collins, Achanta & Süsstrunk 2018, "Deep Feature Factorization for Concept
Discovery", ECCV, Sec. 3): the patch tokens of one image at one block, split into k non-negative parts.

With A the (D, P) matrix of one block's patch tokens (D channels, P patches), the channels are shifted to be
non-negative as pytorch-grad-cam's ``dff`` does (Collins et al. factorise post-ReLU CNN activations, which are
non-negative already; a ViT's residual stream is not):

    o_d  = min_p A_dp                       the offset of channel d         (D,)
    A⁺   = A - o 1ᵀ                         non-negative                   (D, P)
    A⁺  ≈ W H,   W >= 0, H >= 0             NMF (Eq. 1), k components       W (D, k), H (k, P)

minimising ||A⁺ - W H||_F² by coordinate descent (scikit-learn's ``NMF``, the reference's settings: random
initialisation from a seed, at most 200 iterations). Column j of H is concept j's heatmap over the patch grid
(how much of concept j each patch holds, in the tokens' units divided by W's scale); c_j = W_j + o is concept j's
embedding in the token space (pytorch-grad-cam's ``concepts``), which a head can read like any token.

NMF fixes W and H only up to a positive scale per component (W_j s, H_j / s), so a heatmap's values compare
patches within one concept, not concepts with each other. The factorisation is of one image only: the concepts
of two images, or of two values of k, are not the same concepts.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

MAX_ITER = 200  # NMF iterations at most (scikit-learn's default, the reference's)


@dataclass(frozen=True)
class Factorisation:
    """One image's patch tokens split into k non-negative parts (`deep_feature_factorization`)."""

    concepts: np.ndarray  # (k, D) float64 concept embeddings c_j = W_j + o, in the tokens' space
    heatmaps: np.ndarray  # (k, P) float64 H: each concept's non-negative weight at each patch, row-major patches
    offset: np.ndarray  # (D,) float64 o, the per-channel minimum subtracted before the NMF
    error: float  # ||A⁺ - W H||_F / ||A⁺||_F, the share of the shifted tokens the k parts leave out (0 to 1)
    iterations: int  # coordinate-descent iterations run (MAX_ITER: stopped before the tolerance was met)

    @property
    def k(self) -> int:
        return int(self.heatmaps.shape[0])

    @property
    def areas(self) -> np.ndarray:
        """(k,) each concept's share of the factorisation's mass, sum_p H_jp ||W_j||_1 over all concepts
        (the part of sum(W H) that concept j makes), so that the shares add up to 1; scale-free, as
        H_j ||W_j|| does not change when W_j and H_j trade a scale."""
        mass = self.heatmaps.sum(axis=1) * np.abs(self.concepts - self.offset).sum(axis=1)
        total = mass.sum()
        return mass / total if total > 0 else np.full(self.k, 1.0 / self.k)


def shifted_channels(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, D) tokens -> (A⁺ (D, P) float64, o (D,)): channels as rows, each shifted by its minimum over the
    patches so that its least value is 0; NaN read as 0 (as the reference does)."""
    matrix = np.nan_to_num(np.asarray(tokens, dtype=np.float64).T, nan=0.0)  # (D, P)
    offset = matrix.min(axis=1)
    return matrix - offset[:, None], offset


def deep_feature_factorization(tokens: np.ndarray, k: int, seed: int = 0, max_iter: int = MAX_ITER) -> Factorisation:
    """Deep feature factorisation of one image's (P, D) patch tokens into ``k`` concepts (module docstring):
    ``NMF(n_components=k, init="random", random_state=seed)`` of the shifted (D, P) channels, as
    pytorch-grad-cam's ``dff``. 1 <= k <= min(P, D). A run that stops at ``max_iter`` is kept (its
    ``iterations`` says so), as the reference keeps it."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"expected (patches, channels) tokens, got shape {tokens.shape}")
    patches, channels = tokens.shape
    if not 1 <= k <= min(patches, channels):
        raise ValueError(f"k={k} concepts: choose 1 to {min(patches, channels)} for {patches} patches of "
                         f"{channels} channels")
    # imported on use: scikit-learn's decomposition takes seconds to import, and only this analysis needs it here
    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    shifted, offset = shifted_channels(tokens)
    model = NMF(n_components=k, init="random", random_state=seed, max_iter=max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported as `iterations` instead
        w = model.fit_transform(shifted)  # (D, k)
    h = model.components_  # (k, P)
    norm = np.linalg.norm(shifted)
    error = float(np.linalg.norm(shifted - w @ h) / norm) if norm > 0 else 0.0
    return Factorisation(concepts=(w + offset[:, None]).T, heatmaps=h, offset=offset, error=error,
                         iterations=int(model.n_iter_))


def concept_coefficients(tokens: torch.Tensor, parts: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """(..., P, k) each concept's coefficient at each of the (..., P, D) tokens, differentiably: the least-squares
    coefficients of the shifted tokens a - o in the concept parts W_j (rows of the (k, D) ``parts``, the
    factorisation's W transposed, ``concepts - offset``),

        h_p = (a_p - o) W⁺        with W⁺ = pinv(W) ((D, k), Moore-Penrose),

    a fixed linear map of the tokens, so gradients and LRP's linear rules pass through it. NMF's non-negative
    coefficients are the solution of a constrained problem with no gradient; the projection equals them
    wherever the tokens are exact non-negative combinations of the parts (W of full column rank), and may be
    negative elsewhere."""
    basis = torch.linalg.pinv(parts.to(tokens.dtype))  # (D, k)
    return (tokens - offset.to(tokens.dtype)) @ basis

"""Mean attention distance per head (Dosovitskiy et al. 2021, Fig. 7 right and Appendix D.7)."""
from __future__ import annotations

import functools

import numpy as np

from vit_inspect.core.tokens import TokenLayout


def _as_batch(attention: np.ndarray) -> np.ndarray:
    """(depth, heads, N, N) or (B, depth, heads, N, N) -> (B, depth, heads, N, N)."""
    if attention.ndim == 4:
        return attention[None]
    if attention.ndim == 5:
        return attention
    raise ValueError(f"expected attention (depth, heads, N, N) or (B, depth, heads, N, N), got shape {attention.shape}")


@functools.lru_cache(maxsize=8)
def patch_distances(layout: TokenLayout) -> np.ndarray:
    """(P, P) Euclidean distances between patch centres in input pixels; cached per layout (the pass asks
    once per layer), read-only."""
    centers = layout.patch_centers()  # (P, 2)
    distances = np.linalg.norm(centers[:, None, :] - centers[None, :, :], axis=-1)
    distances.flags.writeable = False
    return distances


def distances_per_image(attention: np.ndarray, layout: TokenLayout, renormalize: bool = True) -> np.ndarray:
    """(B, depth, heads, N, N) attention -> (B, depth, heads): `mean_attention_distance` of each image, pixels."""
    patch_to_patch = layout.patches(layout.patches(attention, axis=-2), axis=-1)  # (B, L, H, P, P), a view
    per_query = np.einsum("...ij,ij->...i", patch_to_patch, patch_distances(layout), dtype=np.float64)  # (B, L, H, P)
    if renormalize:
        # sum_j (a_ij / m_i) d_ij = (sum_j a_ij d_ij) / m_i: divide per query, never copy the maps
        patch_mass = patch_to_patch.sum(axis=-1, dtype=np.float64)  # (B, L, H, P)
        if np.any(patch_mass <= 0):
            raise ValueError("a patch query puts no attention on patch keys; cannot renormalise over patches")
        per_query = per_query / patch_mass
    return per_query.mean(axis=-1)


def mean_attention_distance(attention: np.ndarray, layout: TokenLayout, renormalize: bool = True) -> np.ndarray:
    """Mean attention distance of every head, in input pixels.

    Dosovitskiy et al. 2021 ("An Image is Worth 16x16 Words"), Fig. 7 right and Appendix D.7, the
    "attention distance" analogous to a CNN's receptive field size:

        distance(head) = mean_i sum_j a'_ij d_ij

    over patch queries i and patch keys j, with d_ij the Euclidean distance between the patch centres in
    input pixels. Prefix tokens (class, distillation, registers) are removed from queries and keys. With
    ``renormalize`` a'_ij = a_ij / sum_{j in patches} a_ij, so each query's patch attention sums to 1;
    without it a'_ij = a_ij and the mass a query puts on prefix keys is simply dropped.

    ``attention`` is (depth, heads, N, N) or (B, depth, heads, N, N), rows = queries summing to 1.
    Returns (depth, heads) in pixels, averaged over the batch when batched.
    """
    return distances_per_image(_as_batch(attention), layout, renormalize).mean(axis=0)


def distance_as_fraction_of_width(distances: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Attention distances in pixels -> fraction of the input width (grid_w * patch_w pixels)."""
    return distances / layout.input_size[1]


class AttentionDistanceAccumulator:
    """Streaming `mean_attention_distance` over many images: keeps a running sum and count, never the maps."""

    def __init__(self, layout: TokenLayout, renormalize: bool = True) -> None:
        self.layout = layout
        self.renormalize = renormalize
        self.count = 0  # images seen
        self._sum: np.ndarray | None = None  # (depth, heads) sum of per-image distances in pixels

    def update(self, attention: np.ndarray) -> None:
        """Add one image (depth, heads, N, N) or a batch (B, depth, heads, N, N)."""
        self.add(distances_per_image(_as_batch(attention), self.layout, self.renormalize))  # (B, L, H)

    def add(self, per_image: np.ndarray) -> None:
        """Add (B, depth, heads) per-image distances already computed (see `distances_per_image`)."""
        if self._sum is not None and self._sum.shape != per_image.shape[1:]:
            raise ValueError(f"attention has (depth, heads) = {per_image.shape[1:]}, earlier updates had {self._sum.shape}")
        batch_sum = per_image.sum(axis=0)
        self._sum = batch_sum if self._sum is None else self._sum + batch_sum
        self.count += per_image.shape[0]

    def result(self) -> np.ndarray:
        """(depth, heads) mean attention distance in pixels over all images seen."""
        if self._sum is None:
            raise ValueError("no attention maps seen yet; call update() first")
        return self._sum / self.count

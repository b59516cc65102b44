"""The views people know from DINO and DINOv2: the PCA of patch features shown as RGB, and the share
of attention mass DINO's masks keep (the masks themselves: `analysis.masks.mass_mask`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

DINO_MASS = 0.6  # Caron et al. 2021 keep 60 % of the attention mass
BACKGROUND_THRESHOLD = 0.5  # first component, min-max scaled to [0, 1], below this is background


@dataclass(frozen=True)
class FeaturePCA:
    """Patch features of one or more images projected on three principal components, as RGB."""

    rgb: tuple[np.ndarray, ...]  # per image (grid_h, grid_w, 3) in [0, 1]; background black when removed
    foreground: tuple[np.ndarray, ...]  # per image (grid_h, grid_w) bool; all True without background removal
    explained_variance_ratio: np.ndarray  # (3,) of the components shown (fitted on foreground patches)
    threshold: float | None  # background threshold on the scaled first component; None: kept all


def _principal_scores(samples: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores (n, count), explained variance ratio (count,)) of centred samples, each component's sign
    fixed so that its largest-magnitude score is positive (deterministic colours)."""
    centred = samples - samples.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    count = min(count, vt.shape[0])
    scores = centred @ vt[:count].T  # (n, count)
    signs = np.sign(scores[np.argmax(np.abs(scores), axis=0), np.arange(count)])
    scores = scores * np.where(signs == 0, 1.0, signs)
    variance = singular ** 2
    ratio = variance[:count] / variance.sum() if variance.sum() > 0 else np.zeros(count)
    return scores, ratio


def _scaled(scores: np.ndarray) -> np.ndarray:
    """Each column min-max scaled to [0, 1] (a constant column becomes 0)."""
    low, high = scores.min(axis=0), scores.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    return (scores - low) / span


def feature_pca(features: Sequence[np.ndarray], background_threshold: float | None = None) -> FeaturePCA:
    """DINOv2's visualisation of patch features (Oquab et al. 2023, "DINOv2", Fig. 1 and Sec. 7.3).

    ``features`` are one or more (grid_h, grid_w, D) arrays of last-layer patch tokens of one model
    (grids may differ); a joint fit puts all images' patches in one PCA so that matching parts get
    matching colours. Steps, as in the paper:

    1. PCA of all patches; with `background_threshold` the first component, min-max scaled to [0, 1]
       over all patches, separates foreground (>= threshold) from background. Its sign is arbitrary, so
       it is oriented so that the patches of the central half of each grid score higher on average than
       the rest (objects are usually near the centre) - a heuristic, stated in the figure.
    2. A second PCA of the foreground patches only (all patches without removal); its first three
       components, each min-max scaled to [0, 1] over all images, are the R, G and B channels.
       Background patches are black. Component signs are fixed as in `_principal_scores`.
    """
    if not features:
        raise ValueError("no features given")
    if any(f.ndim != 3 for f in features) or len({f.shape[-1] for f in features}) != 1:
        raise ValueError(f"expected (grid_h, grid_w, D) features of one width, got {[f.shape for f in features]}")
    grids = [f.shape[:2] for f in features]
    samples = np.concatenate([f.reshape(-1, f.shape[-1]) for f in features]).astype(np.float64)  # (n, D)
    foreground = np.ones(len(samples), dtype=bool)
    if background_threshold is not None:
        first = _principal_scores(samples, 1)[0][:, 0]  # (n,)
        central = np.concatenate([_central(h, w).ravel() for h, w in grids])
        if (~central).any() and first[central].mean() < first[~central].mean():
            first = -first
        foreground = _scaled(first[:, None])[:, 0] >= background_threshold
    if foreground.sum() < 2:
        raise ValueError("fewer than two foreground patches; lower the background threshold")
    scores, ratio = _principal_scores(samples[foreground], 3)
    colours = np.zeros((len(samples), 3))
    colours[foreground, :scores.shape[1]] = _scaled(scores)
    rgb, masks, start = [], [], 0
    for grid_h, grid_w in grids:
        stop = start + grid_h * grid_w
        rgb.append(colours[start:stop].reshape(grid_h, grid_w, 3))
        masks.append(foreground[start:stop].reshape(grid_h, grid_w))
        start = stop
    return FeaturePCA(rgb=tuple(rgb), foreground=tuple(masks), explained_variance_ratio=np.pad(ratio, (0, 3 - len(ratio))),
                      threshold=background_threshold)


def _central(grid_h: int, grid_w: int) -> np.ndarray:
    """(grid_h, grid_w) bool: the cells of the central half of the grid in each direction."""
    rows = np.abs(np.arange(grid_h) + 0.5 - grid_h / 2) <= grid_h / 4
    cols = np.abs(np.arange(grid_w) + 0.5 - grid_w / 2) <= grid_w / 4
    return rows[:, None] & cols[None, :]

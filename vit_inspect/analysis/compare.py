"""Comparing two models (or two tokens of one model): relative depth and agreement of two maps.

No paper defines a cross-model map comparison for ViTs; the two numbers are the standard ones of the
saliency-comparison literature: Spearman's rank correlation (`analysis.rank_correlation`) and the top-k
intersection (`analysis.top_overlap`, Ghorbani, Abid & Zou 2019, "Interpretation of Neural Networks is
Fragile", Sec. 3; Adebayo et al. 2018, "Sanity Checks for Saliency Maps", use the rank correlation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.analysis.top_overlap import TOP_FRACTION, top_overlap

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in pixels of the original image


def relative_depth(layer: int, depth: int) -> float:
    """Relative depth r = (layer + 1) / depth of 0-based block `layer` in a model of `depth` blocks.

    The last block has r = 1, so layer 5 of a 12-block model and layer 11 of a 24-block model both have
    r = 0.5 and are aligned.
    """
    if not 0 <= layer < depth:
        raise ValueError(f"layer {layer} out of range: the model has {depth} layers (0..{depth - 1})")
    return (layer + 1) / depth


def matching_layer(layer: int, depth: int, other_depth: int) -> int:
    """The 0-based layer of a model with `other_depth` blocks aligned with `layer` of a `depth`-block model.

    It is the shallowest layer whose relative depth (see `relative_depth`) is at least that of `layer`:
    ceil((layer + 1) * other_depth / depth) - 1, computed in integers. Equal depths map a layer to
    itself; 12 -> 24 maps layer 5 to 11 and 11 to 23; 24 -> 12 maps layers 10 and 11 both to 5.
    """
    relative_depth(layer, depth)  # range check
    if other_depth < 1:
        raise ValueError(f"the other model has {other_depth} layers")
    return -(-(layer + 1) * other_depth // depth) - 1


def common_box(box_a: Box, box_b: Box) -> Box:
    """The part of the original image both crops cover (their intersection)."""
    left, top = max(box_a[0], box_b[0]), max(box_a[1], box_b[1])
    right, bottom = min(box_a[2], box_b[2]), min(box_a[3], box_b[3])
    if not (right > left and bottom > top):
        raise ValueError(f"the two crops {box_a} and {box_b} do not overlap")
    return left, top, right, bottom


def resample_map(grid_map: np.ndarray, box: Box, region: Box, shape: tuple[int, int]) -> np.ndarray:
    """Bilinearly sample a (grid_h, grid_w) map that covers `box` at the centres of a `shape` grid over `region`.

    Each map value sits at its patch centre; between centres values are interpolated linearly in x and y,
    beyond the outermost centres the edge value is kept (pixel-centre alignment, as PIL's bilinear resize
    that draws the overlays). Boxes are in pixels of the original image.
    """
    grid_h, grid_w = grid_map.shape
    out_h, out_w = shape
    ys = region[1] + (np.arange(out_h) + 0.5) * (region[3] - region[1]) / out_h  # (out_h,) original pixels
    xs = region[0] + (np.arange(out_w) + 0.5) * (region[2] - region[0]) / out_w  # (out_w,)
    v = np.clip((ys - box[1]) / (box[3] - box[1]) * grid_h - 0.5, 0, grid_h - 1)  # fractional map rows
    u = np.clip((xs - box[0]) / (box[2] - box[0]) * grid_w - 0.5, 0, grid_w - 1)  # fractional map columns
    v0, u0 = np.floor(v).astype(int), np.floor(u).astype(int)
    v1, u1 = np.minimum(v0 + 1, grid_h - 1), np.minimum(u0 + 1, grid_w - 1)
    fv, fu = (v - v0)[:, None], (u - u0)[None, :]
    values = grid_map.astype(np.float64)
    top = values[v0][:, u0] * (1 - fu) + values[v0][:, u1] * fu  # (out_h, out_w)
    bottom = values[v1][:, u0] * (1 - fu) + values[v1][:, u1] * fu
    return top * (1 - fv) + bottom * fv


def common_grid(map_a: np.ndarray, map_b: np.ndarray, box_a: Box | None = None,
                box_b: Box | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Both maps resampled (`resample_map`) onto one grid over the image region both crops cover.

    Without boxes both maps are taken to cover the same region. The common grid has, per axis, the
    larger of the two maps' patch counts inside the region, so the finer map is never coarsened; two
    maps on the same grid over the same box come back unchanged.
    """
    if box_a is None or box_b is None:
        box_a = box_b = (0.0, 0.0, 1.0, 1.0)
    region = common_box(box_a, box_b)

    def cells(grid_map: np.ndarray, box: Box) -> tuple[int, int]:
        share_h = (region[3] - region[1]) / (box[3] - box[1])
        share_w = (region[2] - region[0]) / (box[2] - box[0])
        return max(1, round(grid_map.shape[0] * share_h)), max(1, round(grid_map.shape[1] * share_w))

    (ha, wa), (hb, wb) = cells(map_a, box_a), cells(map_b, box_b)
    shape = (max(ha, hb), max(wa, wb))
    return resample_map(map_a, box_a, region, shape), resample_map(map_b, box_b, region, shape)


@dataclass(frozen=True)
class Agreement:
    """How much two maps of one image agree, on the common grid."""

    spearman: float  # rank correlation over all cells of the common grid, [-1, 1] (NaN: a constant map)
    top_overlap: float  # share of top-`fraction` cells in common, [0, 1]
    fraction: float  # the top share used
    grid: tuple[int, int]  # (rows, cols) of the common grid

    def as_dict(self) -> dict:
        return {"spearman": None if math.isnan(self.spearman) else round(self.spearman, 6),
                "top_overlap": round(self.top_overlap, 6), "top_fraction": self.fraction, "grid": list(self.grid)}


def map_agreement(map_a: np.ndarray, map_b: np.ndarray, box_a: Box | None = None, box_b: Box | None = None,
                  fraction: float = TOP_FRACTION) -> Agreement:
    """`spearman` and `top_overlap` of two raw maps after `common_grid` (maps are used as they are:
    Grad-CAM's sign included, since ranks do not depend on any normalisation)."""
    a, b = common_grid(map_a, map_b, box_a, box_b)
    return Agreement(spearman=spearman(a, b), top_overlap=top_overlap(a, b, fraction), fraction=fraction,
                     grid=a.shape)

"""SAE features: a feature's gallery (its top-activating patches from the index, `core.sae_index`) and a
feature's activation over one image beside its gallery."""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure

from vit_inspect.core.sae_index import FeatureEntry
from vit_inspect.plots.canvas import add_colorbar, grid_of, titled
from vit_inspect.plots.maps import PANEL_INCHES, enlarged, overlay

OUTLINE = (0, 255, 255)  # the patch's outline in a crop
GALLERY_SCALE = 3  # a crop's pixels enlarged this many times in the PIL gallery
UNIT = "SAE code z (normalised units)"


def _short(name: str, chars: int = 20) -> str:
    return name if len(name) <= chars else name[:chars - 1] + "…"


def outlined(crop: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """(S, S, 3) uint8 crop (centred on its patch, as the index cuts it) with a 1-pixel outline just outside
    the patch; a patch as large as the crop is left as it is."""
    out = crop.copy()
    side = crop.shape[0]
    (ph, pw), centre = patch_size, side // 2
    top, left = centre - ph // 2 - 1, centre - pw // 2 - 1
    bottom, right = top + ph + 1, left + pw + 1
    if min(patch_size) < 1 or top < 0 or left < 0 or bottom >= side or right >= side:
        return out
    out[top, left:right + 1] = out[bottom, left:right + 1] = OUTLINE
    out[top:bottom + 1, left] = out[top:bottom + 1, right] = OUTLINE
    return out


def feature_gallery(entry: FeatureEntry, patch_size: tuple[int, int], title: str = "",
                    columns: int = 8) -> np.ndarray:
    """(H, W, 3) uint8 picture of a feature's top patches, drawn with PIL: each crop enlarged `GALLERY_SCALE`
    times with its patch outlined, captioned with its activation and image; `title` above."""
    if not len(entry.activations):
        return titled(np.full((32, 256, 3), 255, np.uint8), (title + "\n" if title else "") +
                      f"feature {entry.feature} fired on none of the index's patches")
    tiles = [titled(enlarged(outlined(crop, patch_size), GALLERY_SCALE), f"z={value:.2f}\n{name}")
             for crop, value, name in zip(entry.crops, entry.activations, entry.images)]
    return titled(grid_of(tiles, columns), title)


def feature_gallery_figure(entry: FeatureEntry, patch_size: tuple[int, int], title: str = "") -> Figure:
    """`feature_gallery`'s picture in a matplotlib Figure (one image axes, shown at its pixel size: drawing one
    panel per crop costs a matplotlib layout and takes seconds). The crops keep their photographs' colours; the
    number over each is its activation z."""
    picture = feature_gallery(entry, patch_size, title)
    dpi = 100
    fig = Figure(figsize=(picture.shape[1] / dpi, picture.shape[0] / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(picture, interpolation="nearest")
    ax.set_axis_off()
    return fig


def feature_figure(rgb: np.ndarray, feature_map: np.ndarray, title: str, entry: FeatureEntry | None = None,
                   patch_size: tuple[int, int] | None = None) -> Figure:
    """A feature's (grid_h, grid_w) activation over the image, on the range 0 to its largest value, with its
    colour bar; then, with an index `entry`, the feature's top patches from the index (`feature_gallery_figure`'s
    panels). `title` names model, image, block, SAE, feature and label."""
    shown = [] if entry is None else list(range(min(len(entry.activations), 8)))
    height, width = rgb.shape[:2]
    map_w = PANEL_INCHES * max(1.0, width / height)
    columns = 4
    rows = -(-len(shown) // columns)
    fig = Figure(figsize=(map_w + 1.2 + (1.5 * columns if shown else 0), PANEL_INCHES + 0.6), layout="constrained")
    figures = fig.subfigures(1, 2, width_ratios=[map_w + 1.2, 1.5 * columns]) if shown else [fig]
    ax = figures[0].add_subplot(1, 1, 1)
    high = max(float(feature_map.max()), 1e-6)
    ax.imshow(overlay(rgb, feature_map, vmin=0.0, vmax=high))
    ax.set_title("activation over the image", fontsize="medium")
    ax.set_axis_off()
    add_colorbar(figures[0], 0.0, high, UNIT, ax=ax, fraction=0.046, pad=0.02)
    if shown:
        gallery = figures[1]
        gallery.suptitle("top patches of the index", fontsize="medium")
        for position in shown:
            cell = gallery.add_subplot(rows, columns, position + 1)
            cell.imshow(outlined(entry.crops[position], patch_size or (0, 0)))
            cell.set_title(f"z={entry.activations[position]:.2f}\n{_short(entry.images[position])}",
                           fontsize="x-small")
            cell.set_axis_off()
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize="medium")
    return fig

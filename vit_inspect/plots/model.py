"""Pictures of a model's own parameters, no image needed (Dosovitskiy et al. 2021, ViT Fig. 7 left and centre):
the principal components of the patch-embedding filters and the position-embedding similarity, each as a
matplotlib figure (the CLI's files) and as a PIL picture (the app's Model tab and Compare run), built from
`plots`'s helpers. Object API only (no pyplot), no torch, no gradio.
"""
from __future__ import annotations

import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from vit_inspect.analysis.filters import FilterPCA
from vit_inspect.plots.canvas import (COLORBAR_PIXELS, SMALL_TEXT, draw_colorbar, font_of, grid_of, normalized, titled,
                                      write_upwards)

TILE_INCHES = 1.0  # side of one tile in the filter and position-embedding grids
TITLE_INCHES = 0.5  # room for a figure title above a grid of tiles


def filter_pca_figure(pca: FilterPCA, ncols: int = 7, model: str = "") -> Figure:
    """Principal components of the patch-embedding filters as image tiles (Dosovitskiy et al. 2021, Fig. 7 left).

    Each tile is min-max scaled to [0, 1] on its own (the sign of a component is arbitrary) and titled
    with its explained variance in percent. RGB filters show in colour, single-channel ones in grey.
    ``model`` names the model on a line of the title's own.
    """
    num_components, _, _, channels = pca.components.shape
    if channels not in (1, 3):
        raise ValueError(f"can only draw 1- or 3-channel filters, got {channels} channels")
    nrows = math.ceil(num_components / ncols)
    fig = Figure(figsize=(TILE_INCHES * ncols, TILE_INCHES * nrows + TITLE_INCHES), layout="constrained")
    kind = "RGB embedding filters" if channels == 3 else "Embedding filters"
    fig.suptitle((f"{model}\n" if model else "") + f"{kind} (first {num_components} principal components)")
    for index in range(num_components):
        tile = normalized(pca.components[index], relu=False)  # (ph, pw, C) in [0, 1]
        ax = fig.add_subplot(nrows, ncols, index + 1)
        if channels == 3:
            ax.imshow(tile)
        else:
            ax.imshow(tile[..., 0], cmap="gray", vmin=0.0, vmax=1.0)
        ax.set_title(f"{100 * pca.explained_variance_ratio[index]:.1f}%", fontsize="small")
        ax.set_axis_off()
    return fig


FILTER_TILE_PIXELS = 72  # a filter_pca_panel tile is magnified by whole pixels to at least this many on its longer side
FILTER_CAPTION_PIXELS = 52  # ... and to at least this width, its caption's ("100.0%" in TEXT-pixel type)


def filter_pca_panel(pca: FilterPCA, title: str = "", ncols: int = 7) -> np.ndarray:
    """What `filter_pca_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL: each principal component
    of the patch-embedding filters (Dosovitskiy et al. 2021, Fig. 7 left) as a tile min-max scaled to
    [0, 1] on its own (`normalized`: the sign of a component is arbitrary) and written as rint(255 x),
    magnified by whole pixels (each filter pixel a square) to at least FILTER_TILE_PIXELS on its longer
    side and FILTER_CAPTION_PIXELS wide, under its explained variance in percent; ``ncols`` tiles per row
    (`grid_of`), under a heading that says what the tiles are and how they are scaled, itself under the
    wrapped ``title``. RGB filters
    show in colour, single-channel ones in grey. A matplotlib figure of DeiT-Ti's 28 components takes
    ≈ 1 s to draw (the Model tab's first picture, and twice in a Compare run)."""
    num_components, height, width, channels = pca.components.shape
    if channels not in (1, 3):
        raise ValueError(f"can only draw 1- or 3-channel filters, got {channels} channels")
    if ncols < 1:
        raise ValueError(f"ncols must be at least 1, got {ncols}")
    scale = max(1, math.ceil(FILTER_TILE_PIXELS / max(height, width)), math.ceil(FILTER_CAPTION_PIXELS / width))
    tiles = []
    for index in range(num_components):
        tile = np.rint(normalized(pca.components[index], relu=False) * 255.0).astype(np.uint8)  # (h, w, C)
        tile = np.repeat(np.repeat(np.broadcast_to(tile, (height, width, 3)), scale, axis=0), scale, axis=1)
        tiles.append(titled(tile, f"{100 * pca.explained_variance_ratio[index]:.1f}%"))
    kind = "RGB embedding filters" if channels == 3 else "Embedding filters"
    heading = f"{kind} (first {num_components} principal components, each scaled to its own min-max)"
    return titled(grid_of(tiles, ncols), f"{title}\n{heading}" if title else heading)


def similarity_mosaic(similarity: np.ndarray) -> np.ndarray:
    """(gh, gw, gh, gw) -> one (gh*(gh+1)-1, gw*(gw+1)-1) image: tile (r, c) placed where patch (r, c)
    sits, tiles separated by one NaN row/column (drawn blank)."""
    grid_h, grid_w = similarity.shape[:2]
    padded = np.full((grid_h, grid_h + 1, grid_w, grid_w + 1), np.nan)  # (tile row, y, tile col, x)
    padded[:, :grid_h, :, :grid_w] = similarity.transpose(0, 2, 1, 3)
    return padded.reshape(grid_h * (grid_h + 1), grid_w * (grid_w + 1))[:-1, :-1]


def pos_similarity_figure(similarity: np.ndarray, title: str = "Position embedding similarity") -> Figure:
    """Position-embedding similarity (Dosovitskiy et al. 2021, Fig. 7 centre) from (gh, gw, gh, gw) cosines.

    Tile (r, c), placed where patch (r, c) sits, shows that patch's cosine similarity with every patch,
    all tiles on one colour range [-1, 1]. Drawn as one image (`similarity_mosaic`), not one axes per
    tile, so a 14x14 grid renders in a fraction of a second.
    """
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(f"expected (grid_h, grid_w, grid_h, grid_w) similarities, got shape {similarity.shape}")
    grid_h, grid_w = similarity.shape[:2]
    fig = Figure(figsize=(TILE_INCHES * (grid_w * 0.6 + 1.5), TILE_INCHES * grid_h * 0.6 + 2 * TITLE_INCHES),
                 layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(similarity_mosaic(similarity), cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks((np.arange(grid_w) + 0.5) * (grid_w + 1) - 1, labels=np.arange(grid_w))
    ax.set_yticks((np.arange(grid_h) + 0.5) * (grid_h + 1) - 1, labels=np.arange(grid_h))
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    # a wide grid is drawn shorter than its axes box: the bar shrinks with it instead of overhanging
    fig.colorbar(image, ax=ax, label="cosine similarity", shrink=0.8 * min(1.0, grid_h / grid_w))
    ax.set_title(title)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    return fig


SIMILARITY_PIXELS = 640  # a pos_similarity_panel's mosaic is magnified by whole pixels to about this on its longer side
SIMILARITY_SEPARATOR = (255, 255, 255)  # the blank row and column between two tiles


def pos_similarity_panel(similarity: np.ndarray, title: str = "Position embedding similarity") -> np.ndarray:
    """What `pos_similarity_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL: the position-embedding
    similarity (Dosovitskiy et al. 2021, Fig. 7 centre) of (gh, gw, gh, gw) cosines as one
    `similarity_mosaic`, tile (r, c) where patch (r, c) sits, every cell viridis over the one range
    [-1, 1] (matplotlib's colour for (v + 1) / 2), tiles one white cell apart, each cell magnified to a
    square of whole pixels (the mosaic about SIMILARITY_PIXELS on its longer side); tile rows and columns
    numbered from 0, as patches are everywhere ("input patch row", "input patch column"), a colour bar
    labelled "cosine similarity", and the wrapped ``title`` above. The matplotlib figure takes 0.25-0.5 s to draw."""
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(f"expected (grid_h, grid_w, grid_h, grid_w) similarities, got shape {similarity.shape}")
    grid_h, grid_w = similarity.shape[:2]
    mosaic = similarity_mosaic(similarity)
    blank = np.isnan(mosaic)
    fraction = np.clip((np.where(blank, -1.0, mosaic) + 1.0) / 2.0, 0.0, 1.0)
    # bytes=True: the very (colour * 255).astype(uint8) values, without a float64 RGBA copy of the mosaic (63 MB
    # for DINOv2's 37 x 37 grid)
    colours = matplotlib.colormaps["viridis"](fraction, bytes=True)[..., :3]
    colours[blank] = SIMILARITY_SEPARATOR
    scale = max(1, round(SIMILARITY_PIXELS / max(mosaic.shape)))
    cells = np.repeat(np.repeat(colours, scale, axis=0), scale, axis=1)
    small = font_of(SMALL_TEXT)
    digits = len(str(grid_h - 1))
    x0, y0 = 24 + 8 * digits, 6  # room for "input patch row" and the row numbers
    body_w, body_h = cells.shape[1], cells.shape[0]
    panel = Image.new("RGB", (x0 + body_w + COLORBAR_PIXELS, y0 + body_h + 40), (255, 255, 255))
    panel.paste(Image.fromarray(cells), (x0, y0))
    pen = ImageDraw.Draw(panel)
    row_every = max(1, math.ceil(15 / ((grid_h + 1) * scale)))  # numbers at least 15 pixels apart
    col_every = max(1, math.ceil((8 * len(str(grid_w - 1)) + 6) / ((grid_w + 1) * scale)))
    for row in range(0, grid_h, row_every):  # tile row r spans mosaic rows r (gh + 1) to r (gh + 1) + gh - 1
        pen.text((x0 - 3, y0 + (row * (grid_h + 1) + grid_h / 2) * scale), str(row), fill=(0, 0, 0), font=small,
                 anchor="rm")
    for col in range(0, grid_w, col_every):
        pen.text((x0 + (col * (grid_w + 1) + grid_w / 2) * scale, y0 + body_h + 3), str(col), fill=(0, 0, 0),
                 font=small, anchor="mt")
    pen.text((x0 + body_w / 2, y0 + body_h + 22), "input patch column", fill=(0, 0, 0), font=small, anchor="mt")
    write_upwards(panel, "input patch row", 0, y0, body_h)
    draw_colorbar(panel, pen, x0 + body_w + 8, y0, y0 + body_h, -1.0, 1.0, "cosine similarity", "viridis")
    return titled(np.asarray(panel), title)

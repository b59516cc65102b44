"""Numbers -> images and matplotlib Figures. Object API only (no pyplot), no torch, no gradio.

Display decisions live here and only here: the optional ReLU, min-max normalisation, bilinear
upsampling to the image and the colormap. The pictures of a model's own parameters (ViT Fig. 7 left and
centre) are in `model_plots`, built from the helpers here.
"""
from __future__ import annotations

import functools
import io
import math
import struct
import textwrap
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

MARKER_COLOR = (0, 255, 255)  # cyan, visible on the inferno/viridis palettes and on most photos
MARKER_WIDTH_FRACTION = 0.125  # marker outline width as a fraction of the smaller patch side (>= 1 px)
PANEL_INCHES = 3.0  # side of one image panel in maps_figure
DISTANCE_FIGURE_INCHES = (5.0, 4.0)  # (width, height) of the attention-distance scatter
HIGHLIGHT_COLOR = "tab:red"
HEAD_COLOR = "tab:blue"
HIGHLIGHT_AREA = 60  # scatter marker area of a highlighted head, points²
TITLE_CHARS = 30  # panel titles in maps_figure wrap at this many characters
MASK_DIM = 0.3  # brightness kept outside a threshold mask
COLORBAR_PIXELS = 110  # width of map_panel's colour bar column, tick labels and unit included
CAPTION_LINE_PIXELS = 13  # height of one caption line under a map_panel
OUTLINE_COLOR = (0, 255, 255)  # the seen region on the upload preview


def _normalized(grid_map: np.ndarray, relu: bool, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """Optional ReLU, then [vmin, vmax] (default: the map's own min and max) to [0, 1], clipped;
    an empty range maps everything to 0."""
    values = grid_map.astype(np.float64)
    if relu:
        values = np.maximum(values, 0.0)
    low = values.min() if vmin is None else vmin
    high = values.max() if vmax is None else vmax
    if not high > low:
        return np.zeros_like(values)
    return np.clip((values - low) / (high - low), 0.0, 1.0)


def map_range(grid_map: np.ndarray, relu: bool = False) -> tuple[float, float]:
    """(min, max) of a map after the optional ReLU: the per-map colour range."""
    values = np.maximum(grid_map, 0.0) if relu else grid_map
    return float(values.min()), float(values.max())


def _upsample(grid_values: np.ndarray, height: int, width: int) -> np.ndarray:
    """(grid_h, grid_w) -> (height, width) by bilinear interpolation (PIL, pixel-centre aligned)."""
    image = Image.fromarray(grid_values.astype(np.float32))  # mode "F"
    return np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))


def _draw_marker(rgb: np.ndarray, grid_shape: tuple[int, int], marker: tuple[int, int]) -> None:
    """Draw, in place, a rectangle outline around patch ``marker`` = (row, col) of an image split into grid_shape."""
    grid_h, grid_w = grid_shape
    row, col = marker
    if not (0 <= row < grid_h and 0 <= col < grid_w):
        raise ValueError(f"marker {marker} is outside the {grid_h}x{grid_w} grid")
    height, width = rgb.shape[:2]
    patch_h, patch_w = height / grid_h, width / grid_w
    top, bottom = round(row * patch_h), round((row + 1) * patch_h)
    left, right = round(col * patch_w), round((col + 1) * patch_w)
    line = max(1, round(MARKER_WIDTH_FRACTION * min(patch_h, patch_w)))
    rgb[top:top + line, left:right] = MARKER_COLOR
    rgb[bottom - line:bottom, left:right] = MARKER_COLOR
    rgb[top:bottom, left:left + line] = MARKER_COLOR
    rgb[top:bottom, right - line:right] = MARKER_COLOR


def overlay(rgb: np.ndarray, grid_map: np.ndarray, cmap: str = "inferno", alpha: float = 0.55,
            relu: bool = False, marker: tuple[int, int] | None = None, vmin: float | None = None,
            vmax: float | None = None, mask: np.ndarray | None = None) -> np.ndarray:
    """Blend a (grid_h, grid_w) map over an (H, W, 3) uint8 image; returns (H, W, 3) uint8.

    The map is optionally ReLU'd, min-max normalised (a constant map shows as the colormap's low end),
    bilinearly upsampled to (H, W), coloured with ``cmap`` and alpha-blended (``alpha`` = weight of the
    map). ``vmin``/``vmax`` fix the colour range (values outside are clipped). ``marker`` = (row, col)
    outlines that patch, patch size (H / grid_h, W / grid_w) pixels. ``mask`` (grid_h, grid_w) bool
    darkens the patches outside it (DINO-style thresholded maps).
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 image, got shape {rgb.shape} dtype {rgb.dtype}")
    if grid_map.ndim != 2:
        raise ValueError(f"expected a (grid_h, grid_w) map, got shape {grid_map.shape}")
    if mask is not None and mask.shape != grid_map.shape:
        raise ValueError(f"mask {mask.shape} does not match the map {grid_map.shape}")
    height, width = rgb.shape[:2]
    upsampled = _upsample(_normalized(grid_map, relu, vmin, vmax), height, width)  # (H, W) in [0, 1]
    bright, dim = _blend_tables(cmap, float(alpha))
    # out = rint(255 * ((1 - alpha) * rgb / 255 + alpha * colour)), read from tables of every (colour, level)
    flat = (_color_index(upsampled, matplotlib.colormaps[cmap].N)[..., None] * 256 + rgb) * 3 + np.arange(3)
    out = bright.take(flat)
    if mask is not None:
        rows = np.minimum(np.arange(height) * mask.shape[0] // height, mask.shape[0] - 1)
        cols = np.minimum(np.arange(width) * mask.shape[1] // width, mask.shape[1] - 1)
        outside = ~mask[rows][:, cols]
        out[outside] = dim.take(flat[outside])
    if marker is not None:
        _draw_marker(out, grid_map.shape, marker)
    return out


def _color_index(values: np.ndarray, n: int) -> np.ndarray:
    """Row of a colormap's lookup table for each value in [0, 1], by matplotlib's own rule
    (`Colormap.__call__`: floor(x * N) in the values' dtype, 1 -> N - 1, below 0 -> N (under), at or past
    N -> N + 1 (over), NaN -> N + 2 (bad)); tested equal to matplotlib's colours."""
    scaled = np.array(values, copy=True)
    scaled *= n
    scaled[scaled == n] = n - 1
    under, over, bad = scaled < 0, scaled >= n, np.isnan(scaled)
    with np.errstate(invalid="ignore"):
        index = scaled.astype(np.intp)
    index[under], index[over], index[bad] = n, n + 1, n + 2
    return index


@functools.lru_cache(maxsize=8)
def _blend_tables(cmap: str, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(bright, dimmed) uint8 tables of `overlay`'s blend, (N + 3, 256, 3) flattened: for colormap row c
    (N colours, then under, over and bad), image level r and channel k,
    bright = rint(255 * ((1 - alpha) * r / 255 + alpha * colour_ck)) and dimmed = the same of MASK_DIM times
    the blend, computed with the very float64 operations a per-pixel blend would make (so `overlay` reads
    the same bytes from a lookup, ≈ 4x faster at 224 px)."""
    colormap = matplotlib.colormaps[cmap]
    colors = np.vstack([colormap(np.arange(colormap.N)), colormap.get_under(), colormap.get_over(),
                        colormap.get_bad()])[:, None, :3]  # (N + 3, 1, 3) float64
    blended = (1.0 - alpha) * (np.arange(256)[None, :, None] / 255.0) + alpha * colors  # (N + 3, 256, 3)
    return tuple(np.clip(np.rint(b * 255.0), 0, 255).astype(np.uint8).ravel() for b in (blended, MASK_DIM * blended))


def _colorbar(fig: Figure, low: float, high: float, unit: str, cmap: str = "inferno", **where):
    mappable = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(low, high if high > low else low + 1e-12),
                                            cmap=cmap)
    bar = fig.colorbar(mappable, **where)
    bar.set_label(unit, fontsize="small")
    bar.ax.tick_params(labelsize="x-small")
    return bar


def maps_figure(rgb: np.ndarray, maps: dict[str, np.ndarray], relu_names: tuple[str, ...] = (),
                marker: tuple[int, int] | None = None, units: dict[str, str] | None = None,
                ranges: dict[str, tuple[float, float]] | None = None, title: str = "") -> Figure:
    """One row of overlays, one per named (grid_h, grid_w) map, each with a colour bar labelled with its
    unit (``units``, default "value"). Maps named in ``relu_names`` are ReLU'd; ``ranges`` fixes a map's
    colour range (default: its own min-max)."""
    if not maps:
        raise ValueError("no maps to show")
    height, width = rgb.shape[:2]
    panel_w = PANEL_INCHES * max(1.0, width / height)
    fig = Figure(figsize=((panel_w + 1.0) * len(maps), PANEL_INCHES + (0.4 if title else 0.0)), layout="constrained")
    for position, (name, grid_map) in enumerate(maps.items(), start=1):
        relu = name in relu_names
        low, high = (ranges or {}).get(name) or map_range(grid_map, relu)
        ax = fig.add_subplot(1, len(maps), position)
        ax.imshow(overlay(rgb, grid_map, relu=relu, marker=marker, vmin=low, vmax=high))
        ax.set_title(textwrap.fill(name, TITLE_CHARS), fontsize="medium")
        ax.set_axis_off()
        _colorbar(fig, low, high, (units or {}).get(name, "value"), ax=ax, fraction=0.046, pad=0.02)
    if title:
        chars = int(fig.get_figwidth() * 11)
        fig.suptitle("\n".join(textwrap.fill(part, chars) for part in title.split("\n")), fontsize="medium")
    return fig


TEXT_MASKS = 512  # rendered text masks a font keeps (each a few KB: a tick label or one caption line)


class _RememberingFont(ImageFont.FreeTypeFont):
    """A FreeType font that keeps the masks it renders (least recently used dropped past TEXT_MASKS).

    A slider redraw draws mostly the same tick labels, unit and caption lines again, and FreeType's
    rendering was ≈ 40 % of a `map_panel` (≈ 5 of 12 ms for DeiT-Ti's 224 px crop). `ImageDraw.text`
    asks ``getmask2`` for a mask and only reads it, so the panel's pixels are those of a plain font
    (tested bit for bit). Arguments that cannot be a key (a list of font features) are rendered afresh."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # Gradio draws panels of several sessions in threads

    def getmask2(self, text, *args, **kwargs):
        try:
            key = (text, args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return super().getmask2(text, *args, **kwargs)
        with self._lock:
            if key in self._masks:
                self._masks.move_to_end(key)
                return self._masks[key]
        found = super().getmask2(text, *args, **kwargs)
        with self._lock:
            self._masks[key] = found
            if len(self._masks) > TEXT_MASKS:
                self._masks.popitem(last=False)
        return found


@functools.lru_cache(maxsize=4)
def _font(size: int) -> ImageFont.FreeTypeFont:
    """Matplotlib's own DejaVu Sans at ``size`` pixels, for text drawn with PIL (masks kept: `_RememberingFont`)."""
    return _RememberingFont(font_manager.findfont("DejaVu Sans"), size)


def map_panel(rgb: np.ndarray, grid_map: np.ndarray, caption: str, unit: str, vmin: float | None = None,
              vmax: float | None = None, relu: bool = False, marker: tuple[int, int] | None = None,
              mask: np.ndarray | None = None, cmap: str = "inferno") -> np.ndarray:
    """One map as an (H', W', 3) uint8 picture: the overlay (`overlay`) at its own pixels in the top-left
    corner, so that pixel (x, y) of the panel is pixel (x, y) of the crop; a colour bar with its range
    and ``unit`` to the right; the ``caption`` (what the map is: model, layer, head, class, settings)
    wrapped underneath. Drawn with PIL, not a matplotlib figure, so a slider redraw stays fast."""
    low, high = map_range(grid_map, relu) if vmin is None or vmax is None else (vmin, vmax)
    image = overlay(rgb, grid_map, cmap, relu=relu, marker=marker, vmin=low, vmax=high, mask=mask)
    height, width = image.shape[:2]
    text = _font(11)
    total_w = width + COLORBAR_PIXELS
    chars = max(20, total_w // 6)
    lines = [line for part in caption.split("\n") for line in textwrap.wrap(part, chars)]
    caption_h = CAPTION_LINE_PIXELS * len(lines) + 8
    panel = Image.new("RGB", (total_w, height + caption_h), (255, 255, 255))
    panel.paste(Image.fromarray(image), (0, 0))
    pen = ImageDraw.Draw(panel)
    _draw_colorbar(panel, pen, width + 8, 6, max(7, height - 6), low, high, unit, cmap)
    for index, line in enumerate(lines):
        pen.text((4, height + 4 + index * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=text)
    return np.asarray(panel)


def _draw_colorbar(panel: Image.Image, pen: ImageDraw.ImageDraw, left: int, top: int, bottom: int, low: float,
                   high: float, unit: str, cmap: str) -> None:
    """A colour bar of ``cmap`` from ``low`` (row ``bottom`` - 1) to ``high`` (row ``top``), 12 pixels wide from
    column ``left``, outlined, with up to five ticks labelled to its right and ``unit`` written upwards at
    ``left + COLORBAR_PIXELS - 24``: the column `map_panel` keeps right of its map."""
    small = _font(10)
    ramp = matplotlib.colormaps[cmap](np.linspace(1.0, 0.0, bottom - top))[:, :3]  # (rows, 3), high at the top
    bar = np.repeat((ramp * 255).astype(np.uint8)[:, None], 12, axis=1)  # (rows, 12, 3)
    panel.paste(Image.fromarray(bar), (left, top))
    pen.rectangle((left, top, left + 11, bottom - 1), outline=(0, 0, 0))
    if high > low:
        for value in matplotlib.ticker.MaxNLocator(5).tick_values(low, high):
            if low - 1e-12 <= value <= high + 1e-12:
                y = bottom - 1 - (value - low) / (high - low) * (bottom - top - 1)
                pen.line((left + 12, y, left + 15, y), fill=(0, 0, 0))
                pen.text((left + 18, y), f"{value:.3g}", fill=(0, 0, 0), font=small, anchor="lm")
    else:
        pen.text((left + 18, bottom - 1), f"{low:.3g}", fill=(0, 0, 0), font=small, anchor="lm")
    _write_upwards(panel, unit, left + COLORBAR_PIXELS - 24, top, bottom - top)


def _write_upwards(panel: Image.Image, text: str, left: int, top: int, length: int) -> None:
    """``text`` in 10-pixel DejaVu Sans, written bottom to top in the 14-pixel column from ``left``, centred
    on the ``length`` rows from ``top`` (an axis or colour bar label)."""
    label = Image.new("RGB", (max(1, length), 14), (255, 255, 255))
    ImageDraw.Draw(label).text((label.width // 2, 7), text, fill=(0, 0, 0), font=_font(10), anchor="mm")
    panel.paste(label.rotate(90, expand=True), (left, top))


def titled(picture: np.ndarray, title: str) -> np.ndarray:
    """``picture`` (H, W, 3) uint8 under a white band holding ``title`` (lines split at "\\n", then wrapped
    to the width), 11-pixel DejaVu Sans; the picture itself when the title is empty."""
    width = picture.shape[1]
    chars = max(20, width // 7)  # 11-pixel DejaVu Sans: about 7 pixels a character
    lines = [line for part in title.split("\n") for line in textwrap.wrap(part, chars)] if title else []
    if not lines:
        return picture
    band = CAPTION_LINE_PIXELS * len(lines) + 8
    out = np.full((band + picture.shape[0], width, 3), 255, dtype=np.uint8)
    out[band:] = picture
    image = Image.fromarray(out)
    pen, text = ImageDraw.Draw(image), _font(11)
    for index, line in enumerate(lines):
        pen.text((4, 4 + index * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=text)
    return np.asarray(image)


MOSAIC_COLUMNS = 4  # map panels per row of maps_mosaic: the four maps of a pass, AttnLRP and LeGrad below
MOSAIC_GAP = 10  # white pixels between two panels of maps_mosaic


def maps_mosaic(rgb: np.ndarray, maps: dict[str, np.ndarray], relu_names: tuple[str, ...] = (),
                marker: tuple[int, int] | None = None, units: dict[str, str] | None = None,
                ranges: dict[str, tuple[float, float]] | None = None, title: str = "",
                columns: int = MOSAIC_COLUMNS) -> np.ndarray:
    """What `maps_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL: one `map_panel` per named
    (grid_h, grid_w) map (the overlay at the crop's own pixels, its colour bar labelled with its unit from
    ``units``, default "value", and the map's name as its caption), ``columns`` panels per row left to
    right, ``MOSAIC_GAP`` white pixels apart, under the wrapped ``title``. Maps named in ``relu_names``
    are ReLU'd; ``ranges`` fixes a map's colour range (default: its own min-max, `map_range`). A matplotlib
    figure of four maps took ≈ 0.43 s to draw; these panels take ≈ 3 ms each."""
    if not maps:
        raise ValueError("no maps to show")
    if columns < 1:
        raise ValueError(f"columns must be at least 1, got {columns}")
    panels = []
    for name, grid_map in maps.items():
        relu = name in relu_names
        low, high = (ranges or {}).get(name) or map_range(grid_map, relu)
        panels.append(map_panel(rgb, grid_map, name, (units or {}).get(name, "value"), vmin=low, vmax=high,
                                relu=relu, marker=marker))
    return titled(grid_of(panels, columns), title)


def grid_of(pictures: list[np.ndarray], columns: int) -> np.ndarray:
    """(H, W, 3) uint8 white canvas holding ``pictures`` left to right, ``columns`` to a row, each at the top
    left of its cell, MOSAIC_GAP pixels apart; a row is as tall as its tallest picture."""
    rows = [pictures[start:start + columns] for start in range(0, len(pictures), columns)]
    row_heights = [max(p.shape[0] for p in row) for row in rows]
    width = max(sum(p.shape[1] for p in row) + MOSAIC_GAP * (len(row) - 1) for row in rows)
    out = np.full((sum(row_heights) + MOSAIC_GAP * (len(rows) - 1), width, 3), 255, dtype=np.uint8)
    top = 0
    for row, row_h in zip(rows, row_heights):
        left = 0
        for p in row:
            out[top:top + p.shape[0], left:left + p.shape[1]] = p
            left += p.shape[1] + MOSAIC_GAP
        top += row_h + MOSAIC_GAP
    return out


HEAD_TILE_PIXELS = 224  # longest side of one head's overlay in heads_mosaic (larger crops are scaled down)


def heads_mosaic(rgb: np.ndarray, maps: np.ndarray, titles: list[str], unit: str, title: str = "",
                 vmin: float | None = None, vmax: float | None = None, masks: np.ndarray | None = None,
                 columns: int = 6) -> np.ndarray:
    """Every head of one layer as an (H, W, 3) uint8 picture drawn with PIL (a matplotlib figure of it took
    ≈ 30x as long; `bench.bench_upload`): every head (``maps`` (heads, grid_h, grid_w)) as an overlay
    (`overlay`) on one shared colour range (default: the
    min-max over all heads) on the photo scaled (bilinear) to at most HEAD_TILE_PIXELS a side, its title above
    it, ``columns`` heads to a row; one colour bar labelled with ``unit`` right of the grid, spanning it; the
    wrapped ``title`` above all. ``masks`` (heads, grid_h, grid_w) bool darkens what lies outside each head's
    threshold mask (Caron et al. 2021, DINO, Fig. 3)."""
    heads = maps.shape[0]
    if len(titles) != heads:
        raise ValueError(f"{heads} maps but {len(titles)} titles")
    if columns < 1:
        raise ValueError(f"columns must be at least 1, got {columns}")
    low = float(maps.min()) if vmin is None else vmin
    high = float(maps.max()) if vmax is None else vmax
    height, width = rgb.shape[:2]
    shrink = min(1.0, HEAD_TILE_PIXELS / max(height, width))
    size = (max(1, round(width * shrink)), max(1, round(height * shrink)))  # (w, h)
    if shrink < 1.0:  # the photo scaled once, each head coloured at the tile's size (5x less work at 518 px)
        rgb = np.asarray(Image.fromarray(rgb).resize(size, Image.BILINEAR))
    small = _font(10)
    chars = max(10, size[0] // 6)
    wrapped = [textwrap.wrap(t, chars) or [""] for t in titles]
    head_h = CAPTION_LINE_PIXELS * max(len(lines) for lines in wrapped) + 4
    tiles = []
    for index in range(heads):
        shown = overlay(rgb, maps[index], vmin=low, vmax=high, mask=None if masks is None else masks[index])
        tile = Image.new("RGB", (size[0], head_h + size[1]), (255, 255, 255))
        tile.paste(Image.fromarray(shown), (0, head_h))
        pen = ImageDraw.Draw(tile)
        for row, line in enumerate(wrapped[index]):
            pen.text((0, row * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=small)
        tiles.append(np.asarray(tile))
    grid = grid_of(tiles, columns)
    out = Image.new("RGB", (grid.shape[1] + COLORBAR_PIXELS, grid.shape[0]), (255, 255, 255))
    out.paste(Image.fromarray(grid), (0, 0))
    _draw_colorbar(out, ImageDraw.Draw(out), grid.shape[1] + 8, head_h, max(head_h + 1, grid.shape[0]), low, high,
                   unit, "inferno")
    return titled(np.asarray(out), title)


HEATMAP_CELL_LIMITS = ((12, 80), (10, 34))  # (min, max) pixels of a heatmap_panel cell: (width, height)
HEATMAP_GRID_PIXELS = (260, 400)  # (width, height) a heatmap_panel's cells aim to fill
NOT_FINITE_COLOR = (190, 190, 190)  # a heatmap_panel cell whose value is NaN or infinite


def heatmap_panel(values: np.ndarray, title: str, unit: str, diverging: bool = True,
                  selected: tuple[int, int] | None = None) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """(depth, heads) values as an (H, W, 3) uint8 heatmap drawn with PIL, layer 0 at the top, and the
    (x0, y0, x1, y1) pixel box its cells fill (cell (layer, head) spans x0 + head * w to x0 + (head + 1) * w
    and y0 + layer * h to y0 + (layer + 1) * h, for `ui.heads.cell_at`). What
    `head_plots.head_heatmap_figure` shows: ``diverging`` centres the colours on 0 (RdBu_r from -m to m,
    m = max |value|: red supports the class, blue opposes it), else viridis over the min-max; a colour bar
    labelled with ``unit``; ``selected`` (layer, head) outlined in black; layers and heads numbered; the
    wrapped ``title`` above; a value that is not finite (an overflow under half precision) is a grey cell
    and takes no part in the range. A matplotlib figure of it took ≈ 0.3 s, this ≈ 3 ms."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or 0 in values.shape:
        raise ValueError(f"expected (depth, heads) values, got shape {values.shape}")
    finite = np.isfinite(values)
    values = np.where(finite, values, 0.0)
    depth, heads = values.shape
    (min_w, max_w), (min_h, max_h) = HEATMAP_CELL_LIMITS
    cell_w = int(np.clip(HEATMAP_GRID_PIXELS[0] // heads, min_w, max_w))
    cell_h = int(np.clip(HEATMAP_GRID_PIXELS[1] // depth, min_h, max_h))
    if diverging:
        limit = max(float(np.abs(values).max()), 1e-12)
        low, high, cmap = -limit, limit, "RdBu_r"
        fraction = (values + limit) / (2 * limit)
    else:
        shown = values[finite] if finite.any() else np.zeros(1)
        low, high, cmap = float(shown.min()), float(shown.max()), "viridis"
        fraction = (values - low) / (high - low) if high > low else np.zeros_like(values)
    colours = (matplotlib.colormaps[cmap](np.clip(fraction, 0.0, 1.0))[..., :3] * 255).astype(np.uint8)
    colours[~finite] = NOT_FINITE_COLOR
    cells = np.repeat(np.repeat(colours, cell_h, axis=0), cell_w, axis=1)  # (depth * h, heads * w, 3)
    small = _font(10)
    digits = len(str(depth - 1))
    x0, y0 = 18 + 7 * digits, 4  # room for "layer" and the layer numbers; the title goes above, later
    grid_w, grid_h = heads * cell_w, depth * cell_h
    panel = Image.new("RGB", (x0 + grid_w + COLORBAR_PIXELS, y0 + grid_h + 34), (255, 255, 255))
    panel.paste(Image.fromarray(cells), (x0, y0))
    pen = ImageDraw.Draw(panel)
    if selected is not None and 0 <= selected[0] < depth and 0 <= selected[1] < heads:
        left, top = x0 + selected[1] * cell_w, y0 + selected[0] * cell_h
        pen.rectangle((left, top, left + cell_w - 1, top + cell_h - 1), outline=(0, 0, 0), width=2)
    every = max(1, math.ceil(12 / cell_h))  # layer numbers at least 12 pixels apart
    for layer in range(0, depth, every):
        pen.text((x0 - 3, y0 + (layer + 0.5) * cell_h), str(layer), fill=(0, 0, 0), font=small, anchor="rm")
    every = max(1, math.ceil((7 * len(str(heads - 1)) + 4) / cell_w))
    for head in range(0, heads, every):
        pen.text((x0 + (head + 0.5) * cell_w, y0 + grid_h + 3), str(head), fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((x0 + grid_w / 2, y0 + grid_h + 18), "head", fill=(0, 0, 0), font=small, anchor="mt")
    _write_upwards(panel, "layer", 0, y0, grid_h)
    _draw_colorbar(panel, pen, x0 + grid_w + 8, y0, y0 + grid_h, low, high, unit, cmap)
    body = np.asarray(panel)
    shown = titled(body, title)
    band = shown.shape[0] - body.shape[0]
    return shown, (float(x0), float(y0 + band), float(x0 + grid_w), float(y0 + band + grid_h))


LENS_PLOT_PIXELS = (420, 230)  # (width, height) of lens_panel's axes at least
LENS_DOT_RADIUS = 5  # pixels


def lens_panel(ranks: np.ndarray, probs: np.ndarray, title: str) -> np.ndarray:
    """The logit lens by depth as an (H, W, 3) uint8 picture drawn with PIL: what `head_plots.lens_figure`
    shows (a matplotlib figure of it took ≈ 0.3-0.5 s, this ≈ 3 ms). x: the block after which the lens reads
    (0 .. depth - 1, evenly spaced); y: the rank of the final class, 1 (the top class) at the top, on a
    log10 axis down to the next power of ten at or past the worst rank, a tick per decade; a grey line
    joins the dots, each coloured by the final class's probability (viridis over 0..1, the colour bar
    right); the wrapped ``title`` above."""
    ranks, probs = np.asarray(ranks, dtype=np.float64).ravel(), np.asarray(probs, dtype=np.float64).ravel()
    if len(ranks) == 0 or len(ranks) != len(probs):
        raise ValueError(f"expected one rank and one probability per block, got {len(ranks)} and {len(probs)}")
    if not (np.isfinite(ranks).all() and (ranks >= 1).all()):
        raise ValueError("ranks start at 1 (the top class)")
    depth = len(ranks)
    decades = max(1, math.ceil(math.log10(ranks.max()) - 1e-12))  # the axis runs from 10^0 to 10^decades
    small = _font(10)
    left, top = 52, 8
    plot_w, plot_h = max(LENS_PLOT_PIXELS[0], 24 * depth), LENS_PLOT_PIXELS[1]
    panel = Image.new("RGB", (left + plot_w + COLORBAR_PIXELS, top + plot_h + 36), (255, 255, 255))
    pen = ImageDraw.Draw(panel)
    xs = left + (np.arange(depth) + 0.5) * plot_w / depth
    ys = top + np.log10(ranks) / decades * (plot_h - 1)
    for decade in range(decades + 1):
        y = top + decade / decades * (plot_h - 1)
        pen.line((left - 4, y, left - 1, y), fill=(0, 0, 0))
        pen.text((left - 6, y), f"{10 ** decade:g}", fill=(0, 0, 0), font=small, anchor="rm")
    every = max(1, math.ceil(7 * len(str(depth - 1)) / (plot_w / depth)))
    for block in range(0, depth, every):
        pen.line((xs[block], top + plot_h, xs[block], top + plot_h + 3), fill=(0, 0, 0))
        pen.text((xs[block], top + plot_h + 5), str(block), fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((left + plot_w / 2, top + plot_h + 20), "after block", fill=(0, 0, 0), font=small, anchor="mt")
    _write_upwards(panel, "rank of the final class (1 = top)", 0, top, plot_h)
    pen.line(list(zip(xs.tolist(), ys.tolist())), fill=(128, 128, 128), width=1)
    colours = (matplotlib.colormaps["viridis"](np.clip(probs, 0.0, 1.0))[:, :3] * 255).astype(np.uint8)
    for x, y, colour in zip(xs, ys, colours):
        pen.ellipse((x - LENS_DOT_RADIUS, y - LENS_DOT_RADIUS, x + LENS_DOT_RADIUS, y + LENS_DOT_RADIUS),
                    fill=tuple(int(c) for c in colour))
    pen.rectangle((left - 1, top - LENS_DOT_RADIUS - 1, left + plot_w, top + plot_h + LENS_DOT_RADIUS),
                  outline=(0, 0, 0))
    _draw_colorbar(panel, pen, left + plot_w + 8, top, top + plot_h, 0.0, 1.0, "probability of the final class",
                   "viridis")
    return titled(np.asarray(panel), title)


def outline_region(preview: np.ndarray, box: tuple[float, float, float, float],
                   source_size: tuple[int, int]) -> np.ndarray:
    """The preview of a whole upload (h, w, 3) uint8 with ``box`` = (left, top, right, bottom), in the
    pixels of the upload of (width, height) = ``source_size``, outlined; everything outside it dimmed."""
    height, width = preview.shape[:2]
    scale_x, scale_y = width / source_size[0], height / source_size[1]
    left, top = int(round(box[0] * scale_x)), int(round(box[1] * scale_y))
    right, bottom = int(round(box[2] * scale_x)), int(round(box[3] * scale_y))
    out = (preview.astype(np.float32) * 0.45).astype(np.uint8)
    out[top:bottom, left:right] = preview[top:bottom, left:right]
    image = Image.fromarray(out)
    ImageDraw.Draw(image).rectangle((left, top, max(left, right - 1), max(top, bottom - 1)), outline=OUTLINE_COLOR,
                                    width=max(2, round(min(width, height) / 100)))
    return np.asarray(image)


def attention_distance_figure(distances: np.ndarray, highlight: tuple[int, int | None] | None = None,
                              image_width: int | None = None, title: str = "") -> Figure:
    """Mean attention distance per head against depth (Dosovitskiy et al. 2021, Fig. 7 right).

    ``distances`` is (depth, heads) in pixels; every head is one point at its layer index. ``highlight``
    = (layer, head) is drawn larger in another colour (head None: all heads of that layer). With
    ``image_width`` (pixels) a right-hand axis reads the distance as a fraction of the image width.
    """
    if distances.ndim != 2:
        raise ValueError(f"expected (depth, heads) distances, got shape {distances.shape}")
    depth, heads = distances.shape
    layers = np.repeat(np.arange(depth), heads)  # (depth * heads,)
    fig = Figure(figsize=DISTANCE_FIGURE_INCHES, layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(layers, distances.ravel(), s=12, color=HEAD_COLOR, label="head")
    if highlight is not None:
        layer, head = highlight
        if not 0 <= layer < depth:
            raise ValueError(f"highlighted layer {layer} out of range 0..{depth - 1}")
        if head is not None and not 0 <= head < heads:
            raise ValueError(f"highlighted head {head} out of range 0..{heads - 1}")
        chosen = distances[layer] if head is None else distances[layer, head:head + 1]
        label = f"layer {layer}" if head is None else f"layer {layer}, head {head}"
        ax.scatter(np.full(chosen.shape, layer), chosen, s=HIGHLIGHT_AREA, color=HIGHLIGHT_COLOR, label=label, zorder=3)
        ax.legend(loc="lower right")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(np.arange(depth))
    ax.set_ylim(0.0, 1.08 * float(distances.max()) + 1.0)  # room above the highest dot: nothing clips
    if image_width is not None:
        secondary = ax.secondary_yaxis("right", functions=(lambda d: d / image_width, lambda f: f * image_width))
        secondary.set_ylabel("fraction of image width")
    if title:
        ax.set_title(title)
    return fig


@dataclass(frozen=True)
class DistanceScatter:
    """The attention-distance scatter rendered once; moving the highlight only repaints its dots.

    The background (`distance_scatter`) is drawn once per image, with a legend entry for the highlight;
    `draw` paints the highlighted heads at their pixel centres.
    """

    background: np.ndarray  # (H, W, 3) uint8, the figure without highlighted dots
    points: np.ndarray  # (depth, heads, 2) pixel (x, y) centre of every head's dot in `background`
    radius: float  # radius of a highlighted dot, pixels
    legend: tuple[float, float] | None = None  # (x, y) of the highlight's legend text (left, middle), if any

    def draw(self, highlight: tuple[int, int | None] | None = None) -> np.ndarray:
        """(H, W, 3) uint8 image with `highlight` = (layer, head) (head None: the whole layer) in red."""
        if highlight is None:
            return self.background.copy()
        depth, heads = self.points.shape[:2]
        layer, head = highlight
        if not 0 <= layer < depth or (head is not None and not 0 <= head < heads):
            raise ValueError(f"highlight {highlight} is outside {depth} layers x {heads} heads")
        image = Image.fromarray(self.background)
        pen, colour = ImageDraw.Draw(image), _rgb(HIGHLIGHT_COLOR)
        for x, y in self.points[layer] if head is None else self.points[layer, head:head + 1]:
            pen.ellipse((x - self.radius, y - self.radius, x + self.radius, y + self.radius), fill=colour)
        if self.legend is not None:  # the legend names what is highlighted
            x, y = self.legend
            pen.rectangle((x, y - 7, image.width - 1, y + 7), fill=(255, 255, 255))
            words = f"layer {layer}, every head" if head is None else f"layer {layer}, head {head}"
            pen.text((x, y), f"selected: {words}", fill=(0, 0, 0), font=_font(10), anchor="lm")
        return np.asarray(image)


class DistanceScatterOnce:
    """`distance_scatter` of one image's distances, rendered on the first `draw` and kept: a new image's answer
    does not wait for it (≈ 3 ms with PIL, ≈ 0.2 s when it was a matplotlib figure), which only the
    distance panel needs.
    Two first draws at once may both render it (the same picture; the last one rendered is kept)."""

    def __init__(self, distances: np.ndarray, image_width: int | None = None, title: str = ""):
        self.distances, self.image_width, self.title = np.array(distances, dtype=float), image_width, title
        self._scatter: DistanceScatter | None = None

    @property
    def scatter(self) -> DistanceScatter:
        if self._scatter is None:
            self._scatter = distance_scatter(self.distances, self.image_width, self.title)
        return self._scatter

    def draw(self, highlight: tuple[int, int | None] | None = None) -> np.ndarray:
        """`DistanceScatter.draw` of the scatter, rendered now if it was not yet."""
        return self.scatter.draw(highlight)


def _rgb(colour: str) -> tuple[int, int, int]:
    """A matplotlib colour name as 0-255 integers, for PIL."""
    return tuple(int(round(255 * c)) for c in matplotlib.colors.to_rgb(colour))


SCATTER_PLOT_PIXELS = (380, 280)  # (width, height) of distance_scatter's axes
HEAD_DOT_RADIUS = 2.5  # pixels: a head's dot in distance_scatter
HIGHLIGHT_DOT_RADIUS = 5.5  # pixels: a highlighted head's dot


@dataclass(frozen=True)
class PlotAxes:
    """Framed axes drawn on a white panel (`plot_axes`): a distance scatter's, the faithfulness curves'."""

    panel: Image.Image
    pen: ImageDraw.ImageDraw
    left: int  # pixel column of the plot's left edge
    top: int  # pixel row of the plot's top edge
    width: int  # plot width, pixels
    height: int  # plot height, pixels
    highest: float  # the y value at the top edge (the bottom is 0)

    @property
    def bottom(self) -> int:
        return self.top + self.height - 1

    def row(self, value):
        """Pixel row of a y value (0 at the bottom edge, `highest` at the top, linear)."""
        return self.bottom - value / self.highest * (self.height - 1)

    def dot(self, x: float, y: float, radius: float, colour: tuple) -> None:
        self.pen.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)


def plot_axes(highest: float, x_ticks: list[tuple[float, str]], x_label: str, y_label: str,
              image_width: int | None = None, plot: tuple[int, int] = SCATTER_PLOT_PIXELS, below: int = 28,
              legend: int = 0) -> PlotAxes:
    """A white panel with framed axes of `plot` = (width, height) pixels: y from 0 to `highest` (about six
    round ticks, `y_label` written upwards on the left); x ticks at (pixel offset in the plot, label) with
    `x_label` under them, then `below` pixels for a legend; with ``image_width`` a right-hand axis reads y
    as a fraction of that width. ``legend``: how far the widest legend line reaches right of the plot's left
    edge, pixels; the panel widens to hold it."""
    small = _font(10)
    left, top = 58, 8
    plot_w, plot_h = plot
    right = 70 if image_width else 10
    panel = Image.new("RGB", (max(left + plot_w + right, left + legend + 10), top + plot_h + 28 + below),
                      (255, 255, 255))
    axes = PlotAxes(panel, ImageDraw.Draw(panel), left, top, plot_w, plot_h, highest)
    pen, bottom, row = axes.pen, axes.bottom, axes.row
    for value in matplotlib.ticker.MaxNLocator(6).tick_values(0.0, highest):
        if 0.0 <= value <= highest:
            pen.line((left - 4, row(value), left - 1, row(value)), fill=(0, 0, 0))
            pen.text((left - 6, row(value)), f"{value:g}", fill=(0, 0, 0), font=small, anchor="rm")
    if image_width:
        for fraction in matplotlib.ticker.MaxNLocator(6).tick_values(0.0, highest / image_width):
            if 0.0 <= fraction * image_width <= highest:
                y = row(fraction * image_width)
                pen.line((left + plot_w, y, left + plot_w + 3, y), fill=(0, 0, 0))
                pen.text((left + plot_w + 6, y), f"{fraction:g}", fill=(0, 0, 0), font=small, anchor="lm")
        _write_upwards(panel, "fraction of image width", left + plot_w + right - 16, top, plot_h)
    for x, label in x_ticks:
        pen.line((left + x, bottom + 1, left + x, bottom + 4), fill=(0, 0, 0))
        pen.text((left + x, bottom + 6), label, fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((left + plot_w / 2, bottom + 20), x_label, fill=(0, 0, 0), font=small, anchor="mt")
    _write_upwards(panel, y_label, 0, top, plot_h)
    pen.rectangle((left - 1, top - 1, left + plot_w, bottom + 1), outline=(0, 0, 0))
    return axes


def distance_scatter(distances: np.ndarray, image_width: int | None = None, title: str = "",
                     selectable: bool = True) -> DistanceScatter:
    """What `attention_distance_figure` shows, drawn once with PIL, with the pixel centre of every head's dot
    (a matplotlib figure of it took ≈ 0.2 s, this ≈ 5 ms): every head a dot at its layer (x, the layers
    evenly spaced) and mean attention distance (y, pixels, from 0 to 1.08 x the largest + 1 so no dot
    clips); with ``image_width`` a right-hand axis reads the distance as a fraction of the image width; the
    legend (a head, and with ``selectable`` the selected layer / head) sits under the axes, where it hides
    no dot."""
    distances = np.asarray(distances, dtype=np.float64)
    if distances.ndim != 2 or 0 in distances.shape:
        raise ValueError(f"expected (depth, heads) distances, got shape {distances.shape}")
    if not np.isfinite(distances).all():
        raise ValueError("attention distances must be finite")
    depth, heads = distances.shape
    plot_w = SCATTER_PLOT_PIXELS[0]
    offsets = (np.arange(depth) + 0.5) * plot_w / depth
    every = max(1, math.ceil((7 * len(str(depth - 1)) + 4) / (plot_w / depth)))
    axes = plot_axes(1.08 * float(distances.max()) + 1.0,
                     [(offsets[layer], str(layer)) for layer in range(0, depth, every)],
                     "network depth (layer)", "mean attention distance (pixels)", image_width)
    head_colour, highlight_colour, small = _rgb(HEAD_COLOR), _rgb(HIGHLIGHT_COLOR), _font(10)
    columns = axes.left + offsets
    points = np.stack([np.broadcast_to(columns[:, None], distances.shape), axes.row(distances)], axis=-1)  # (depth, heads, 2)
    for x, y in points.reshape(-1, 2):
        axes.dot(x, y, HEAD_DOT_RADIUS, head_colour)
    legend_y, left = axes.bottom + 42, axes.left
    axes.dot(left + 8, legend_y, HEAD_DOT_RADIUS, head_colour)
    axes.pen.text((left + 18, legend_y), "head", fill=(0, 0, 0), font=small, anchor="lm")
    if selectable:
        axes.dot(left + 78, legend_y, HIGHLIGHT_DOT_RADIUS, highlight_colour)
        axes.pen.text((left + 90, legend_y), "selected layer / head", fill=(0, 0, 0), font=small, anchor="lm")
    body = np.asarray(axes.panel)
    background = titled(body, title)
    band = background.shape[0] - body.shape[0]  # the title's, above
    points[..., 1] += band
    return DistanceScatter(background=background.copy(), points=points, radius=HIGHLIGHT_DOT_RADIUS,
                           legend=(left + 90, legend_y + band) if selectable else None)


PNG_LEVEL = 1  # zlib level of the PNGs the app sends (`encode_png`), not PIL's default 6
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_COLOUR_TYPES = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type: greyscale, truecolour, truecolour + alpha


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data (ISO/IEC 15948, section 5.3)."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def encode_png(picture: np.ndarray) -> bytes:
    """An (H, W) or (H, W, 3|4) uint8 picture as lossless PNG bytes (ISO/IEC 15948): 8 bits per sample,
    greyscale, RGB or RGBA, not interlaced; every row but the first filtered with filter type 2 ("Up":
    each byte minus the byte above it, modulo 256; the first row unfiltered, type 0), the rows one zlib
    stream at level PNG_LEVEL.

    What a slider redraw waits for is mostly this encoding: at PIL's default level 6 a DeiT-Ti map panel
    took ≈ 22 ms to encode, against ≈ 2.5 ms to draw. PIL at level 1 tries all five filters on every row
    and keeps the best (adaptive filtering); one fixed filter, in numpy, takes about half its time for a
    file about 6 % larger (bench/bench_render.py). Any PNG decoder reads it back to the same pixels
    (tests/test_plotting.py: PIL, and Chromium's own decoder)."""
    picture = np.asarray(picture)
    channels = 1 if picture.ndim == 2 else picture.shape[-1] if picture.ndim == 3 else 0
    if picture.dtype != np.uint8 or channels not in PNG_COLOUR_TYPES or 0 in picture.shape:
        raise ValueError(f"encode_png takes a non-empty (H, W) or (H, W, 3|4) uint8 picture, "
                         f"not {picture.dtype} {picture.shape}")
    height, width = picture.shape[:2]
    rows = picture.reshape(height, width * channels)
    filtered = np.empty((height, width * channels + 1), np.uint8)  # each row: its filter type, then its bytes
    filtered[0, 0], filtered[0, 1:] = 0, rows[0]
    filtered[1:, 0] = 2
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # uint8: modulo 256, as the filter is defined
    header = struct.pack(">IIBBBBB", width, height, 8, PNG_COLOUR_TYPES[channels], 0, 0, 0)
    return (PNG_SIGNATURE + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(filtered.tobytes(), PNG_LEVEL)) + _png_chunk(b"IEND", b""))


def figure_to_png(fig: Figure) -> bytes:
    """Render a Figure to PNG bytes with the Agg canvas."""
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


def figure_to_rgb(fig: Figure) -> np.ndarray:
    """Render a Figure to an (H, W, 3) uint8 array with the Agg canvas."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()

"""What every picture shares: numbers to colours, fonts, colour bars, titles, axes, grids and PNG bytes.

Display decisions live in `plots` and only there: the optional ReLU, min-max normalisation, bilinear
upsampling to the image and the colormap are here; each subject's pictures (maps, heads, distance, the
model, comparisons, faithfulness) are in a module of their own, built from these helpers. Object API
only (no pyplot), no torch, no gradio.
"""
from __future__ import annotations

import functools
import io
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib import font_manager
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

MASK_DIM = 0.3  # brightness kept outside a threshold mask
SMALL_TEXT = 12  # pixels: tick labels, axis labels, legends and tile titles (never smaller on a screen)
TEXT = 13  # pixels: captions and titles
COLORBAR_PIXELS = 100  # width of map_panel's colour bar column, tick labels and unit included
CAPTION_LINE_PIXELS = 16  # height of one caption line under a map_panel
MOSAIC_GAP = 10  # white pixels between two panels of maps_panel
SCATTER_PLOT_PIXELS = (380, 280)  # (width, height) of attention_distance_panel's axes


def normalized(grid_map: np.ndarray, relu: bool, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
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


def upsample(grid_values: np.ndarray, height: int, width: int) -> np.ndarray:
    """(grid_h, grid_w) -> (height, width) by bilinear interpolation (PIL, pixel-centre aligned)."""
    image = Image.fromarray(grid_values.astype(np.float32))  # mode "F"
    return np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))


def color_index(values: np.ndarray, n: int) -> np.ndarray:
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
def blend_tables(cmap: str, alpha: float) -> tuple[np.ndarray, np.ndarray]:
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


def add_colorbar(fig: Figure, low: float, high: float, unit: str, cmap: str = "inferno", **where):
    """A colour bar from ``low`` to ``high`` labelled with ``unit`` on ``fig``, placed by ``where`` (matplotlib's
    ``Figure.colorbar`` keywords, e.g. ``ax=``); a constant range is widened by 1e-12 so it still draws."""
    mappable = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(low, high if high > low else low + 1e-12),
                                            cmap=cmap)
    bar = fig.colorbar(mappable, **where)
    bar.set_label(unit, fontsize="small")
    bar.ax.tick_params(labelsize="x-small")
    return bar


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
def font_of(size: int) -> ImageFont.FreeTypeFont:
    """Matplotlib's own DejaVu Sans at ``size`` pixels, for text drawn with PIL (masks kept: `_RememberingFont`)."""
    return _RememberingFont(font_manager.findfont("DejaVu Sans"), size)


def draw_colorbar(panel: Image.Image, pen: ImageDraw.ImageDraw, left: int, top: int, bottom: int, low: float,
                   high: float, unit: str, cmap: str) -> None:
    """A colour bar of ``cmap`` from ``low`` (row ``bottom`` - 1) to ``high`` (row ``top``), 12 pixels wide from
    column ``left``, outlined, with up to five ticks labelled to its right and ``unit`` written upwards at
    ``left + COLORBAR_PIXELS - 24``: the column `map_panel` keeps right of its map."""
    small = font_of(SMALL_TEXT)
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
    write_upwards(panel, unit, left + COLORBAR_PIXELS - 24, top, bottom - top)


def write_upwards(panel: Image.Image, text: str, left: int, top: int, length: int) -> None:
    """``text`` in SMALL_TEXT-pixel DejaVu Sans, written bottom to top in the 16-pixel column from ``left``,
    centred on the ``length`` rows from ``top`` (an axis or colour bar label)."""
    label = Image.new("RGB", (max(1, length), 16), (255, 255, 255))
    ImageDraw.Draw(label).text((label.width // 2, 8), text, fill=(0, 0, 0), font=font_of(SMALL_TEXT), anchor="mm")
    panel.paste(label.rotate(90, expand=True), (left, top))


def wrap_to(text: str, width: int, font: ImageFont.FreeTypeFont) -> list[str]:
    """``text`` as lines no wider than ``width`` pixels in ``font`` (split at "\\n", then between words, a
    word longer than the width on a line of its own); measured, not guessed from a character count."""
    lines = []
    for part in text.split("\n"):
        line = ""
        for word in part.split():
            candidate = f"{line} {word}" if line else word
            if line and font.getlength(candidate) > width:
                lines.append(line)
                line = word
            else:
                line = candidate
        if line:
            lines.append(line)
    return lines


def titled(picture: np.ndarray, title: str) -> np.ndarray:
    """``picture`` (H, W, 3) uint8 under a white band holding ``title`` (lines split at "\\n", then wrapped
    to the width), TEXT-pixel DejaVu Sans; the picture itself when the title is empty."""
    width = picture.shape[1]
    text = font_of(TEXT)
    lines = wrap_to(title, max(width, 120) - 8, text) if title else []
    if not lines:
        return picture
    band = CAPTION_LINE_PIXELS * len(lines) + 8
    widest = max(width, 8 + max(int(text.getlength(line)) for line in lines))  # a word wider than the picture
    out = np.full((band + picture.shape[0], widest, 3), 255, dtype=np.uint8)
    out[band:, :width] = picture
    image = Image.fromarray(out)
    pen = ImageDraw.Draw(image)
    for index, line in enumerate(lines):
        pen.text((4, 4 + index * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=text)
    return np.asarray(image)


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


def rgb_of(colour: str) -> tuple[int, int, int]:
    """A matplotlib colour name as 0-255 integers, for PIL."""
    return tuple(int(round(255 * c)) for c in matplotlib.colors.to_rgb(colour))


@dataclass(frozen=True)
class PlotAxes:
    """Framed axes drawn on a white panel (`plot_axes`): a distance scatter's, the faithfulness curves'."""

    panel: Image.Image
    pen: ImageDraw.ImageDraw
    left: int  # pixel column of the plot's left edge
    top: int  # pixel row of the plot's top edge
    width: int  # plot width, pixels
    height: int  # plot height, pixels
    highest: float  # the y value at the top edge
    lowest: float = 0.0  # the y value at the bottom edge

    @property
    def bottom(self) -> int:
        return self.top + self.height - 1

    def row(self, value):
        """Pixel row of a y value (`lowest` at the bottom edge, `highest` at the top, linear)."""
        return self.bottom - (value - self.lowest) / (self.highest - self.lowest) * (self.height - 1)

    def dot(self, x: float, y: float, radius: float, colour: tuple) -> None:
        self.pen.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)


def plot_axes(highest: float, x_ticks: list[tuple[float, str]], x_label: str, y_label: str,
              image_width: int | None = None, plot: tuple[int, int] = SCATTER_PLOT_PIXELS, below: int = 28,
              legend: int = 0, lowest: float = 0.0) -> PlotAxes:
    """A white panel with framed axes of `plot` = (width, height) pixels: y from `lowest` (default 0) to
    `highest` (about six round ticks, `y_label` written upwards on the left); x ticks at (pixel offset in the
    plot, label) with `x_label` under them, then `below` pixels for a legend; with ``image_width`` a
    right-hand axis reads y as a fraction of that width. ``legend``: how far the widest legend line reaches
    right of the plot's left edge, pixels; the panel widens to hold it."""
    if not highest > lowest:
        raise ValueError(f"the y range must not be empty, got {lowest} to {highest}")
    small = font_of(SMALL_TEXT)
    left, top = 62, 8
    plot_w, plot_h = plot
    right = 76 if image_width else 10
    panel = Image.new("RGB", (max(left + plot_w + right, left + legend + 10), top + plot_h + 36 + below),
                      (255, 255, 255))
    axes = PlotAxes(panel, ImageDraw.Draw(panel), left, top, plot_w, plot_h, highest, lowest)
    pen, bottom, row = axes.pen, axes.bottom, axes.row
    for value in matplotlib.ticker.MaxNLocator(6).tick_values(lowest, highest):
        if lowest <= value <= highest:
            pen.line((left - 4, row(value), left - 1, row(value)), fill=(0, 0, 0))
            pen.text((left - 6, row(value)), f"{value:g}", fill=(0, 0, 0), font=small, anchor="rm")
    if image_width:
        for fraction in matplotlib.ticker.MaxNLocator(6).tick_values(0.0, highest / image_width):
            if 0.0 <= fraction * image_width <= highest:
                y = row(fraction * image_width)
                pen.line((left + plot_w, y, left + plot_w + 3, y), fill=(0, 0, 0))
                pen.text((left + plot_w + 6, y), f"{fraction:g}", fill=(0, 0, 0), font=small, anchor="lm")
        write_upwards(panel, "fraction of image width", left + plot_w + right - 18, top, plot_h)
    for x, label in x_ticks:
        pen.line((left + x, bottom + 1, left + x, bottom + 4), fill=(0, 0, 0))
        pen.text((left + x, bottom + 6), label, fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((left + plot_w / 2, bottom + 22), x_label, fill=(0, 0, 0), font=small, anchor="mt")
    write_upwards(panel, y_label, 0, top, plot_h)
    pen.rectangle((left - 1, top - 1, left + plot_w, bottom + 1), outline=(0, 0, 0))
    return axes


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
    takes ≈ 22 ms to encode, against ≈ 2.5 ms to draw. PIL at level 1 tries all five filters on every row
    and keeps the best (adaptive filtering); one fixed filter, in numpy, takes about half its time for a
    file about 6 % larger (bench/bench_render.py). Any PNG decoder reads it back to the same pixels
    (tests/plots/test_plotting.py: PIL, and Chromium's own decoder)."""
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


FIGURE_PAD_INCHES = 0.05  # white margin around everything a saved figure draws


def figure_to_png(fig: Figure) -> bytes:
    """Render a Figure to PNG bytes with the Agg canvas, cut or grown to the box of everything it draws plus
    FIGURE_PAD_INCHES (``bbox_inches="tight"``): a title or label wider than the figure is never clipped."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=FIGURE_PAD_INCHES)
    return buffer.getvalue()


def figure_to_rgb(fig: Figure) -> np.ndarray:
    """Render a Figure to an (H, W, 3) uint8 array, as `figure_to_png` does (nothing clipped)."""
    with Image.open(io.BytesIO(figure_to_png(fig))) as picture:
        return np.asarray(picture.convert("RGB"))

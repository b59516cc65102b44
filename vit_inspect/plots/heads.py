"""Layers x heads heatmaps and the logit lens, as matplotlib figures and PIL panels."""
from __future__ import annotations

import math

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image, ImageDraw

from vit_inspect.plots.canvas import COLORBAR_PIXELS, SMALL_TEXT, draw_colorbar, font_of, titled, write_upwards

HEATMAP_INCHES = (4.0, 5.0)  # (width, height) of a layers x heads heatmap
LENS_INCHES = (6.0, 3.5)


def head_heatmap_figure(values: np.ndarray, title: str, unit: str, diverging: bool = True,
                        selected: tuple[int, int] | None = None) -> Figure:
    """(depth, heads) values as a heatmap, layer 0 at the top; `diverging` centres the colours on 0
    (importance: red supports the class, blue opposes it). `selected` (layer, head) is outlined."""
    values = np.asarray(values, dtype=np.float64)
    fig = Figure(figsize=HEATMAP_INCHES, layout="constrained")
    ax = fig.add_subplot()
    if diverging:
        limit = max(float(np.abs(values).max()), 1e-12)
        image = ax.imshow(values, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    if selected is not None:
        layer, head = selected
        ax.add_patch(Rectangle(
            (head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    ax.set_title(title, fontsize=9, wrap=True)
    fig.colorbar(image, ax=ax, label=unit)
    return fig


def lens_figure(ranks: np.ndarray, probs: np.ndarray, title: str) -> Figure:
    """Rank (log scale, 1 = top) and probability of the final class after each block.
    Each point is coloured by the probability (colour bar)."""
    ranks, probs = np.asarray(ranks), np.asarray(probs, dtype=np.float64)
    blocks = np.arange(len(ranks))
    fig = Figure(figsize=LENS_INCHES, layout="constrained")
    ax = fig.add_subplot()
    points = ax.scatter(blocks, ranks, c=probs, cmap="viridis", vmin=0.0, vmax=1.0, s=40, zorder=3)
    ax.plot(blocks, ranks, color="grey", linewidth=1, zorder=2)
    ax.set_yscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("after block")
    ax.set_ylabel("rank of the final class (1 = top)")
    ax.set_xticks(blocks)
    ax.set_title(title, fontsize=9, wrap=True)
    fig.colorbar(points, ax=ax, label="probability of the final class")
    return fig


HEATMAP_CELL_LIMITS = ((12, 80), (10, 34))  # (min, max) pixels of a head_heatmap_panel cell: (width, height)
HEATMAP_GRID_PIXELS = (260, 400)  # (width, height) a head_heatmap_panel's cells aim to fill
NOT_FINITE_COLOR = (190, 190, 190)  # a head_heatmap_panel cell whose value is NaN or infinite


def head_heatmap_panel(values: np.ndarray, title: str, unit: str, diverging: bool = True,
                  selected: tuple[int, int] | None = None) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """(depth, heads) values as an (H, W, 3) uint8 heatmap drawn with PIL, layer 0 at the top, and the
    (x0, y0, x1, y1) pixel box its cells fill (cell (layer, head) spans x0 + head * w to x0 + (head + 1) * w
    and y0 + layer * h to y0 + (layer + 1) * h, for `ui.heads.cell_at`). What
    `plots.heads.head_heatmap_figure` shows: ``diverging`` centres the colours on 0 (RdBu_r from -m to m,
    m = max |value|: red supports the class, blue opposes it), else viridis over the min-max; a colour bar
    labelled with ``unit``; ``selected`` (layer, head) outlined in black; layers and heads numbered; the
    wrapped ``title`` above; a value that is not finite (an overflow under half precision) is a grey cell
    and takes no part in the range. A matplotlib figure of it takes ≈ 0.3 s, this ≈ 3 ms."""
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
    small = font_of(SMALL_TEXT)
    digits = len(str(depth - 1))
    x0, y0 = 22 + 8 * digits, 4  # room for "layer" and the layer numbers; the title goes above, later
    grid_w, grid_h = heads * cell_w, depth * cell_h
    panel = Image.new("RGB", (x0 + grid_w + COLORBAR_PIXELS, y0 + grid_h + 40), (255, 255, 255))
    panel.paste(Image.fromarray(cells), (x0, y0))
    pen = ImageDraw.Draw(panel)
    if selected is not None and 0 <= selected[0] < depth and 0 <= selected[1] < heads:
        left, top = x0 + selected[1] * cell_w, y0 + selected[0] * cell_h
        pen.rectangle((left, top, left + cell_w - 1, top + cell_h - 1), outline=(0, 0, 0), width=2)
    every = max(1, math.ceil(14 / cell_h))  # layer numbers at least 14 pixels apart
    for layer in range(0, depth, every):
        pen.text((x0 - 3, y0 + (layer + 0.5) * cell_h), str(layer), fill=(0, 0, 0), font=small, anchor="rm")
    every = max(1, math.ceil((8 * len(str(heads - 1)) + 6) / cell_w))
    for head in range(0, heads, every):
        pen.text((x0 + (head + 0.5) * cell_w, y0 + grid_h + 3), str(head), fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((x0 + grid_w / 2, y0 + grid_h + 22), "head", fill=(0, 0, 0), font=small, anchor="mt")
    write_upwards(panel, "layer", 0, y0, grid_h)
    draw_colorbar(panel, pen, x0 + grid_w + 8, y0, y0 + grid_h, low, high, unit, cmap)
    body = np.asarray(panel)
    shown = titled(body, title)
    band = shown.shape[0] - body.shape[0]
    return shown, (float(x0), float(y0 + band), float(x0 + grid_w), float(y0 + band + grid_h))

LENS_PLOT_PIXELS = (420, 230)  # (width, height) of lens_panel's axes at least
LENS_DOT_RADIUS = 5  # pixels


def lens_panel(ranks: np.ndarray, probs: np.ndarray, title: str) -> np.ndarray:
    """The logit lens by depth as an (H, W, 3) uint8 picture drawn with PIL: what `plots.heads.lens_figure`
    shows (a matplotlib figure of it takes ≈ 0.3-0.5 s, this ≈ 3 ms). x: the block after which the lens reads
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
    small = font_of(SMALL_TEXT)
    left, top = 56, 8
    plot_w, plot_h = max(LENS_PLOT_PIXELS[0], 24 * depth), LENS_PLOT_PIXELS[1]
    panel = Image.new("RGB", (left + plot_w + COLORBAR_PIXELS, top + plot_h + 40), (255, 255, 255))
    pen = ImageDraw.Draw(panel)
    xs = left + (np.arange(depth) + 0.5) * plot_w / depth
    ys = top + np.log10(ranks) / decades * (plot_h - 1)
    for decade in range(decades + 1):
        y = top + decade / decades * (plot_h - 1)
        pen.line((left - 4, y, left - 1, y), fill=(0, 0, 0))
        pen.text((left - 6, y), f"{10 ** decade:g}", fill=(0, 0, 0), font=small, anchor="rm")
    every = max(1, math.ceil((8 * len(str(depth - 1)) + 4) / (plot_w / depth)))
    for block in range(0, depth, every):
        pen.line((xs[block], top + plot_h, xs[block], top + plot_h + 3), fill=(0, 0, 0))
        pen.text((xs[block], top + plot_h + 5), str(block), fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((left + plot_w / 2, top + plot_h + 22), "after block", fill=(0, 0, 0), font=small, anchor="mt")
    write_upwards(panel, "rank of the final class (1 = top)", 0, top, plot_h)
    pen.line(list(zip(xs.tolist(), ys.tolist())), fill=(128, 128, 128), width=1)
    colours = (matplotlib.colormaps["viridis"](np.clip(probs, 0.0, 1.0))[:, :3] * 255).astype(np.uint8)
    for x, y, colour in zip(xs, ys, colours):
        pen.ellipse((x - LENS_DOT_RADIUS, y - LENS_DOT_RADIUS, x + LENS_DOT_RADIUS, y + LENS_DOT_RADIUS),
                    fill=tuple(int(c) for c in colour))
    pen.rectangle((left - 1, top - LENS_DOT_RADIUS - 1, left + plot_w, top + plot_h + LENS_DOT_RADIUS),
                  outline=(0, 0, 0))
    draw_colorbar(panel, pen, left + plot_w + 8, top, top + plot_h, 0.0, 1.0, "probability of the final class",
                   "viridis")
    return titled(np.asarray(panel), title)

"""Maps over the image: overlays, one map with its colour bar, mosaics of maps and heads."""
from __future__ import annotations

import textwrap

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from vit_inspect.methods import MethodContext, added, compute_maps
from vit_inspect.methods import get as get_method
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.targets import TargetMaps
from vit_inspect.plots.canvas import (CAPTION_LINE_PIXELS, COLORBAR_PIXELS, SMALL_TEXT, TEXT, add_colorbar,
                                      blend_tables, color_index, draw_colorbar, font_of, grid_of, map_range, normalized,
                                      titled, upsample, wrap_to)

MARKER_COLOR = (0, 255, 255)  # cyan, visible on the inferno/viridis palettes and on most photos
MARKER_WIDTH_FRACTION = 0.125  # marker outline width as a fraction of the smaller patch side (>= 1 px)
PANEL_INCHES = 3.0  # side of one image panel in maps_figure


TITLE_CHARS = 30  # panel titles in maps_figure wrap at this many characters
OUTLINE_COLOR = (0, 255, 255)  # the seen region on the upload preview


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
    upsampled = upsample(normalized(grid_map, relu, vmin, vmax), height, width)  # (H, W) in [0, 1]
    bright, dim = blend_tables(cmap, float(alpha))
    # out = rint(255 * ((1 - alpha) * rgb / 255 + alpha * colour)), read from tables of every (colour, level)
    flat = (color_index(upsampled, matplotlib.colormaps[cmap].N)[..., None] * 256 + rgb) * 3 + np.arange(3)
    out = bright.take(flat)
    if mask is not None:
        rows = np.minimum(np.arange(height) * mask.shape[0] // height, mask.shape[0] - 1)
        cols = np.minimum(np.arange(width) * mask.shape[1] // width, mask.shape[1] - 1)
        outside = ~mask[rows][:, cols]
        out[outside] = dim.take(flat[outside])
    if marker is not None:
        _draw_marker(out, grid_map.shape, marker)
    return out


# The maps of one pass at their default options, as the command line's figure and the notebook's
# `show_all` draw them: key -> (title, unit of the colour bar). Grad-CAM is drawn after a ReLU; the arrays
# keep its sign.
PASS_MAPS = {
    "attention": ("attention (last layer, mean of heads)", "attention weight (probability)"),
    "rollout": ("rollout (mean fusion, all layers)", "rollout weight (fraction)"),
    "gradcam": ("Grad-CAM (last block, ReLU)", "activation × gradient"),
    "chefer": ("gradient-weighted attention", "relevance (logit units)"),
    "legrad": ("LeGrad", "relevance (logit units)"),
    "attnlrp": ("AttnLRP", "relevance (logit units)"),
}
RELU_MAPS = ("gradcam",)  # PASS_MAPS keys drawn after a ReLU
RELEVANCE_MAPS = ("chefer", "legrad", "attnlrp")  # PASS_MAPS keys in the units of the explained score


def pass_units(result: ImageAnalysis) -> dict[str, str]:
    """PASS_MAPS title -> colour-bar unit for this result: relevance is in the units of the score its gradient
    maps explain (``result.score``: "logit", or "cosine" for a text prompt's similarity)."""
    return {title: f"relevance ({result.score} units)" if key in RELEVANCE_MAPS else unit
            for key, (title, unit) in PASS_MAPS.items()}


def titled_pass_maps(result: ImageAnalysis, handle=None) -> tuple[dict[str, np.ndarray], tuple[str, ...],
                                                                   dict[str, str]]:
    """(title -> map, titles drawn after a ReLU, title -> unit) of `pass_maps`, as the figures of every map
    draw them: the built-ins under their `PASS_MAPS` titles, the added methods under their names."""
    maps = pass_maps(result, handle)
    extra = {name: get_method(name) for name in maps if name not in PASS_MAPS}
    titled = {PASS_MAPS[k][0] if k in PASS_MAPS else k: v for k, v in maps.items()}
    relu = (*(PASS_MAPS[k][0] for k in RELU_MAPS), *(k for k, m in extra.items() if m.relu))
    units = pass_units(result) | {k: m.unit.replace("{score}", result.score) for k, m in extra.items()}
    return titled, relu, units


def pass_maps(result: ImageAnalysis, handle=None) -> dict[str, np.ndarray]:
    """PASS_MAPS key -> (grid_h, grid_w) raw map at its default options, for each map this result has:
    raw attention of the last layer (mean of heads, from the readout), attention rollout (Abnar & Zuidema
    2020; mean fusion, every layer), Grad-CAM of the last block, gradient-weighted attention (Chefer et al.
    2021), LeGrad and AttnLRP. A model without a head has the first two only; a pass run with
    ``relevance=False``, or a hand-written model, has no LeGrad or AttnLRP. Then the maps of the methods
    vit_inspect does not ship (`methods.added`: plugins), at their defaults, once per pass; one with passes of
    its own runs on ``handle`` (without it, it is left out, as a method that fails is)."""
    maps = {"attention": result.attention_map(result.depth - 1), "rollout": result.rollout(),
            "gradcam": None if result.gradcam is None else result.gradcam[-1], "chefer": result.chefer,
            "legrad": result.legrad, "attnlrp": result.attnlrp}
    maps = {key: values for key, values in maps.items() if values is not None}
    return maps | compute_maps(MethodContext(result, handle), tuple(added()))[0]


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
        add_colorbar(fig, low, high, (units or {}).get(name, "value"), ax=ax, fraction=0.046, pad=0.02)
    if title:
        chars = int(fig.get_figwidth() * 11)
        fig.suptitle("\n".join(textwrap.fill(part, chars) for part in title.split("\n")), fontsize="medium")
    return fig


def enlarged(rgb: np.ndarray, scale: int) -> np.ndarray:
    """(H, W, 3) -> (scale H, scale W, 3): each pixel a scale x scale square (the model's own pixels, enlarged)."""
    if scale == 1:
        return rgb
    return np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)


def map_panel(rgb: np.ndarray, grid_map: np.ndarray, caption: str, unit: str, vmin: float | None = None,
              vmax: float | None = None, relu: bool = False, marker: tuple[int, int] | None = None,
              mask: np.ndarray | None = None, cmap: str = "inferno", scale: int = 1) -> np.ndarray:
    """One map as an (H', W', 3) uint8 picture: the overlay (`overlay`) on the crop enlarged ``scale`` times
    (each input pixel a scale x scale square, the map upsampled to that size) in the top-left corner, so that
    pixel (x, y) of the panel is pixel (x // scale, y // scale) of the crop; a colour bar with its range and
    ``unit`` to the right; the ``caption`` (what the map is: model, layer, head, class, settings) wrapped
    underneath in TEXT-pixel type, never over the map. Drawn with PIL, not a matplotlib figure, so a slider
    redraw stays fast."""
    if not (isinstance(scale, int) and scale >= 1):
        raise ValueError(f"scale must be a whole number of at least 1, got {scale!r}")
    low, high = map_range(grid_map, relu) if vmin is None or vmax is None else (vmin, vmax)
    image = overlay(enlarged(rgb, scale), grid_map, cmap, relu=relu, marker=marker, vmin=low, vmax=high, mask=mask)
    height, width = image.shape[:2]
    text = font_of(TEXT)
    total_w = width + COLORBAR_PIXELS
    lines = wrap_to(caption, total_w - 8, text)
    caption_h = CAPTION_LINE_PIXELS * len(lines) + 8
    panel = Image.new("RGB", (total_w, height + caption_h), (255, 255, 255))
    panel.paste(Image.fromarray(image), (0, 0))
    pen = ImageDraw.Draw(panel)
    draw_colorbar(panel, pen, width + 8, 6, max(7, height - 6), low, high, unit, cmap)
    for index, line in enumerate(lines):
        pen.text((4, height + 4 + index * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=text)
    return np.asarray(panel)


MOSAIC_COLUMNS = 4  # map panels per row of maps_panel: the four maps of a pass, AttnLRP and LeGrad below



def note_panel(rgb: np.ndarray, sentence: str) -> np.ndarray:
    """A map panel's place taken by a sentence (why a map is missing): the crop greyed, no colour bar (there
    are no values to scale), and the sentence wrapped underneath in TEXT-pixel type."""
    height, width = rgb.shape[:2]
    grey = (255 - (255 - rgb.mean(axis=2, keepdims=True)) * 0.25).astype(np.uint8).repeat(3, axis=2)
    text = font_of(TEXT)
    total_w = width + COLORBAR_PIXELS
    lines = wrap_to(sentence, total_w - 8, text)
    panel = Image.new("RGB", (total_w, height + CAPTION_LINE_PIXELS * len(lines) + 8), (255, 255, 255))
    panel.paste(Image.fromarray(grey), (0, 0))
    pen = ImageDraw.Draw(panel)
    for index, line in enumerate(lines):
        pen.text((4, height + 4 + index * CAPTION_LINE_PIXELS), line, fill=(0, 0, 0), font=text)
    return np.asarray(panel)


def maps_panel(rgb: np.ndarray, maps: dict[str, np.ndarray], relu_names: tuple[str, ...] = (),
                marker: tuple[int, int] | None = None, units: dict[str, str] | None = None,
                ranges: dict[str, tuple[float, float]] | None = None, title: str = "",
                columns: int = MOSAIC_COLUMNS, notes: dict[str, str] | None = None,
                cmaps: dict[str, str] | None = None) -> np.ndarray:
    """What `maps_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL: one `map_panel` per named
    (grid_h, grid_w) map (the overlay at the crop's own pixels, its colour bar labelled with its unit from
    ``units``, default "value", and the map's name as its caption), ``columns`` panels per row left to
    right, ``MOSAIC_GAP`` white pixels apart, under the wrapped ``title``. Maps named in ``relu_names``
    are ReLU'd; ``ranges`` fixes a map's colour range (default: its own min-max, `map_range`). A matplotlib
    figure of four maps takes ≈ 0.43 s to draw; these panels take ≈ 3 ms each. ``cmaps`` names a map's colour
    map (default inferno); each of ``notes`` (name -> sentence) takes a panel of its own after the maps
    (`note_panel`): a map that is missing, and why."""
    if not maps and not notes:
        raise ValueError("no maps to show")
    if columns < 1:
        raise ValueError(f"columns must be at least 1, got {columns}")
    panels = []
    for name, grid_map in maps.items():
        relu = name in relu_names
        low, high = (ranges or {}).get(name) or map_range(grid_map, relu)
        panels.append(map_panel(rgb, grid_map, name, (units or {}).get(name, "value"), vmin=low, vmax=high,
                                relu=relu, marker=marker, cmap=(cmaps or {}).get(name, "inferno")))
    panels += [note_panel(rgb, sentence) for sentence in (notes or {}).values()]
    return titled(grid_of(panels, columns), title)


HEAD_TILE_PIXELS = 216  # longest side of one head's overlay in heads_panel (larger crops are scaled down)


def heads_panel(rgb: np.ndarray, maps: np.ndarray, titles: list[str], unit: str, title: str = "",
                 vmin: float | None = None, vmax: float | None = None, masks: np.ndarray | None = None,
                 columns: int = 6) -> np.ndarray:
    """Every head of one layer as an (H, W, 3) uint8 picture drawn with PIL (a matplotlib figure of it takes
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
    small = font_of(SMALL_TEXT)
    wrapped = [wrap_to(t, size[0], small) or [""] for t in titles]
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
    draw_colorbar(out, ImageDraw.Draw(out), grid.shape[1] + 8, head_h, max(head_h + 1, grid.shape[0]), low, high,
                   unit, "inferno")
    return titled(np.asarray(out), title)


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


def target_maps_figure(rgb: np.ndarray, maps: TargetMaps, title: str) -> Figure:
    """`maps_figure` of a target's maps (`passes.targets.target_maps`): each panel names its method and the blocks
    it read, Grad-CAM drawn after its ReLU, each colour bar in units of the target's score; ``title`` (the model
    and image) is followed by the target and its score."""
    unit = "SAE activation" if maps.target.get("kind") == "sae_feature" else "concept coefficient"
    blocks = maps.legrad_layers
    names = {"gradcam": f"Grad-CAM, block {maps.gradcam_layer} output",
             "legrad": f"LeGrad, blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"LeGrad, block {blocks[0]}",
             "attnlrp": "AttnLRP"}
    units = {"gradcam": "activation × gradient", "legrad": f"relevance ({unit} units)",
             "attnlrp": f"relevance ({unit} units)"}
    shown = {names[k]: v for k, v in maps.maps.items() if v is not None}
    return maps_figure(rgb, shown, relu_names=(names["gradcam"],),
                       units={names[k]: units[k] for k in maps.maps if maps.maps[k] is not None},
                       title=f"{title} · {maps.text} · score {maps.score:.4g}")

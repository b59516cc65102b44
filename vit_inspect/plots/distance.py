"""Mean attention distance per head (ViT paper Fig. 7 right), as a figure and a PIL panel."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from vit_inspect.plots.canvas import SCATTER_PLOT_PIXELS, SMALL_TEXT, font_of, plot_axes, rgb_of, titled

DISTANCE_FIGURE_INCHES = (5.0, 4.0)  # (width, height) of the attention-distance scatter
HIGHLIGHT_COLOR = "tab:red"
HEAD_COLOR = "tab:blue"
HIGHLIGHT_AREA = 60  # scatter marker area of a highlighted head, points²


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

    The background (`attention_distance_panel`) is drawn once per image, with a legend entry for the highlight;
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
        pen, colour = ImageDraw.Draw(image), rgb_of(HIGHLIGHT_COLOR)
        for x, y in self.points[layer] if head is None else self.points[layer, head:head + 1]:
            pen.ellipse((x - self.radius, y - self.radius, x + self.radius, y + self.radius), fill=colour)
        if self.legend is not None:  # the legend names what is highlighted
            x, y = self.legend
            pen.rectangle((x, y - 7, image.width - 1, y + 7), fill=(255, 255, 255))
            words = f"layer {layer}, every head" if head is None else f"layer {layer}, head {head}"
            pen.text((x, y), f"selected: {words}", fill=(0, 0, 0), font=font_of(SMALL_TEXT), anchor="lm")
        return np.asarray(image)


class DistanceScatterOnce:
    """`attention_distance_panel` of one image's distances, rendered on the first `draw` and kept: a new image's answer
    does not wait for it (≈ 3 ms with PIL, ≈ 0.2 s when it was a matplotlib figure), which only the
    distance panel needs.
    Two first draws at once may both render it (the same picture; the last one rendered is kept)."""

    def __init__(self, distances: np.ndarray, image_width: int | None = None, title: str = ""):
        self.distances, self.image_width, self.title = np.array(distances, dtype=float), image_width, title
        self._scatter: DistanceScatter | None = None

    @property
    def scatter(self) -> DistanceScatter:
        if self._scatter is None:
            self._scatter = attention_distance_panel(self.distances, self.image_width, self.title)
        return self._scatter

    def draw(self, highlight: tuple[int, int | None] | None = None) -> np.ndarray:
        """`DistanceScatter.draw` of the scatter, rendered now if it was not yet."""
        return self.scatter.draw(highlight)



HEAD_DOT_RADIUS = 2.5  # pixels: a head's dot in attention_distance_panel
HIGHLIGHT_DOT_RADIUS = 5.5  # pixels: a highlighted head's dot


def attention_distance_panel(distances: np.ndarray, image_width: int | None = None, title: str = "",
                     selectable: bool = True) -> DistanceScatter:
    """What `attention_distance_figure` shows, drawn once with PIL, with the pixel centre of every head's dot
    (a matplotlib figure of it takes ≈ 0.2 s, this ≈ 5 ms): every head a dot at its layer (x, the layers
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
    every = max(1, math.ceil((8 * len(str(depth - 1)) + 6) / (plot_w / depth)))
    axes = plot_axes(1.08 * float(distances.max()) + 1.0,
                     [(offsets[layer], str(layer)) for layer in range(0, depth, every)],
                     "network depth (layer)", "mean attention distance (pixels)", image_width)
    head_colour, highlight_colour, small = rgb_of(HEAD_COLOR), rgb_of(HIGHLIGHT_COLOR), font_of(SMALL_TEXT)
    columns = axes.left + offsets
    points = np.stack([np.broadcast_to(columns[:, None], distances.shape), axes.row(distances)], axis=-1)  # (depth, heads, 2)
    for x, y in points.reshape(-1, 2):
        axes.dot(x, y, HEAD_DOT_RADIUS, head_colour)
    legend_y, left = axes.bottom + 48, axes.left
    axes.dot(left + 8, legend_y, HEAD_DOT_RADIUS, head_colour)
    axes.pen.text((left + 18, legend_y), "head", fill=(0, 0, 0), font=small, anchor="lm")
    if selectable:
        axes.dot(left + 86, legend_y, HIGHLIGHT_DOT_RADIUS, highlight_colour)
        axes.pen.text((left + 98, legend_y), "selected layer / head", fill=(0, 0, 0), font=small, anchor="lm")
    body = np.asarray(axes.panel)
    background = titled(body, title)
    band = background.shape[0] - body.shape[0]  # the title's, above
    points[..., 1] += band
    return DistanceScatter(background=background.copy(), points=points, radius=HIGHLIGHT_DOT_RADIUS,
                           legend=(left + 98, legend_y + band) if selectable else None)

"""Figures of two models side by side, and the DINO / DINOv2 views. Object API only, no torch, no gradio.

Overlays follow `plots.maps.overlay` (each map min-max scaled on its own, Grad-CAM after a ReLU); every
figure names its models, layers (with the relative-depth mapping), heads and settings.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from vit_inspect.analysis.dino import FeaturePCA
from vit_inspect.core.handle import ViTHandle
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots import canvas
from vit_inspect.plots import model as model_plots
from vit_inspect.plots.canvas import SMALL_TEXT, font_of, grid_of, map_range, normalized, plot_axes, rgb_of, titled
from vit_inspect.plots.maps import PANEL_INCHES, heads_panel, map_panel, overlay
from vit_inspect.studies.comparison import MAP_KINDS, AlignedMap, Comparison, layer_words
from vit_inspect.studies.model_report import model_report, pos_similarity_at

MODEL_COLORS = ("tab:blue", "tab:orange")  # model A, model B
DEPTH_AXIS_END = 1.05  # the relative-depth axis runs from 0 to this
COMPARE_PLOT_PIXELS = (460, 300)  # (width, height) of compare_distance_panel's axes
COMPARE_DOT_RADIUS = 3.0  # pixels
MASK_COLOR = "cyan"
TITLE_CHARS = 44


def _scale_bar(fig: Figure, axes, label: str, cmap: str = "inferno", location: str = "right") -> None:
    fig.colorbar(ScalarMappable(Normalize(0.0, 1.0), cmap=cmap), ax=axes, label=label, shrink=0.8, location=location,
                 aspect=20 if location == "right" else 30)


def _where(item: AlignedMap, layer: int, depth: int) -> str:
    """A caption's part saying which map of the model: its layer, all layers, or an added method's defaults."""
    if item.layered:
        return f", {layer_words(layer, depth)}"
    return ", all layers" if item.kind in MAP_KINDS else ", at its defaults"


def aligned_maps_figure(comparison: Comparison, aligned: list[AlignedMap], name_a: str, name_b: str) -> Figure:
    """One row per map kind: model A's map on its own crop, model B's at the aligned layer, and the
    agreement numbers (Spearman, top-10 % overlap) in the row title."""
    if not aligned:
        raise ValueError("no maps to compare")
    a, b = comparison.a, comparison.b
    fig = Figure(figsize=(2 * PANEL_INCHES + 1.2, (PANEL_INCHES + 0.6) * len(aligned) + 0.6), layout="constrained")
    grid = fig.subfigures(len(aligned), 1, squeeze=False)[:, 0]
    for sub, item in zip(grid, aligned):
        axes = sub.subplots(1, 2)
        for ax, result, name, grid_map, layer in ((axes[0], a, name_a, item.map_a, item.layer_a),
                                                  (axes[1], b, name_b, item.map_b, item.layer_b)):
            ax.imshow(overlay(result.rgb, grid_map, relu=item.relu))
            where = _where(item, layer, result.depth)
            target = "" if result.target is None else f", class {result.target}"
            ax.set_title(textwrap.fill(f"{name}{where}{target}", TITLE_CHARS), fontsize="small")
            ax.set_axis_off()
        score = item.agreement
        rho = "n/a" if np.isnan(score.spearman) else f"{score.spearman:.2f}"
        sub.suptitle(textwrap.fill(f"{item.title}: Spearman {rho}, top-{score.fraction:.0%} overlap "
                                   f"{score.top_overlap:.2f} (on a {score.grid[0]}×{score.grid[1]} common grid)", 62),
                     fontsize="medium")
        _scale_bar(sub, axes, "map value, min-max per map" + (" (ReLU)" if item.relu else ""))
    fig.suptitle(textwrap.fill(f"{name_a} vs {name_b}. Layers (0-based) aligned by relative depth (l+1)/L: "
                               f"B's layer = ceil((l+1)·{b.depth}/{a.depth})−1. Attention: mean of heads, readout "
                               f"{a.readout} / {b.readout} token. Agreement over the image region both crops cover.",
                               62), fontsize="medium")
    return fig


def aligned_maps_panel(comparison: Comparison, aligned: list[AlignedMap], name_a: str, name_b: str,
                       classes: tuple[str, str] | None = None) -> np.ndarray:
    """What `aligned_maps_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL (the app's Compare tab
    redraws it when model A's layer changes: a matplotlib figure takes ≈ 0.8 s for two DeiT-Ti, this ≈ 20 ms):
    one row per map kind under its agreement numbers (Spearman, top-10 % overlap), model A's map on its own
    crop beside model B's at the aligned layer, each a `plots.maps.map_panel` with its own colour bar over its
    own range (Grad-CAM after a ReLU) and a caption naming the model, layer (with its relative depth) and
    class (``classes``: each model's class in words, e.g. "tabby (#281)"; default its index); the layer
    mapping and where agreement is measured above all."""
    if not aligned:
        raise ValueError("no maps to compare")
    a, b = comparison.a, comparison.b
    rows = []
    for item in aligned:
        relu = item.relu
        panels = []
        for index, (result, name, grid_map, layer) in enumerate(((a, name_a, item.map_a, item.layer_a),
                                                                  (b, name_b, item.map_b, item.layer_b))):
            where = _where(item, layer, result.depth)
            target = "" if result.target is None or item.kind in ("attention", "rollout") else (
                f", class {classes[index] if classes else result.target}")
            low, high = map_range(grid_map, relu)
            panels.append(map_panel(result.rgb, grid_map, f"{name}{where}{target}",
                                    "map value" + (" (ReLU)" if relu else ""), vmin=low, vmax=high, relu=relu))
        score = item.agreement
        rho = "n/a" if np.isnan(score.spearman) else f"{score.spearman:.2f}"
        rows.append(titled(grid_of(panels, 2), f"{item.title}: Spearman {rho}, top-{score.fraction:.0%} "
                           f"overlap {score.top_overlap:.2f} (on a {score.grid[0]}×{score.grid[1]} common grid)"))
    return titled(grid_of(rows, 1), f"{name_a} vs {name_b}. Layers (0-based) aligned by relative depth (l+1)/L: "
                  f"B's layer = ceil((l+1)·{b.depth}/{a.depth})−1. Attention: mean of heads, readout {a.readout} / "
                  f"{b.readout} token. Agreement over the image region both crops cover.")


def _side_offset(index: int, count: int, depth: int) -> float:
    """Relative-depth shift of model `index` of `count`, so that the dots of layers at the same relative depth
    stand side by side (0.15 of one layer's spacing between neighbours)."""
    return (index - (count - 1) / 2) * 0.15 / depth


def compare_distance_figure(distances: list[np.ndarray], names: list[str], widths: list[int],
                            title: str = "mean attention distance") -> Figure:
    """Every head of every model (one colour per model) against relative depth (l + 1) / L.

    ``distances`` are (depth, heads) in input pixels (Dosovitskiy et al. 2021, Fig. 7 right); ``widths``
    are each model's input width, named in the legend (pixels of different inputs are not the same size).
    """
    fig = Figure(figsize=(6.0, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for index, (dist, name, width) in enumerate(zip(distances, names, widths)):
        depth, heads = dist.shape
        x = np.repeat((np.arange(depth) + 1) / depth, heads)  # (depth * heads,)
        offset = _side_offset(index, len(distances), depth)  # side by side where layers coincide
        ax.scatter(x + offset, dist.ravel(), s=14, color=MODEL_COLORS[index % len(MODEL_COLORS)], alpha=0.8,
                   label=f"{name} ({depth} layers × {heads} heads, input width {width} px)")
    ax.set_xlabel("relative depth (layer + 1) / depth")
    ax.set_ylabel("mean attention distance (input pixels)")
    ax.set_xlim(0.0, DEPTH_AXIS_END)
    ax.set_ylim(bottom=0.0)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title)
    return fig


def compare_distance_panel(distances: list[np.ndarray], names: list[str], widths: list[int],
                             title: str = "mean attention distance") -> tuple[np.ndarray, list[np.ndarray]]:
    """`compare_distance_figure` drawn with PIL (2 ms; the figure takes 118 ms of every Compare run,
    bench_upload 6k): every head of every model a dot in the model's colour at relative depth (l + 1) / L
    (x, 0 to DEPTH_AXIS_END, shifted by `_side_offset`) and its mean attention distance (y, input pixels, 0
    to 1.08 x the largest + 1, so no dot clips); one legend line per model under the axes, naming its
    layers, heads and input width (pixels of different inputs are not the same size).

    Returns the (H, W, 3) uint8 picture and each model's (depth, heads, 2) pixel (x, y) dot centres."""
    arrays = [np.asarray(d, dtype=np.float64) for d in distances]
    if not arrays or len(arrays) != len(names) or len(arrays) != len(widths):
        raise ValueError("expected one name and one input width per model's distances")
    if any(d.ndim != 2 or 0 in d.shape for d in arrays):
        raise ValueError(f"expected (depth, heads) distances, got shapes {[d.shape for d in arrays]}")
    if not all(np.isfinite(d).all() for d in arrays):
        raise ValueError("attention distances must be finite")
    small = font_of(SMALL_TEXT)
    plot_w = COMPARE_PLOT_PIXELS[0]
    labels = [f"{name} ({d.shape[0]} layers × {d.shape[1]} heads, input width {width} px)"
              for d, name, width in zip(arrays, names, widths)]
    axes = plot_axes(1.08 * max(float(d.max()) for d in arrays) + 1.0,
                     [(value / DEPTH_AXIS_END * (plot_w - 1), f"{value:g}") for value in np.linspace(0.0, 1.0, 6)],
                     "relative depth (layer + 1) / depth", "mean attention distance (input pixels)",
                     plot=COMPARE_PLOT_PIXELS, below=16 * len(arrays) + 4,
                     legend=18 + max(int(small.getlength(label)) for label in labels))  # dot, then its words
    points = []
    for index, (dist, label) in enumerate(zip(arrays, labels)):
        depth, heads = dist.shape
        colour = rgb_of(MODEL_COLORS[index % len(MODEL_COLORS)])
        x = (np.arange(depth) + 1) / depth + _side_offset(index, len(arrays), depth)  # (depth,)
        columns = axes.left + x / DEPTH_AXIS_END * (plot_w - 1)
        centres = np.stack([np.broadcast_to(columns[:, None], dist.shape), axes.row(dist)], axis=-1)
        for cx, cy in centres.reshape(-1, 2):
            axes.dot(cx, cy, COMPARE_DOT_RADIUS, colour)
        legend_y = axes.bottom + 48 + 18 * index
        axes.dot(axes.left + 8, legend_y, COMPARE_DOT_RADIUS, colour)
        axes.pen.text((axes.left + 18, legend_y), label, fill=(0, 0, 0), font=small, anchor="lm")
        points.append(centres)
    body = np.asarray(axes.panel)
    picture = titled(body, title)
    band = picture.shape[0] - body.shape[0]  # the title's, above
    for centres in points:
        centres[..., 1] += band
    return picture, points


def side_by_side(images: list[np.ndarray], gap: int = 16) -> np.ndarray:
    """(H_i, W_i, 3) uint8 images in one row on white, top-aligned, `gap` pixels apart."""
    height = max(image.shape[0] for image in images)
    width = sum(image.shape[1] for image in images) + gap * (len(images) - 1)
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    x = 0
    for image in images:
        canvas[:image.shape[0], x:x + image.shape[1]] = image[..., :3]
        x += image.shape[1] + gap
    return canvas


def _patch_mask(mask: np.ndarray, result: ImageAnalysis) -> np.ndarray:
    """(grid_h, grid_w) bool -> (H, W) of the crop, each patch its patch_h x patch_w pixels."""
    layout = result.layout
    pixels = np.repeat(np.repeat(mask, layout.patch_h, axis=0), layout.patch_w, axis=1)
    out = np.zeros(result.rgb.shape[:2], dtype=bool)
    out[:pixels.shape[0], :pixels.shape[1]] = pixels
    return out


def dino_heads_figure(result: ImageAnalysis, maps: np.ndarray, masks: np.ndarray, name: str, fraction: float,
                      ncols: int = 6) -> Figure:
    """Every head of the last layer (Caron et al. 2021, Fig. 3): attention of the readout token, each map
    min-max scaled, with the outline (cyan) of the smallest patch set holding `fraction` of its mass.

    ``maps`` and ``masks`` are (heads, grid_h, grid_w), from `ImageAnalysis.attention_map` and
    `analysis.mass_mask`.
    """
    heads = maps.shape[0]
    ncols = min(ncols, heads)
    nrows = -(-heads // ncols)
    fig = Figure(figsize=(2.2 * ncols + 1.0, 2.3 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for head, ax in enumerate(axes.ravel()):
        ax.set_axis_off()
        if head >= heads:
            continue
        ax.imshow(overlay(result.rgb, maps[head]))
        ax.contour(_patch_mask(masks[head], result), levels=[0.5], colors=MASK_COLOR, linewidths=1.2)
        ax.set_title(f"head {head}: {int(masks[head].sum())} patches", fontsize="small")
    fig.suptitle(textwrap.fill(f"{name}: last layer ({result.depth - 1}), every head, {result.readout} token's "
                               f"attention; outline: the fewest patches holding {fraction:.0%} of the mass", 90),
                 fontsize="medium")
    _scale_bar(fig, axes, "attention, min-max per head")
    return fig


def dino_heads_panel(result: ImageAnalysis, maps: np.ndarray, masks: np.ndarray, name: str, fraction: float,
                       ncols: int = 6) -> np.ndarray:
    """What `dino_heads_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL (`plots.maps.heads_panel`,
    redrawn when the Compare tab's mass slider moves): every head of the last layer (Caron et al. 2021,
    Fig. 3), the readout token's attention min-max scaled per head (`plots.canvas.normalized`, so one colour
    bar from 0 to 1 serves every head), the smallest patch set holding `fraction` of its mass (``masks``)
    at full brightness and the rest dimmed, as the All heads tab shows a threshold, each head titled with
    its patch count. ``maps`` and ``masks`` are (heads, grid_h, grid_w), from `ImageAnalysis.attention_map`
    and `analysis.mass_mask`. The matplotlib figure takes 0.25-0.5 s per model."""
    if maps.shape != masks.shape or maps.ndim != 3:
        raise ValueError(f"expected (heads, grid_h, grid_w) maps and masks of one shape, got {maps.shape} and {masks.shape}")
    scaled = np.stack([normalized(head, relu=False) for head in maps])
    titles = [f"head {head}: {int(masks[head].sum())} patches" for head in range(maps.shape[0])]
    title = (f"{name}: last layer ({result.depth - 1}), every head, {result.readout} token's attention; bright: the "
             f"fewest patches holding {fraction:.0%} of the mass")
    return heads_panel(result.rgb, scaled, titles, "attention, min-max per head", title=title, vmin=0.0, vmax=1.0,
                        masks=masks, columns=min(ncols, maps.shape[0]))


CHANNEL_BAR_PIXELS = (240, 12)  # (width, height) of one of feature_pca_panel's channel scale bars
CHANNELS = (("red", (255, 0, 0)), ("green", (0, 255, 0)), ("blue", (0, 0, 255)))


def _channel_bar(label: str, colour: tuple[int, int, int]) -> np.ndarray:
    """(H, W, 3) uint8 horizontal scale bar from black (0, left) to ``colour`` (1, right), linear (the
    matplotlib figure's black-to-colour map), outlined, ticks 0, 0.5 and 1 under it and ``label`` below."""
    width, height = CHANNEL_BAR_PIXELS
    ramp = np.rint(np.linspace(0.0, 1.0, width)[:, None] * np.asarray(colour, dtype=np.float64)).astype(np.uint8)
    panel = Image.new("RGB", (width + 16, height + 40), (255, 255, 255))
    panel.paste(Image.fromarray(np.repeat(ramp[None], height, axis=0)), (8, 2))
    pen, small = ImageDraw.Draw(panel), font_of(SMALL_TEXT)
    pen.rectangle((8, 2, 8 + width - 1, 2 + height - 1), outline=(0, 0, 0))
    for value in (0.0, 0.5, 1.0):
        x = 8 + value * (width - 1)
        pen.line((x, 2 + height, x, 5 + height), fill=(0, 0, 0))
        pen.text((x, 6 + height), f"{value:g}", fill=(0, 0, 0), font=small, anchor="mt")
    pen.text((8, 22 + height), label, fill=(0, 0, 0), font=small)
    return np.asarray(panel)


def feature_pca_panel(crops: list[np.ndarray], pca: FeaturePCA, titles: list[str], name: str) -> np.ndarray:
    """What `feature_pca_figure` shows, as an (H, W, 3) uint8 picture drawn with PIL (redrawn when the Compare
    tab's background setting changes): each image's crop under its title, above its patch features' first
    three principal components as RGB (Oquab et al. 2023, DINOv2 Fig. 1; each channel min-max scaled,
    written as rint(255 x), each patch a block of the crop's pixels: `_nearest`) under the count of patches
    kept; a scale bar per channel naming its component and share of variance (as many to a row as the
    images' width holds); the fit and the background setting above all. The matplotlib figure takes ≈ 0.3 s
    per model."""
    if not len(crops) == len(pca.rgb) == len(titles):
        raise ValueError(f"{len(crops)} crops, {len(pca.rgb)} PCA images and {len(titles)} titles")
    columns = []
    for crop, colours, title, kept in zip(crops, pca.rgb, titles, pca.foreground):
        components = np.rint(_nearest(np.asarray(colours, dtype=np.float64), crop.shape[:2]) * 255.0).astype(np.uint8)
        columns.append(grid_of([titled(np.asarray(crop, dtype=np.uint8), title),
                                titled(components, f"{int(kept.sum())} of {kept.size} patches kept")], 1))
    ratios = pca.explained_variance_ratio
    bars = [_channel_bar(f"PC{channel + 1} score, min-max ({ratios[channel]:.0%} of variance)", colour)
            for channel, (_, colour) in enumerate(CHANNELS)]
    setting = ("all patches" if pca.threshold is None else
               f"background (scaled PC1 < {pca.threshold:g}, PC1 oriented centre-high) removed, black")
    fit = "jointly on all images" if len(crops) > 1 else "on this image"
    body = grid_of(columns, len(columns))
    per_row = max(1, min(len(bars), body.shape[1] // bars[0].shape[1]))  # bars side by side where the images are wide
    return titled(grid_of([body, grid_of(bars, per_row)], 1),
                  f"{name}: PCA of last-layer patch tokens, fitted {fit}; {setting}")


def _nearest(rgb: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(grid_h, grid_w, 3) -> (H, W, 3) by repeating each cell (nearest neighbour)."""
    rows = (np.arange(shape[0]) * rgb.shape[0] // shape[0])
    cols = (np.arange(shape[1]) * rgb.shape[1] // shape[1])
    return rgb[rows][:, cols]


def feature_pca_figure(crops: list[np.ndarray], pca: FeaturePCA, titles: list[str], name: str) -> Figure:
    """Each image's crop above its patch features' first three principal components as RGB (Oquab et al.
    2023, DINOv2 Fig. 1), with one scale bar per channel."""
    count = len(crops)
    fig = Figure(figsize=(PANEL_INCHES * count + 0.6, 2 * PANEL_INCHES + 3.4), layout="constrained")
    axes = fig.subplots(2, count, squeeze=False)
    fig.get_layout_engine().set(h_pad=0.15)  # room for each panel's title between the rows
    for index, (crop, colours, title) in enumerate(zip(crops, pca.rgb, titles)):
        axes[0, index].imshow(crop)
        axes[0, index].set_title(textwrap.fill(title, 32), fontsize="small")
        axes[1, index].imshow(_nearest(colours, crop.shape[:2]))
        axes[1, index].set_title(f"{int(pca.foreground[index].sum())} of {pca.foreground[index].size} patches kept",
                                 fontsize="small")
        for ax in axes[:, index]:
            ax.set_axis_off()
    ratios = pca.explained_variance_ratio
    for channel, colour in reversed(list(enumerate(("red", "green", "blue")))):  # placed bottom-up
        cmap = LinearSegmentedColormap.from_list(colour, ["black", colour])
        _scale_bar(fig, axes[1, :], f"PC{channel + 1} score, min-max ({ratios[channel]:.0%} of variance)",
                   cmap=cmap, location="bottom")
    setting = ("all patches" if pca.threshold is None else
               f"background (scaled PC1 < {pca.threshold:g}, PC1 oriented centre-high) removed, black")
    fit = "jointly on all images" if count > 1 else "on this image"
    fig.suptitle(textwrap.fill(f"{name}: PCA of last-layer patch tokens, fitted {fit}; {setting}",
                               36 * count),
                 fontsize="medium")
    return fig


def fig7_images(handles: list[ViTHandle], labels: list[str],
                sizes: list[tuple[int, int] | None] | None = None) -> dict[str, np.ndarray]:
    """Both models' ViT Fig. 7 left and centre panels, each as one side-by-side image; the position
    similarity on the grid of each model's input size (its label's), the embeddings interpolated as the
    model does in its forward (`pos_similarity_at`)."""
    filters, similarity = [], []
    for handle, label, size in zip(handles, labels, sizes or [None] * len(handles)):
        report = model_report(handle)
        filters.append(canvas.figure_to_rgb(model_plots.filter_pca_figure(report.filter_pca, model=label)))
        layout = handle.layout(size)
        grid = (layout.grid_h, layout.grid_w)
        similarity_map = report.pos_similarity if grid == report.grid else pos_similarity_at(handle, grid)
        if similarity_map is not None:
            similarity.append(canvas.figure_to_rgb(model_plots.pos_similarity_figure(
                similarity_map, title=f"{label}: position embedding similarity, {grid[0]}×{grid[1]} grid")))
    panels = {"filters": side_by_side(filters)}
    if similarity:
        panels["pos_similarity"] = side_by_side(similarity)
    return panels

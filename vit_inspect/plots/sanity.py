"""Sanity-check results -> pictures: the cascading strip of maps (Adebayo et al. 2018, Fig. 2) and the
similarity curves, each as a matplotlib figure (the command line's files) and as a PIL panel of the same
picture (the app). Numbers in (`studies.sanity.ImageSanity`), no torch."""
from __future__ import annotations

import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from vit_inspect.plots.canvas import (COLORBAR_PIXELS, MOSAIC_GAP, SMALL_TEXT, add_colorbar, draw_colorbar, font_of,
                                      grid_of, plot_axes, titled, wrap_to)
from vit_inspect.plots.faithfulness import LEGEND_LINE_PIXELS, LEGEND_SAMPLE_PIXELS, _line, method_styles, paper_name
from vit_inspect.plots.maps import overlay
from vit_inspect.studies.sanity import PASS_THRESHOLD, SIMILARITIES, ImageSanity

SIMILARITY_TITLES = {"spearman": "Spearman rank correlation", "ssim": "SSIM (normalised maps)",
                     "top10_overlap": "top-10 % patch overlap"}
CELL_INCHES = 1.15  # side of one map in the cascading strip
CELL_PIXELS = 84  # width of one map in the cascading panel
CELL_GAP = 4  # white pixels between two maps of the cascading panel
HEAD_PIXELS = 20  # the cascading panel's row of step names
LABEL_PIXELS = 150  # the cascading panel's column of method names
SIMILARITY_PLOT_PIXELS = (420, 220)  # (width, height) of one similarity plot's axes
NORMALISED = "each map min-max normalised"


def step_label(step) -> str:
    """A cascading step as a column title: the trained model, "from block b", or the patch embedding."""
    if step is None:
        return "trained"
    return "+ embedding" if step == "embedding" else f"from block {step}"


def short_step_label(step) -> str:
    """`step_label` in a few characters, for a narrow column: "trained", "from 11", "+ emb."."""
    if step is None:
        return "trained"
    return "+ emb." if step == "embedding" else f"from {step}"


def labelled_steps(count: int, every: int) -> list[int]:
    """The indices of ``count`` cascading steps that get a tick label when only every ``every``-th fits: the
    first (the trained model), then every ``every``-th, and the last (the patch embedding) in place of a
    labelled step less than ``every`` before it, so that no two labels are closer than ``every`` slots."""
    chosen = list(range(0, count, every))
    if count and chosen[-1] != count - 1:
        if count - 1 - chosen[-1] < every and len(chosen) > 1:
            chosen.pop()
        chosen.append(count - 1)
    return chosen


def cascading_panel(rgb: np.ndarray, result: ImageSanity, title: str, max_width: int | None = None) -> np.ndarray:
    """`cascading_figure` drawn with PIL, as an (H, W, 3) uint8 picture: one row per method (its paper name
    on the left), one column per cascading step (`short_step_label` above: the trained model, "from b" once
    every block from the last one down to block b is random, "+ emb." with the patch embedding too); each map
    min-max normalised to its own range and drawn over the crop scaled to CELL_PIXELS wide; under `title`.
    The steps are split evenly into bands stacked top to bottom, each no wider than ``max_width`` pixels
    (default: one band), each opening with the crop and closing with a colour bar (0 = a map's lowest value,
    1 its highest), so that a model of any depth is drawn at its own size on the page."""
    methods = list(result.maps)
    if not methods:
        raise ValueError("no maps to show")
    height, width = rgb.shape[:2]
    cell_h = max(1, round(CELL_PIXELS * height / width))
    crop = np.asarray(Image.fromarray(rgb).resize((CELL_PIXELS, cell_h), Image.BILINEAR))
    steps = len(result.steps)
    fits = steps if max_width is None else (max_width - LABEL_PIXELS - COLORBAR_PIXELS) // (CELL_PIXELS + CELL_GAP) - 1
    per_band = math.ceil(steps / math.ceil(steps / max(1, fits)))  # as even as the bands can be
    bands = [_cascading_band(crop, result, methods, range(start, min(start + per_band, steps)))
             for start in range(0, steps, per_band)]
    return titled(grid_of(bands, 1), title)


def _cascading_band(crop: np.ndarray, result: ImageSanity, methods: list[str], steps: range) -> np.ndarray:
    """One band of `cascading_panel`: the method names, the crop, the maps of the ``steps`` (indices into
    ``result.steps``) and the colour bar."""
    small = font_of(SMALL_TEXT)
    cell_h = crop.shape[0]
    grid_w = LABEL_PIXELS + (len(steps) + 1) * (CELL_PIXELS + CELL_GAP)
    panel = Image.new("RGB", (grid_w + COLORBAR_PIXELS, HEAD_PIXELS + len(methods) * (cell_h + CELL_GAP)),
                      (255, 255, 255))
    pen = ImageDraw.Draw(panel)
    for column, words in enumerate(["input", *[short_step_label(result.steps[step]) for step in steps]]):
        pen.text((LABEL_PIXELS + column * (CELL_PIXELS + CELL_GAP) + CELL_PIXELS / 2, HEAD_PIXELS / 2), words,
                 fill=(0, 0, 0), font=small, anchor="mm")
    for row, method in enumerate(methods):
        top = HEAD_PIXELS + row * (cell_h + CELL_GAP)
        lines = wrap_to(paper_name(method), LABEL_PIXELS - 8, small)
        for index, line in enumerate(lines):
            pen.text((LABEL_PIXELS - 6, top + cell_h / 2 + (index - (len(lines) - 1) / 2) * 15), line,
                     fill=(0, 0, 0), font=small, anchor="rm")
        panel.paste(Image.fromarray(crop), (LABEL_PIXELS, top))
        for column, step in enumerate(steps, start=1):
            grid_map = np.asarray(result.maps[method][step], dtype=np.float64)
            cell = overlay(crop, grid_map, alpha=0.75)  # normalised, upsampled
            panel.paste(Image.fromarray(cell), (LABEL_PIXELS + column * (CELL_PIXELS + CELL_GAP), top))
    draw_colorbar(panel, pen, grid_w + 8, HEAD_PIXELS, panel.height - CELL_GAP, 0.0, 1.0, NORMALISED, "inferno")
    return np.asarray(panel)


def similarity_panel(result: ImageSanity, title: str, max_width: int | None = None) -> np.ndarray:
    """`similarity_figure`'s cascading row drawn with PIL, as an (H, W, 3) uint8 picture: one plot per
    similarity (`SIMILARITIES`), x the cascading steps (`short_step_label`) and, right of them, the random
    logit, y from -1 to 1 (the overlap from 0); each method a line in its `method_styles` colour and style
    with a dot per step, its random-logit value a square; on the Spearman plot the pass threshold as a grey
    line. A legend of paper names under the first plot. The plots sit side by side, as many to a row as fit
    in ``max_width`` pixels (default: all)."""
    methods = list(result.cascading)
    if not methods:
        raise ValueError("no similarities to show")
    styles = method_styles(methods)
    small = font_of(SMALL_TEXT)
    plot_w, plot_h = SIMILARITY_PLOT_PIXELS
    slots = len(result.steps) + 2  # the steps, an empty slot, then the random logit
    x_of = np.delete(np.linspace(8, plot_w - 9, slots), -2)  # pixel offsets in the plot: steps, then the logit
    names = [paper_name(m) for m in methods]
    every = 1 if len(result.steps) <= 8 else 2  # tick labels that fit side by side
    labelled = set(labelled_steps(len(result.steps), every))
    ticks = [(x, short_step_label(step) if index in labelled else "")
             for index, (x, step) in enumerate(zip(x_of, result.steps))] + [(x_of[-1], "logit")]
    plots = []
    for position, name in enumerate(SIMILARITIES):
        legend = position == 0  # one legend, under the first plot
        axes = plot_axes(1.05, ticks, "cascading step, then the random logit", SIMILARITY_TITLES[name],
                         plot=SIMILARITY_PLOT_PIXELS, below=LEGEND_LINE_PIXELS * len(methods) + 8 if legend else 8,
                         legend=LEGEND_SAMPLE_PIXELS + 6 + max(int(small.getlength(n)) for n in names) if legend else 0,
                         lowest=0.0 if name == "top10_overlap" else -1.05)
        for level in (0.0, *((PASS_THRESHOLD,) if name == "spearman" else ())):
            axes.pen.line((axes.left, axes.row(level), axes.left + plot_w - 1, axes.row(level)),
                          fill=(150, 150, 150) if level else (210, 210, 210))
        for index, method in enumerate(methods):
            colour, pattern = styles[method]
            values = np.array([getattr(s, name) for s in result.cascading[method]], dtype=np.float64)
            shown = np.isfinite(values)  # a constant map's Spearman is undefined: no point, the line broken
            points = np.stack([axes.left + x_of[:-1], axes.row(np.nan_to_num(values))], axis=-1)  # (steps, 2)
            for start in range(len(values) - 1):
                if shown[start] and shown[start + 1]:
                    _line(axes.pen, points[start:start + 2], colour, pattern)
            for x, y in points[shown]:
                axes.dot(x, y, 2.5, colour)
            logit = result.random_logit.get(method)
            if logit is not None and np.isfinite(getattr(logit, name)):
                x, y = axes.left + x_of[-1], axes.row(getattr(logit, name))
                axes.pen.rectangle((x - 3, y - 3, x + 3, y + 3), fill=colour)
            if not legend:
                continue
            y = axes.bottom + 44 + LEGEND_LINE_PIXELS * index
            _line(axes.pen, np.array([[axes.left, y], [axes.left + LEGEND_SAMPLE_PIXELS, y]], np.float64), colour,
                  pattern)
            axes.pen.text((axes.left + LEGEND_SAMPLE_PIXELS + 6, y), names[index], fill=(0, 0, 0), font=small,
                          anchor="lm")
        heading = SIMILARITY_TITLES[name] + (f" (grey: pass threshold {PASS_THRESHOLD})" if name == "spearman" else "")
        plots.append(titled(np.asarray(axes.panel), heading))
    widest = max(plot.shape[1] for plot in plots)
    columns = len(plots) if max_width is None else (max_width + MOSAIC_GAP) // (widest + MOSAIC_GAP)
    return titled(grid_of(plots, max(1, columns)), title)


def cascading_figure(rgb: np.ndarray, result: ImageSanity, title: str = "") -> Figure:
    """Adebayo et al.'s Fig. 2 for one image: one row per method, one column per cascading step (the trained
    model, then every block from the last one down randomised, then the patch embedding too), each map
    min-max normalised to its own range (as the paper shows them, so only the pattern is compared) and drawn
    over the crop the model saw, first column the crop itself. The class explained is the same in every column.
    One colour bar on the right: 0 is each map's lowest value, 1 its highest."""
    methods = list(result.maps)
    if not methods:
        raise ValueError("no maps to show")
    columns = len(result.steps) + 1
    fig = Figure(figsize=(CELL_INCHES * columns + 0.8, CELL_INCHES * len(methods) + (0.6 if title else 0.3)),
                 layout="constrained")
    axes = fig.subplots(len(methods), columns, squeeze=False)
    for row, method in enumerate(methods):
        axes[row, 0].imshow(rgb)
        axes[row, 0].set_ylabel(method, rotation=0, ha="right", va="center", fontsize="small")
        for column, (step, grid_map) in enumerate(zip(result.steps, result.maps[method]), start=1):
            axes[row, column].imshow(overlay(rgb, grid_map, alpha=0.75))  # min-max normalised, upsampled
            if row == 0:
                axes[row, column].set_title(step_label(step), fontsize="x-small")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_title("input", fontsize="x-small")
    add_colorbar(fig, 0.0, 1.0, NORMALISED, ax=axes, shrink=0.6, pad=0.01)
    fig.suptitle(title or "Cascading randomisation (last block first), each map normalised", fontsize="small")
    return fig


def similarity_figure(result: ImageSanity, title: str = "") -> Figure:
    """The similarity of each method's map to its trained map per step: top row cascading (x: the steps of
    `cascading_figure`), bottom row independent (x: the one block randomised), one column per similarity
    (`SIMILARITIES`); the random-logit value of each method as a marker right of the cascading curve, the
    pass threshold dashed on the Spearman plots."""
    methods = list(result.cascading)
    rows = 2 if any(result.independent.values()) else 1
    fig = Figure(figsize=(4.2 * len(SIMILARITIES), 3.0 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, len(SIMILARITIES), squeeze=False)
    colours = {m: matplotlib.colormaps["tab10"].colors[i % 10] for i, m in enumerate(methods)}
    steps = np.arange(len(result.steps))
    for column, name in enumerate(SIMILARITIES):
        ax = axes[0, column]
        for method in methods:
            values = [getattr(s, name) for s in result.cascading[method]]
            ax.plot(steps, values, marker="o", markersize=3, color=colours[method], label=method)
            if method in result.random_logit:
                ax.plot(len(steps) + 0.5, getattr(result.random_logit[method], name), marker="D",
                        color=colours[method], linestyle="none")
        ax.set_xticks([*steps, len(steps) + 0.5], [step_label(s) for s in result.steps] + ["random logit"],
                      rotation=60, fontsize="x-small")
        ax.set_title(f"cascading: {SIMILARITY_TITLES[name]}", fontsize="small")
        if rows == 2:
            ax = axes[1, column]
            for method in methods:
                values = [getattr(s, name) for s in result.independent[method]]
                ax.plot(np.arange(len(values)), values, marker="o", markersize=3, color=colours[method])
            ax.set_xlabel("block randomised alone", fontsize="small")
            ax.set_title(f"independent: {SIMILARITY_TITLES[name]}", fontsize="small")
        for ax in axes[:, column]:
            ax.axhline(0.0, color="0.8", linewidth=0.8)
            if name == "spearman":
                ax.axhline(PASS_THRESHOLD, color="black", linestyle="--", linewidth=0.8)
            ax.set_ylim(min(-0.5, ax.get_ylim()[0]), 1.05)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right upper", fontsize="x-small")
    fig.suptitle(title or f"Similarity to the trained model's map (dashed: pass threshold {PASS_THRESHOLD})",
                 fontsize="small")
    return fig


__all__ = ["cascading_figure", "cascading_panel", "similarity_figure", "similarity_panel", "short_step_label",
           "step_label"]

"""Sanity-check results -> matplotlib figures: the cascading strip of maps (Adebayo et al. 2018, Fig. 2) and the
similarity curves. Numbers in (`studies.sanity.ImageSanity`), no torch."""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from vit_inspect.plots.canvas import add_colorbar
from vit_inspect.plots.maps import overlay
from vit_inspect.studies.sanity import PASS_THRESHOLD, SIMILARITIES, ImageSanity

SIMILARITY_TITLES = {"spearman": "Spearman rank correlation", "ssim": "SSIM (normalised maps)",
                     "top10_overlap": "top-10 % patch overlap"}
CELL_INCHES = 1.15  # side of one map in the cascading strip


def step_label(step) -> str:
    """A cascading step as a column title: the trained model, "from block b", or the patch embedding."""
    if step is None:
        return "trained"
    return "+ embedding" if step == "embedding" else f"from block {step}"


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
    add_colorbar(fig, 0.0, 1.0, "each map min-max normalised", ax=axes, shrink=0.6, pad=0.01)
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


__all__ = ["cascading_figure", "similarity_figure", "step_label"]

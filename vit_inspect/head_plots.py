"""Head-level figures: a layers x heads heatmap (importance, entropy, ...) and the logit lens by depth.
matplotlib's object API only, no torch, no gradio; every figure names what it shows and has a colour bar."""
from __future__ import annotations

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

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

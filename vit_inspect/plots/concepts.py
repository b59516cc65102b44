"""Concepts and patch similarity over the image: one overlay per concept, and similarity maps with the query
patch outlined, each with its colour bar."""
from __future__ import annotations

import textwrap
from typing import Callable

import numpy as np
from matplotlib.figure import Figure

from vit_inspect.passes.concepts import ImageConcepts
from vit_inspect.plots.canvas import add_colorbar, grid_of, map_range, titled
from vit_inspect.plots.maps import PANEL_INCHES, TITLE_CHARS, overlay

CONCEPT_UNIT = "concept weight (NMF H, own scale)"  # a heatmap's values compare patches within one concept only
SIMILARITY_UNIT = "cosine similarity"
SIMILARITY_CMAP = "coolwarm"  # diverging: -1 blue, 0 white, 1 red
TOP_CLASSES = 2  # classes named under each concept


def concept_caption(concepts: ImageConcepts, j: int, label: Callable[[int], str]) -> str:
    """"concept j · area a % · logit x (p %)" then its top classes through the head (`label` names a class index);
    without a head, the area alone."""
    parts = [f"concept {j + 1}", f"area {100 * concepts.areas[j]:.0f} %"]
    logits = concepts.class_logits()
    if logits is not None:
        parts.append(f"logit {logits[j]:.2f} ({100 * concepts.class_probabilities()[j]:.1f} %)")
        top = np.argsort(-concepts.logits[j], kind="stable")[:TOP_CLASSES]
        parts.append("reads as " + ", ".join(label(int(i)).split(",")[0] for i in top))
    return " · ".join(parts)


def concepts_title(concepts: ImageConcepts, image: str, label: Callable[[int], str]) -> str:
    """Model, image, class, block and settings of a concepts figure."""
    target = "no classification head" if concepts.target is None else (
        f"logits of {label(concepts.target).split(',')[0]} (#{concepts.target})")
    return (f"{concepts.model_name} · {image} · {target}\nblock {concepts.layer} output · deep feature factorisation "
            f"k={concepts.k}, seed {concepts.seed} · reconstruction error {100 * concepts.error:.0f} %")


def concepts_figure(rgb: np.ndarray, concepts: ImageConcepts, label: Callable[[int], str], image: str = "image"
                    ) -> Figure:
    """The crop the model saw, then one overlay per concept (its heatmap H_j min-max scaled, bilinear) with its
    colour bar and caption (`concept_caption`), in the concepts' order; the title names the model, image,
    class, block and settings."""
    height, width = rgb.shape[:2]
    panel_w = PANEL_INCHES * max(1.0, width / height)
    columns = concepts.k + 1
    fig = Figure(figsize=((panel_w + 1.0) * columns, PANEL_INCHES + 1.2), layout="constrained")
    ax = fig.add_subplot(1, columns, 1)
    ax.imshow(rgb)
    ax.set_title("input", fontsize="medium")
    ax.set_axis_off()
    for j, heatmap in enumerate(concepts.heatmaps):
        low, high = map_range(heatmap)
        ax = fig.add_subplot(1, columns, j + 2)
        ax.imshow(overlay(rgb, heatmap, vmin=low, vmax=high))
        ax.set_title(textwrap.fill(concept_caption(concepts, j, label), TITLE_CHARS), fontsize="small")
        ax.set_axis_off()
        add_colorbar(fig, low, high, CONCEPT_UNIT, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(concepts_title(concepts, image, label), fontsize="medium")
    return fig


def similarity_figure(maps: dict[str, tuple[np.ndarray, np.ndarray]], patch: tuple[int, int], title: str) -> Figure:
    """One overlay per named (rgb (H, W, 3) uint8, (grid_h, grid_w) cosine similarity) pair, on the fixed range
    [-1, 1] with one colour bar each; the query ``patch`` (row, col) is outlined on the first."""
    if not maps:
        raise ValueError("no similarity maps to show")
    fig = Figure(figsize=((PANEL_INCHES + 1.0) * len(maps), PANEL_INCHES + 0.6), layout="constrained")
    for position, (name, (rgb, values)) in enumerate(maps.items(), start=1):
        ax = fig.add_subplot(1, len(maps), position)
        ax.imshow(overlay(rgb, values, cmap=SIMILARITY_CMAP, vmin=-1.0, vmax=1.0,
                          marker=patch if position == 1 else None))
        ax.set_title(textwrap.fill(name, TITLE_CHARS), fontsize="medium")
        ax.set_axis_off()
        add_colorbar(fig, -1.0, 1.0, SIMILARITY_UNIT, cmap=SIMILARITY_CMAP, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(title, fontsize="medium")
    return fig


GALLERY_GAP = 4  # white pixels between two crops of a gallery row


def gallery_panel(galleries: np.ndarray, captions: list[str], title: str) -> np.ndarray:
    """Class concepts' galleries as an (H, W, 3) uint8 picture drawn with PIL: one row per concept (``galleries``
    (k, n, s, s, 3) uint8, its crops side by side, ``GALLERY_GAP`` pixels apart) under its caption, the rows
    `canvas.MOSAIC_GAP` apart, under the wrapped ``title``. Crops are pixels, not values: there is no colour bar."""
    if len(galleries) != len(captions) or not len(galleries):
        raise ValueError(f"one caption per gallery, got {len(galleries)} galleries and {len(captions)} captions")
    rows = []
    for crops, caption in zip(galleries, captions):
        side = crops.shape[1]
        row = np.full((side, len(crops) * (side + GALLERY_GAP) - GALLERY_GAP, 3), 255, np.uint8)
        for slot, crop in enumerate(crops):
            row[:, slot * (side + GALLERY_GAP):slot * (side + GALLERY_GAP) + side] = crop
        rows.append(titled(row, caption))
    return titled(grid_of(rows, 1), title)

"""The concepts and similarity figures on hand-made concepts: captions, titles and colour bars."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.passes.concepts import ImageConcepts
from vit_inspect.plots.concepts import (CONCEPT_UNIT, SIMILARITY_UNIT, concept_caption, concepts_figure,
                                        similarity_figure)

LABELS = ("cat, house cat", "dog", "car")


def hand_made(logits: np.ndarray | None) -> ImageConcepts:
    heatmaps = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)  # (k, grid_h, grid_w)
    return ImageConcepts(model_name="tiny", layer=4, target=None if logits is None else 0, seed=7, heatmaps=heatmaps,
                         embeddings=np.zeros((2, 5), np.float32), areas=np.array([0.75, 0.25]), logits=logits,
                         error=0.125, iterations=12)


def colorbars(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_captions_give_area_logit_probability_and_readings():
    concepts = hand_made(np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]], np.float32))
    label = LABELS.__getitem__
    p0 = np.exp(2.0) / (np.exp(2.0) + 2)  # concept 1's softmax probability of class 0 over three classes
    assert concept_caption(concepts, 0, label) == f"concept 1 · area 75 % · logit 2.00 ({100 * p0:.1f} %) · reads as cat, dog"
    assert concept_caption(concepts, 1, label).endswith("logit 0.00 (4.2 %) · reads as car, dog")
    fig = concepts_figure(np.zeros((32, 48, 3), np.uint8), concepts, label, "photo.png")
    title = fig._suptitle.get_text()
    for part in ("tiny", "photo.png", "logits of cat (#0)", "block 4 output", "k=2", "seed 7", "error 12 %"):
        assert part in title, part
    assert [bar.get_ylabel() for bar in colorbars(fig)] == [CONCEPT_UNIT] * 2
    assert [bar.get_ylim() for bar in colorbars(fig)] == [(0.0, 5.0), (6.0, 11.0)]  # each concept's own range


def test_without_a_head_the_captions_give_the_area_alone():
    concepts = hand_made(None)
    assert concept_caption(concepts, 1, LABELS.__getitem__) == "concept 2 · area 25 %"
    fig = concepts_figure(np.zeros((32, 32, 3), np.uint8), concepts, LABELS.__getitem__)
    assert "no classification head" in fig._suptitle.get_text()


def test_similarity_maps_share_the_fixed_range():
    rgb = np.zeros((32, 32, 3), np.uint8)
    maps = {"a.png": (rgb, np.full((2, 2), 0.5)), "b.png": (rgb, np.array([[-1.0, 0.0], [0.2, 1.0]]))}
    fig = similarity_figure(maps, (1, 0), "tiny · block 3")
    assert [bar.get_ylabel() for bar in colorbars(fig)] == [SIMILARITY_UNIT] * 2
    assert all(bar.get_ylim() == (-1.0, 1.0) for bar in colorbars(fig))
    with pytest.raises(ValueError, match="no similarity maps"):
        similarity_figure({}, (0, 0), "")

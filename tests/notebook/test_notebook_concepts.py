"""The notebook's concepts and patch similarity: `Analysis.concepts`, `show_concepts`, `similarity` and
`show_similarity`."""
from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from support import tiny_handle

import vit_inspect as vi
from vit_inspect.passes.concepts import image_concepts, patch_similarity
from vit_inspect.plots.concepts import CONCEPT_UNIT, SIMILARITY_UNIT
from vit_inspect.studies.class_concepts import class_concepts


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("concepts")
    paths = []
    for seed in (0, 1):
        path = folder / f"noise{seed}.png"
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def two(pictures):
    handle = tiny_handle("cls", seed=1)
    return vi.analyze(pictures[0], model=handle), vi.analyze(pictures[1], model=handle)


def colorbar_labels(fig: Figure) -> list[str]:
    return [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]


def test_concepts_are_the_librarys(two):
    r = two[0]
    concepts = r.concepts(3, layer=0)
    expected = image_concepts(r.handle, r.result, 3, 0)
    np.testing.assert_array_equal(concepts.heatmaps, expected.heatmaps)
    np.testing.assert_array_equal(concepts.logits, expected.logits)
    assert concepts.k == 3 and concepts.layer == 0 and r.concepts(2).layer == r.result.depth - 1


def test_show_concepts_names_model_class_block_and_settings(two):
    r = two[0]
    fig = r.show_concepts(3, layer=1, seed=2)
    assert isinstance(fig, Figure)
    assert colorbar_labels(fig) == [CONCEPT_UNIT] * 3
    title = fig._suptitle.get_text()
    label = r.handle.label(r.result.target).split(",")[0]
    for part in (r.handle.name, "noise0.png", f"{label} (#{r.result.target})", "block 1", "k=3", "seed 2"):
        assert part in title, part


def test_similarity_in_this_image_and_another(two):
    r, other = two
    own, theirs = r.similarity((1, 2), layer=0, other=other)
    expected = patch_similarity(r.handle, r.result, (1, 2), 0, other.result)
    np.testing.assert_array_equal(own, expected[0])
    np.testing.assert_array_equal(theirs, expected[1])
    assert own[1, 2] == pytest.approx(1.0)
    fig = r.show_similarity((1, 2), layer=0, other=other)
    assert colorbar_labels(fig) == [SIMILARITY_UNIT] * 2
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert all(bar.get_ylim() == (-1.0, 1.0) for bar in bars)  # a fixed range: images and blocks compare
    assert "patch (1, 2)'s token at block 0" in fig._suptitle.get_text() and r.handle.name in fig._suptitle.get_text()
    assert len(r.show_similarity((0, 0)).axes) == 2  # this image alone: one map and its colour bar


def test_another_models_analysis_is_refused(two, pictures):
    other = vi.analyze(pictures[1], model=tiny_handle("gap", seed=1))
    with pytest.raises(ValueError, match="not of"):
        two[0].similarity((0, 0), other=other)


def test_class_concepts_of_a_folder_are_the_librarys(pictures):
    handle = tiny_handle("cls", seed=1)
    concepts = vi.class_concepts(pictures[0].parent, target=2, model=handle, k=2, crops=3)
    expected = class_concepts(handle, sorted(pictures), 2, k=2, crops=3)
    assert concepts.images == ("noise0.png", "noise1.png")
    np.testing.assert_array_equal(concepts.importance, expected.importance)
    np.testing.assert_array_equal(concepts.galleries, expected.galleries)
    assert vi.class_concept_heatmaps(handle, concepts, pictures[0]).shape == (2, 4, 4)

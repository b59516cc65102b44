"""Sanity figures: the cascading strip shows each step's map over the crop, the curves plot the similarities."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.plots.maps import overlay
from vit_inspect.plots.sanity import cascading_figure, similarity_figure, step_label
from vit_inspect.studies.sanity import ImageSanity, Similarity, steps_of

GRAY = np.full((32, 32, 3), 128, dtype=np.uint8)


def _result(independent: bool = True) -> ImageSanity:
    steps = steps_of(2)  # None, 1, 0, embedding
    rng = np.random.default_rng(0)
    maps = {m: tuple(rng.normal(size=(4, 4)) for _ in steps) for m in ("gradcam", "rollout")}
    cascading = {m: tuple(Similarity(1.0 - 0.3 * i, 0.9 - 0.2 * i, 1.0 - 0.25 * i) for i in range(len(steps)))
                 for m in maps}
    return ImageSanity(target=1, random_class=2, steps=steps, cascading=cascading,
                       independent={m: (Similarity(0.5, 0.4, 0.3), Similarity(0.7, 0.6, 0.5)) if independent else ()
                                    for m in maps},
                       random_logit={m: Similarity(0.2, 0.1, 0.0) for m in maps}, maps=maps)


def test_step_labels():
    assert [step_label(s) for s in steps_of(2)] == ["trained", "from block 1", "from block 0", "+ embedding"]


def test_cascading_figure_shows_every_steps_map_over_the_crop():
    result = _result()
    fig = cascading_figure(GRAY, result, title="t")
    axes = np.array(fig.axes[:-1]).reshape(2, 5)
    bar = fig.axes[-1]  # the colour bar: each map's own range as 0..1
    assert bar.get_ylabel() == "each map min-max normalised" and bar.get_ylim() == (0.0, 1.0)
    assert [ax.get_title() for ax in axes[0]] == ["input", "trained", "from block 1", "from block 0", "+ embedding"]
    np.testing.assert_array_equal(axes[0, 0].images[0].get_array(), GRAY)
    for row, method in enumerate(result.maps):
        assert axes[row, 0].get_ylabel() == method
        for column, grid_map in enumerate(result.maps[method], start=1):
            np.testing.assert_array_equal(axes[row, column].images[0].get_array(), overlay(GRAY, grid_map, alpha=0.75))
    with pytest.raises(ValueError, match="no maps"):
        cascading_figure(GRAY, ImageSanity(0, None, (None,), {}, {}, {}, {}))


def test_similarity_figure_plots_the_values():
    result = _result()
    fig = similarity_figure(result)
    axes = fig.axes
    assert len(axes) == 6  # cascading and independent rows, three similarities
    spearman = axes[0]
    curves = [line for line in spearman.lines if len(line.get_xdata()) == 4]
    np.testing.assert_allclose(curves[0].get_ydata(), [s.spearman for s in result.cascading["gradcam"]])
    markers = [line for line in spearman.lines if line.get_marker() == "D"]
    assert [float(m.get_ydata()[0]) for m in markers] == [0.2, 0.2]  # the random logit, one per method
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in spearman.lines)  # the pass threshold
    independent = [line for line in axes[3].lines if len(line.get_xdata()) == 2]
    np.testing.assert_allclose(independent[0].get_ydata(), [0.5, 0.7])
    assert len(similarity_figure(_result(independent=False)).axes) == 3

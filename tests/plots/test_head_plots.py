"""Head figures: colour bars, titles, the selected head outlined, the lens's rank axis."""
from __future__ import annotations

import numpy as np

from vit_inspect.plots.canvas import figure_to_rgb
from vit_inspect.plots.heads import head_heatmap_figure, lens_figure


def test_heatmap_is_centred_on_zero_with_a_colour_bar_and_title():
    values = np.array([[1.0, -3.0], [0.5, 0.0]])
    fig = head_heatmap_figure(values, "drop (tiny, class 3)", "logits", selected=(1, 0))
    ax, bar = fig.axes
    assert ax.get_title() == "drop (tiny, class 3)" and bar.get_ylabel() == "logits"
    image = ax.images[0]
    assert image.norm.vmin == -3.0 and image.norm.vmax == 3.0 and image.norm.vcenter == 0.0
    assert len(ax.patches) == 1 and ax.patches[0].get_xy() == (-0.5, 0.5)
    assert figure_to_rgb(fig).shape[2] == 3


def test_lens_figure_plots_ranks_top_down():
    fig = lens_figure(np.array([40, 3, 1]), np.array([0.01, 0.2, 0.9]), "lens (tiny)")
    ax, bar = fig.axes
    assert ax.get_yscale() == "log" and ax.yaxis_inverted()
    np.testing.assert_array_equal(ax.collections[0].get_offsets()[:, 1], [40, 3, 1])
    assert bar.get_ylabel() == "probability of the final class"

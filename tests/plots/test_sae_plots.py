"""SAE galleries: the patch outline by hand, the PIL gallery's tiles, and a feature that never fired."""
from __future__ import annotations

import numpy as np

from vit_inspect.core.sae_index import FeatureEntry
from vit_inspect.plots.sae import GALLERY_SCALE, feature_gallery, feature_gallery_figure, outlined


def entry(n: int) -> FeatureEntry:
    crops = np.zeros((n, 8, 8, 3), np.uint8)
    return FeatureEntry(3, "tabby 50%", 0.1, np.linspace(2, 1, n, dtype=np.float32), tuple(f"i{j}.png" for j in range(n)),
                        np.zeros((n, 2), int), crops)


def test_the_outline_lies_just_outside_the_centred_patch():
    out = outlined(np.zeros((8, 8, 3), np.uint8), (4, 4))  # patch at rows and columns 2-5, outline at 1 and 6
    drawn = out.any(-1)
    expected = np.zeros((8, 8), bool)
    expected[1, 1:7] = expected[6, 1:7] = expected[1:7, 1] = expected[1:7, 6] = True
    assert np.array_equal(drawn, expected)
    assert not outlined(np.zeros((8, 8, 3), np.uint8), (8, 8)).any()  # no room: left as it is


def test_the_gallery_holds_each_crop_enlarged_and_outlined():
    picture = feature_gallery(entry(3), (4, 4), columns=3)
    cyan = np.all(picture == (0, 255, 255), -1)
    assert cyan.sum() == 3 * 20 * GALLERY_SCALE ** 2  # three outlines of 20 pixels, each pixel enlarged
    fig = feature_gallery_figure(entry(3), (4, 4), "feature 3")
    shown = fig.get_axes()[0].get_images()[0].get_array()
    assert len(fig.get_axes()) == 1 and np.array_equal(shown, feature_gallery(entry(3), (4, 4), "feature 3"))


def test_a_feature_that_never_fired_says_so():
    picture = feature_gallery(entry(0), (4, 4))
    assert picture.shape[1] >= 256 and not np.all(picture == (0, 255, 255), -1).any()

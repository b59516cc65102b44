"""Every hostile or odd image is either analysed correctly or refused with a clear message."""
from __future__ import annotations

import numpy as np
import pytest
from support import PHOTOS, tiny_handle
from support.hostile import corpus

from vit_inspect.core.errors import ImageError
from vit_inspect.core.images import ImageLimits, load_image
from vit_inspect.passes.pipeline import analyze_image

CORPUS = corpus()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_file_is_decoded_or_refused(name, tmp_path):
    data, expectation = CORPUS[name]
    path = tmp_path / name
    path.write_bytes(data)
    for source in (data, path):
        if isinstance(expectation, str):
            with pytest.raises(ImageError, match=expectation):
                load_image(source)
        else:
            expectation(np.asarray(load_image(source)))


@pytest.mark.parametrize("name", sorted(n for n, (_, e) in CORPUS.items() if not isinstance(e, str)))
def test_decodable_corpus_files_analyse_then_a_good_image_still_works(name):
    handle = tiny_handle("cls")
    result = analyze_image(handle, CORPUS[name][0])
    assert result.rgb.shape == (32, 32, 3) and np.isfinite(result.chefer).all()
    good = analyze_image(handle, PHOTOS / "chelsea.png")
    assert good.rgb.std() > 10  # a real photo, not a flat colour


def test_limits_are_configurable():
    data = CORPUS["wide_10000x10.png"][0]
    with pytest.raises(ImageError, match="100,000 pixels; the limit is 50,000"):
        load_image(data, ImageLimits(max_pixels=50_000))
    with pytest.raises(ImageError, match="MiB; the limit"):
        load_image(data, ImageLimits(max_bytes=100))


def test_extreme_aspect_ratio_stays_cheap():
    """A 10000x10 image is cropped before resizing: the crop is right and nothing huge is built."""
    from PIL import Image

    from vit_inspect.core.images import Preprocess

    array = np.zeros((10, 10000, 3), np.uint8)
    array[:, 4998:5002] = 255  # a 4 px white stripe; the crop keeps the middle 8.75 source pixels
    pre = Preprocess((224, 224), "crop", 0.875, "bilinear", (0, 0, 0), (1, 1, 1))
    _, rgb = pre.apply(Image.fromarray(array))
    assert rgb.shape == (224, 224, 3)
    assert rgb[:, 112].min() > 200 and rgb[:, :20].max() == 0  # the stripe is in the centre of the crop

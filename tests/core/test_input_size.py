"""An input size the model cannot take is refused with a sentence before the pass; sizes that mean
something are honoured with every geometry that takes a size (crop, squash)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image
from support import tiny_handle

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.geometry import (
    MAX_PASS_MAP_BYTES,
    InputGeometry,
    check_input_size,
)
from vit_inspect.passes.pipeline import analyze_image, model_input


@pytest.mark.parametrize("size, words", [
    ((30, 32), "not a whole number of 8x8 patches; use multiples of the patch size, e.g. 32x32"),
    ((4, 32), "not a whole number of 8x8 patches; use multiples of the patch size, e.g. 8x32"),
    ((0, 32), "not a whole number of 8x8 patches"),
    ((-8, 32), "not a whole number of 8x8 patches"),
])
def test_sizes_that_are_not_whole_patches_are_refused(size, words):
    with pytest.raises(VitInspectError) as refused:
        check_input_size(tiny_handle("cls"), size)
    assert words in str(refused.value)


def test_the_byte_bound_by_hand():
    handle = tiny_handle("cls")  # 2 layers, 2 heads, 8x8 patches, 1 class token
    # 32x48: 4 x 6 = 24 patches + 1 = 25 tokens; 2 x 2 x 25^2 x 4 = 10,000 bytes of maps
    check_input_size(handle, (32, 48), max_bytes=10_000)
    with pytest.raises(VitInspectError) as refused:
        check_input_size(handle, (32, 48), max_bytes=9_999)
    assert "gives 25 tokens, whose attention maps (2 layers x 2 heads x 25^2 x 4 bytes = 0.0 GiB)" in str(refused.value)
    assert MAX_PASS_MAP_BYTES == 16 * 2 ** 30
    check_input_size(handle, (512, 512))  # 4097 tokens: 268 MB, far more patches than its own 16 but within bytes


def test_deit_sized_numbers_by_hand():
    class DeiTTi:  # DeiT-Ti/16's shape: 12 layers, 3 heads, 16x16 patches, 1 class token
        patch_size, depth, num_heads = (16, 16), 12, 3

        @staticmethod
        def layout(size):
            return type("Layout", (), {"num_tokens": 1 + (size[0] // 16) * (size[1] // 16)})()

    check_input_size(DeiTTi, (1024, 1024))  # 4097 tokens: 12 x 3 x 4097^2 x 4 = 2.25 GiB
    with pytest.raises(VitInspectError) as refused:
        check_input_size(DeiTTi, (4000, 4000))  # 62501 tokens: 562,518,000,144 bytes
    assert "= 523.9 GiB) the pass would keep for its backward: more than the 16 GiB allowed" in str(refused.value)


def test_the_pass_refuses_before_running_and_honours_sizes_with_every_geometry():
    handle = tiny_handle("cls")  # 8x8 patches, 32x32 input
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    calls = []
    handle.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    for size in ((33, 32), (32, 36), (8 * 300, 8 * 300)):  # the last: 90,001 tokens, 121 GiB of maps
        with pytest.raises(VitInspectError):
            analyze_image(handle, picture, input_size=size)
    assert calls == []  # refused before any forward
    assert model_input(handle, picture, (32, 48))[0].shape == (1, 3, 32, 48)
    assert model_input(handle, picture, (24, 40), InputGeometry("crop"))[0].shape == (1, 3, 24, 40)
    squashed, rgb, box = model_input(handle, picture, (16, 64), InputGeometry("squash"))
    assert squashed.shape == (1, 3, 16, 64) and rgb.shape == (16, 64, 3) and box == (0.0, 0.0, 60.0, 40.0)
    with pytest.raises(VitInspectError, match="cannot be combined with the 'keep' geometry"):
        model_input(handle, picture, (32, 48), InputGeometry("keep"))
    assert analyze_image(handle, picture, input_size=(16, 64), relevance=False).layout.input_size == (16, 64)


def test_an_image_under_four_patches_on_a_side_is_analysed_with_a_warning():
    """The threshold comes from the model's patch size: 4 patches of 8 pixels is 32 pixels for the tiny model
    (64 for DeiT's 16-pixel patches); below it the pass runs and warns, and the result carries the sentence."""
    from vit_inspect.core.errors import SmallImageWarning
    from vit_inspect.core.geometry import MIN_PATCHES, enlarged_blur

    assert MIN_PATCHES == 4
    assert enlarged_blur((64, 64), (16, 16)) is None and enlarged_blur((31, 400), (8, 8)) is not None
    assert enlarged_blur((63, 500), (16, 16)) == (
        "This image is 63×500 pixels, under 4 of the model's 16×16-pixel patches on a side (64 pixels): the model "
        "sees it enlarged, as a blur, so its predictions and maps say little about the picture. Use a larger "
        "image where you have one.")
    assert "(56 pixels)" in enlarged_blur((40, 40), (8, 14)) and enlarged_blur((56, 56), (8, 14)) is None
    handle = tiny_handle("cls")  # 8x8 patches
    rng = np.random.default_rng(0)
    small = Image.fromarray(rng.integers(0, 256, (31, 80, 3), dtype=np.uint8))
    with pytest.warns(SmallImageWarning, match="This image is 80×31 pixels, under 4 of the model's 8×8-pixel"):
        result = analyze_image(handle, small)
    assert result.enlarged_blur.startswith("This image is 80×31 pixels") and result.rgb.shape == (32, 32, 3)
    large = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallImageWarning)
        assert analyze_image(handle, large).enlarged_blur is None

"""An input size the model cannot take is refused with a sentence before the pass; sizes that mean
something are honoured with every geometry that takes a size (crop, squash)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import tiny_handle
from vit_inspect.errors import VitInspectError
from vit_inspect.geometry import MAX_KEEP_PATCHES_FACTOR, InputGeometry, check_input_size
from vit_inspect.pipeline import analyze_image, model_input


@pytest.mark.parametrize("size, words", [
    ((230, 230), "not a whole number of 16x16 patches; use multiples of the patch size, e.g. 224x224"),
    ((8, 224), "not a whole number of 16x16 patches; use multiples of the patch size, e.g. 16x224"),
    ((0, 224), "not a whole number of 16x16 patches"),
    ((-16, 224), "not a whole number of 16x16 patches"),
    ((4000, 4000), "gives 62500 patches, more than 4 times the model's own 196 (224x224)"),
    ((448, 464), "gives 812 patches, more than 4 times the model's own 196 (224x224)"),  # 28 x 29 > 784
])
def test_refused_sizes_by_hand(size, words):
    with pytest.raises(VitInspectError) as refused:
        check_input_size(size, (16, 16), (224, 224))
    assert words in str(refused.value)


@pytest.mark.parametrize("size", [(224, 224), (16, 16), (224, 320), (448, 448), (16, 784 * 16)])
def test_accepted_sizes_by_hand(size):
    assert MAX_KEEP_PATCHES_FACTOR == 4  # 448x448 is exactly 4 x 196 = 784 patches, the largest square allowed
    check_input_size(size, (16, 16), (224, 224))  # no error: whole patches, at most 784 of them


def test_the_pass_refuses_before_running_and_honours_sizes_with_every_geometry():
    handle = tiny_handle("cls")  # 8x8 patches, 32x32 input: 16 patches, at most 64
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    calls = []
    handle.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    for size in ((33, 32), (32, 36), (72, 72)):
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

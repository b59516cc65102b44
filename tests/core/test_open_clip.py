"""OpenCLIP models as handles: the same numbers as OpenCLIP itself, geometry and preprocessing from the model,
weights from safetensors only, bounded and failing with sentences offline."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from support import REPO
from support.clip import TINY_CLIP, TINY_SIGLIP, clip_handle, make_clip, register_tiny_configs, save_clip, siglip_embeddings

from vit_inspect.core.errors import (InputError, ModelNotFoundError, ModelTooLargeError, WeightsError,
                                     WeightsNotFoundError)
from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.core.open_clip_models import SelfAttention, prompt_view, with_zero_shot
from vit_inspect.core.prompts import Prompt

open_clip = pytest.importorskip("open_clip")
CHELSEA = REPO / "assets" / "chelsea.png"


def test_the_handle_gives_openclip_s_own_logits():
    model = make_clip(seed=1)
    reference = make_clip(seed=1)  # the same weights, untouched by the handle
    handle = clip_handle(model=model)
    pixels = torch.randn(2, 3, 32, 32)
    tokens = open_clip.get_tokenizer(TINY_CLIP)(["a photo of a cat.", "a photo of a dog.", "a photo of a car."])
    with torch.no_grad():
        expected, _ = reference.get_logits(pixels, tokens)
        got = handle.forward(pixels)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for attention in handle.attention_modules:  # written out, as capture runs it
            attention.fused_attn = False
        torch.testing.assert_close(handle.forward(pixels), expected, rtol=1e-5, atol=1e-5)
    assert set(model.state_dict()) == set(reference.state_dict())  # same keys: weights files still load
    assert all(isinstance(a, SelfAttention) for a in handle.attention_modules)


def test_geometry_and_preprocessing_come_from_the_model():
    handle = clip_handle()
    assert (handle.patch_size, handle.native_grid, handle.num_prefix_tokens, handle.depth, handle.num_heads,
            handle.embed_dim, handle.global_pool) == ((8, 8), (4, 4), 1, 2, 2, 32, "token")
    model = make_clip()
    from open_clip.transform import PreprocessCfg, image_transform_v2
    transform = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    image = load_image(CHELSEA)
    pixels, rgb = handle.preprocess.apply(image)
    torch.testing.assert_close(pixels[0], transform(image), rtol=0, atol=1e-5)
    assert rgb.shape == (32, 32, 3)
    with torch.no_grad():  # another input size: position embeddings resampled, as timm does
        assert handle.forward(torch.randn(1, 3, 32, 48)).shape == (1, 3)
    assert handle.patch_pos_embed((4, 6)).shape == (4, 6, 32)


def test_a_siglip_tower_is_a_timm_trunk_with_its_own_pooling():
    model = make_clip(TINY_SIGLIP)
    embeddings = siglip_embeddings(model, 3)
    handle = clip_handle(TINY_SIGLIP, labels=[Prompt(n, e.numpy()) for n, e in zip("abc", embeddings)], model=model)
    assert (handle.family, handle.global_pool, handle.patch_size, handle.native_grid) == ("open_clip", "avg", (16, 16),
                                                                                          (14, 14))
    pixels = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        image = torch.nn.functional.normalize(model.encode_image(pixels), dim=-1)
        expected = model.logit_scale.exp() * image @ embeddings.T + model.logit_bias  # SigLIP's logits, bias -10
        torch.testing.assert_close(handle.forward(pixels), expected, rtol=1e-5, atol=1e-5)


def test_load_model_reads_safetensors_and_refuses_pickles(tmp_path):
    register_tiny_configs()
    path = save_clip(make_clip(seed=2), tmp_path / "tiny.safetensors")
    handle = with_zero_shot(load_model(f"open_clip:{TINY_CLIP}", weights=path, device="cpu"), ["cat", "dog"])
    assert handle.weights == str(path) and handle.labels == ("cat", "dog")
    torch.testing.assert_close(handle.model.visual.conv1.weight, make_clip(seed=2).visual.conv1.weight)
    pickled = tmp_path / "tiny.pth"
    torch.save(make_clip().state_dict(), pickled)
    with pytest.raises(WeightsError, match="never unpickled"):
        load_model(f"open_clip:{TINY_CLIP}", weights=pickled, device="cpu")
    other = save_clip(make_clip(TINY_SIGLIP), tmp_path / "siglip.safetensors")
    with pytest.raises(WeightsError, match="do not fit"):
        load_model(f"open_clip:{TINY_CLIP}", weights=other, device="cpu")


@pytest.mark.parametrize("name, error, says", [
    ("open_clip:ViT-Nope-16", ModelNotFoundError, "no architecture"),
    ("open_clip:ViT-B-16:nosuchtag", ModelNotFoundError, "openai"),
    ("open_clip:ViT-B-16:a:b", ModelNotFoundError, "not an OpenCLIP name"),
    ("open_clip:../etc", ModelNotFoundError, "not an OpenCLIP name"),
    ("open_clip:ViT-B-16", WeightsNotFoundError, "open_clip:ViT-B-16:openai"),
])
def test_names_and_missing_weights_get_sentences(name, error, says, tmp_path):
    with pytest.raises(error) as caught:
        load_model(name, device="cpu", checkpoint_dir=tmp_path)
    assert says in str(caught.value) and str(tmp_path) not in caught.value.public


def test_a_web_user_cannot_name_an_openclip_model():
    with pytest.raises(ModelNotFoundError) as caught:
        load_model("open_clip:ViT-B-16:openai", device="cpu", allow_local_dirs=False)
    assert "operator" in caught.value.public


def test_offline_a_tag_names_the_file_to_put_where(tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsNotFoundError) as caught:
        load_model("open_clip:ViT-B-16:openai", device="cpu", checkpoint_dir=tmp_path)
    assert str(tmp_path / "open_clip_ViT-B-16_openai.safetensors") in str(caught.value)
    assert "not available on this server" in caught.value.public and str(tmp_path) not in caught.value.public


def test_a_model_over_the_bound_is_refused_before_its_weights():
    with pytest.raises(ModelTooLargeError, match="150 M parameters"):
        load_model("open_clip:ViT-B-16:openai", device="cpu", max_model_bytes=100 * 2 ** 20)


UNREACHABLE = """
import json, time
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.load import load_model
start, message = time.perf_counter(), None
try:
    load_model("open_clip:ViT-B-16:openai", device="cpu", checkpoint_dir={empty!r})
except VitInspectError as exc:
    message = str(exc)
print(json.dumps({{"seconds": time.perf_counter() - start, "message": message}}))
"""


def test_an_unreachable_hub_fails_fast_with_the_same_sentence(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-c", UNREACHABLE.format(empty=str(tmp_path / "empty"))], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "the Hugging Face hub is offline (HF_HUB_OFFLINE) or does not answer" in report["message"]
    assert "open_clip_ViT-B-16_openai.safetensors" in report["message"]
    assert report["seconds"] < 30  # one 2-second probe, no retries (model sizing on the meta device included)


def test_prompts_become_columns_after_the_labels():
    handle = clip_handle()
    view, target, contrast, prompt, versus = prompt_view(handle, "a photo of a cat", Prompt("a dog", np.ones(16)))
    assert (target, contrast, prompt.text, versus.text, view.labels) == (3, 4, "a photo of a cat", "a dog",
                                                                         handle.labels)
    with torch.no_grad():
        assert view.forward(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    assert prompt_view(handle, 2, None) == (handle, 2, None, None, None)
    with pytest.raises(InputError, match="itself"):
        prompt_view(handle, "a cat", "a cat ")
    with pytest.raises(InputError, match="tokens"):  # longer than CLIP's 77 tokens: refused, not truncated
        with torch.no_grad():
            prompt_view(handle, " ".join(["cat"] * 80))[0].forward(torch.randn(1, 3, 32, 32))

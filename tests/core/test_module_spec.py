"""A hand-written ViT (examples/toy_vit.py, random weights) opened with a ModuleSpec: its own attention
weights, every analysis through the pipeline, Fig. 7 at 4-pixel patches, and the errors of a wrong spec."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from support import REPO

from vit_inspect import (
    ModuleSpec,
    analyze_image,
    handle_from_module,
    load_model,
    model_report,
)
from vit_inspect.analysis import gradcam_from_tokens, rollout
from vit_inspect.core.errors import (
    ModelNotFoundError,
    UnsupportedModelError,
    WeightsError,
)
from vit_inspect.core.module_spec import load_model_file
from vit_inspect.passes.capture import capture_attention

TOY_FILE = REPO / "examples" / "toy_vit.py"
CHELSEA = REPO / "assets" / "chelsea.png"


def toy_module():
    name = "toy_vit_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOY_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def toy(seed: int = 0):
    torch.manual_seed(seed)
    return toy_module().build()


@pytest.fixture(scope="module")
def handle():
    model, spec = toy()
    return handle_from_module(model, spec, name="toy", device="cpu")


def own_attention(model, pixels: torch.Tensor) -> list[torch.Tensor]:
    """The toy's per-block attention weights as its own attention modules return them, block by block."""
    with torch.no_grad():
        x = model.patch_embed(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed
        weights = []
        for block in model.blocks:
            weights.append(block.attn(block.norm1(x))[1])  # (B, heads, N, N)
            x = block(x)
    return weights


def test_geometry_comes_from_the_spec_and_the_model(handle):
    assert handle.family == "module" and handle.patch_size == (4, 4) and handle.native_grid == (8, 8)
    assert (handle.depth, handle.num_heads, handle.embed_dim, handle.num_prefix_tokens) == (6, 4, 128, 1)
    assert handle.labels[3] == "cat" and handle.global_pool == "token" and not handle.no_embed_class
    assert handle.layout().num_tokens == 65


def test_captured_maps_equal_the_models_own_returned_weights(handle):
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected = torch.stack(own_attention(handle.model, pixels), dim=1)  # (B, depth, heads, N, N)
    with torch.no_grad(), capture_attention(handle) as rec:
        handle.forward(pixels)
    assert torch.equal(rec.attention, expected)
    assert not any(m._forward_hooks for m in handle.model.modules())  # capture left nothing behind

    result = analyze_image(handle, CHELSEA)
    pixels, _ = handle.preprocess.apply(Image.open(CHELSEA))
    own = torch.stack(own_attention(handle.model, pixels), dim=1)[0].numpy()  # (depth, heads, N, N)
    np.testing.assert_allclose(result.attention_stack().astype(np.float32), own, atol=1e-3)
    for layer, head in ((0, 0), (5, 3)):  # class-token query over the 8x8 patches, row-major
        np.testing.assert_allclose(result.attention_map(layer, head), own[layer, head, 0, 1:].reshape(8, 8), atol=1e-3)


def test_gradcam_rollout_and_relevance_run_through_the_pipeline(handle):
    result = analyze_image(handle, CHELSEA, target=3)
    assert result.target == 3 and result.probs.shape == (10,) and result.readout == "class"
    assert result.gradcam.shape == (6, 8, 8) and result.chefer.shape == (8, 8)
    assert result.mean_distance.shape == (6, 4) and np.all(result.mean_distance > 0)
    np.testing.assert_allclose(result.rollout(), rollout(result.attention_stack(), result.layout, query="class"), atol=1e-6)
    # Grad-CAM of the last block, computed here from the toy's own LayerNorm output and its gradient
    pixels, _ = handle.preprocess.apply(Image.open(CHELSEA))
    seen = {}
    hook = handle.model.blocks[-1].norm1.register_forward_hook(lambda m, a, out: seen.setdefault("a", out))
    try:
        logit = handle.model(pixels.requires_grad_(True))[0, 3]
    finally:
        hook.remove()
    grad, = torch.autograd.grad(logit, seen["a"])
    expected = gradcam_from_tokens(seen["a"][0].detach().numpy(), grad[0].numpy(), result.layout)
    np.testing.assert_allclose(result.gradcam[-1], expected, rtol=1e-4, atol=1e-6)


def test_fig7_works_at_4_pixel_patches(handle):
    report = model_report(handle)
    assert report.filter_pca.components.shape == (28, 4, 4, 3)  # k = min(28, 128 filters, 48 dims)
    assert 0.0 < report.filter_pca.explained_variance_ratio.sum() <= 1.0 + 1e-9
    pos = handle.model.pos_embed[0, 1:].detach().numpy()  # (64, D): patch slots after the class slot
    unit = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    np.testing.assert_allclose(report.pos_similarity.reshape(64, 64), unit @ unit.T, atol=1e-5)
    assert report.grid == (8, 8)
    with pytest.raises(UnsupportedModelError, match="8×8 grid only"):
        handle.patch_pos_embed((16, 16))


def test_a_dict_spec_and_a_dataclass_spec_give_the_same_handle():
    model, spec = toy()
    from_dict = handle_from_module(model, spec, device="cpu")
    from_class = handle_from_module(model, ModuleSpec(**spec), device="cpu")
    assert from_dict.layout() == from_class.layout() and from_dict.preprocess == from_class.preprocess
    with pytest.raises(ValueError, match="Unknown ModuleSpec key.*num_head"):
        handle_from_module(model, {**spec, "num_head": 4}, device="cpu")


@pytest.mark.parametrize("change, message", [
    (dict(num_heads=8), r"blocks\.0\.attn gave attention weights of shape \(1, 4, 65, 65\); expected \(1, 8, 65, 65\)"),
    (dict(attention="attn.qkv", attention_output="probs"),
     r"blocks\.0\.attn\.qkv gave attention weights of shape \(1, 65, 384\)"),
    (dict(attention_output="probs"), r"blocks\.0\.attn gave attention weights of shape tuple.*attention_output='tuple'"),
    (dict(attention="attn.proj"), r"blocks\.0\.attn\.proj returned \(1, 65, 128\), not a tuple"),
    (dict(attention="atn"), r"attention \(in blocks\.0\) = 'atn': Block has no attribute 'atn'.*norm1, attn"),
    (dict(blocks="encoder.layers"), r"blocks = 'encoder\.layers': ToyViT has no attribute 'encoder'"),
    (dict(norm1="mlp.9"), r"norm1 \(in blocks\.0\) = 'mlp\.9': Sequential at 'mlp' has no attribute '9'"),
    (dict(pos_embed_prefix_slots=0), r"pos_embed = 'pos_embed' has shape \(1, 65, 128\).*\(1, 64, 128\)"),
    (dict(input_size=(64, 64)), r"pos_embed = 'pos_embed' has shape \(1, 65, 128\).*\(1, 257, 128\)"),
    (dict(patch_embed="blocks.0.norm1"), r"patch_embed = 'blocks\.0\.norm1' is a LayerNorm"),
    (dict(labels=("a", "b")), r"returned \(1, 10\); with 2 labels"),
])
def test_a_wrong_spec_names_the_module_and_the_shape(change, message):
    model, spec = toy()
    with pytest.raises(UnsupportedModelError, match=message):
        handle_from_module(model, {**spec, **change}, device="cpu")
    assert not any(m._forward_hooks for m in model.modules())  # the check left no hook behind


def test_pre_softmax_scores_are_not_taken_for_probabilities():
    model, spec = toy()
    attn = model.blocks[2].attn
    original = attn.forward

    def scores_instead(x):
        out, weights = original(x)
        return out, weights.log()  # right shape, wrong quantity

    attn.forward = scores_instead
    with pytest.raises(UnsupportedModelError, match=r"blocks\.2\.attn gave a \(1, 4, 65, 65\) tensor that is not "
                                                    r"attention probabilities"):
        handle_from_module(model, spec, device="cpu")


def test_head_averaged_weights_get_a_hint():
    model, spec = toy()
    attn = model.blocks[0].attn
    original = attn.forward
    attn.forward = lambda x: (original(x)[0], original(x)[1].mean(1))  # what nn.MultiheadAttention gives by default
    with pytest.raises(UnsupportedModelError, match="average_attn_weights=False"):
        handle_from_module(model, spec, device="cpu")


def test_spec_fields_are_checked_on_their_own():
    _, spec = toy()
    with pytest.raises(ValueError, match="attention_output"):
        ModuleSpec(**{**spec, "attention_output": "weights"})
    with pytest.raises(ValueError, match="readout='token' needs class_token"):
        ModuleSpec(**{**spec, "class_token": False, "pos_embed_prefix_slots": 0})
    frozen = ModuleSpec(**spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.num_heads = 2
    assert isinstance(frozen.labels, tuple) and frozen.num_prefix_tokens == 1


def test_other_input_sizes_are_refused_with_a_sentence(handle):
    with pytest.raises(UnsupportedModelError, match="takes 32×32 inputs only, got 64×64"):
        analyze_image(handle, CHELSEA, input_size=(64, 64))


def test_load_model_file_imports_the_operators_file_and_loads_its_weights(tmp_path):
    from safetensors.torch import save_file

    model, _ = toy(seed=5)
    weights = tmp_path / "toy.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    handle = load_model_file(f"{TOY_FILE}:build", weights=weights, device="cpu")
    assert handle.name == "toy_vit.py:build" and handle.weights == str(weights)
    assert torch.equal(handle.model.pos_embed, model.pos_embed)
    same = load_model("ignored", weights=weights, device="cpu", model_file=str(TOY_FILE))  # function defaults to build
    assert torch.equal(same.model.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)

    with pytest.raises(ModelNotFoundError, match="FILE.py:FUNCTION"):
        load_model_file(f"{TOY_FILE}:build()")
    with pytest.raises(ModelNotFoundError, match="has no function 'make'"):
        load_model_file(f"{TOY_FILE}:make")
    wrong = tmp_path / "wrong.safetensors"
    save_file({"pos_embed": torch.zeros(1, 65, 128)}, str(wrong))
    with pytest.raises(WeightsError, match="missing key"):
        load_model_file(f"{TOY_FILE}:build", weights=wrong)


def test_missing_weights_of_a_model_file_point_to_its_training_before_anything_is_built(tmp_path):
    from vit_inspect.core.errors import WeightsNotFoundError

    absent = tmp_path / "checkpoints" / "toy_vit_cifar10.safetensors"
    with pytest.raises(WeightsNotFoundError) as info:
        load_model_file(f"{TOY_FILE}:build", weights=absent)
    assert str(info.value) == (
        f"No weights file at {str(absent)!r}. A hand-written model's weights come from training it; beside "
        f"toy_vit.py is a training script: python {TOY_FILE.parent / 'train_cifar10.py'} (see its --help for "
        "where it writes them). Or leave out --weights to inspect the model untrained, as build() makes it.")
    assert info.value.public == "The weights file 'toy_vit_cifar10.safetensors' is not available."

    # a model file of one's own, with two training scripts beside it and none: its function never runs
    (tmp_path / "mine.py").write_text(f"def make():\n    open({str(tmp_path / 'built')!r}, 'w').write('x')\n")
    message = lambda: str(pytest.raises(WeightsNotFoundError, load_model_file, f"{tmp_path / 'mine.py'}:make",
                                        weights=absent).value)  # noqa: E731
    assert "train it and save its state dict as .safetensors. Or leave out --weights" in message()
    assert "as make() makes it" in message()
    for name in ("train_b.py", "train_a.py"):
        (tmp_path / name).write_text("")
    assert (f"beside mine.py are training scripts: python {tmp_path / 'train_a.py'} or python "
            f"{tmp_path / 'train_b.py'} (see") in message()
    assert not (tmp_path / "built").exists()

"""Model randomisation: which weights each layer owns, the model's own initialiser under a seed, exact
restoration (also after an exception), nesting for the cascading test."""
from __future__ import annotations

from contextlib import ExitStack

import pytest
import torch
from support import TINY_TIMM, tiny_handle, tiny_hf

from vit_inspect.core.errors import InterventionError
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.interventions import ablate_heads
from vit_inspect.passes.randomise import (
    EMBEDDING,
    cascade_order,
    fresh_weights,
    layer_parameters,
    randomised,
)


def _x(handle, seed=0):
    return torch.randn(1, 3, *handle.input_size, generator=torch.Generator().manual_seed(seed))


def _state(handle):
    return {k: v.detach().clone() for k, v in handle.model.state_dict().items()}


def _equal(handle, state):
    return all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())


def test_layers_own_their_blocks_and_the_embedding_and_never_the_head():
    handle = tiny_handle("distilled")
    layers = layer_parameters(handle)
    assert set(layers) == {0, 1, EMBEDDING}
    assert set(layers[EMBEDDING]) == {"patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token", "dist_token",
                                      "pos_embed"}
    assert all(name.startswith("blocks.1.") for name in layers[1]) and len(layers[1]) == 12
    owned = {n for names in layers.values() for n in names}
    assert {n for n, _ in handle.model.named_parameters()} - owned == {"norm.weight", "norm.bias", "head.weight",
                                                                       "head.bias", "head_dist.weight",
                                                                       "head_dist.bias"}
    hf = handle_from_hf(tiny_hf(), device="cpu")
    hf_layers = layer_parameters(hf)
    assert set(hf_layers[EMBEDDING]) == {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
                                         "vit.embeddings.patch_embeddings.projection.weight",
                                         "vit.embeddings.patch_embeddings.projection.bias"}
    assert all(name.startswith("vit.layers.0.") for name in hf_layers[0])
    assert cascade_order(3) == (2, 1, 0, EMBEDDING)


def test_fresh_weights_are_the_models_own_initialiser_under_the_seed():
    """timm's VisionTransformer.init_weights run on a copy with torch seeded gives the same values; the
    caller's random state is untouched and the trained model is unchanged."""
    handle = tiny_handle("cls")
    state = _state(handle)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    fresh = fresh_weights(handle, seed=7)
    assert torch.equal(torch.rand(3), before)  # the caller's generator was restored
    assert _equal(handle, state)
    import copy
    model = copy.deepcopy(handle.model)
    torch.manual_seed(7)
    model.init_weights()
    expected = dict(model.named_parameters())
    for name, value in fresh.values.items():
        assert torch.equal(value, expected[name]), name
    # timm's rules: LayerNorm at 1 / 0, Linear biases 0, weights a normal of std .02 (truncated at ±2, absolute)
    assert torch.equal(fresh.values["blocks.0.norm1.weight"], torch.ones(32))
    assert torch.equal(fresh.values["blocks.1.attn.qkv.bias"], torch.zeros(96))
    weight = fresh.values["blocks.1.mlp.fc1.weight"]
    assert 0.015 < weight.std() < 0.025 and abs(weight.mean()) < 0.005
    assert torch.equal(fresh_weights(handle, seed=7).values["pos_embed"], fresh.values["pos_embed"])
    assert not torch.equal(fresh_weights(handle, seed=8).values["pos_embed"], fresh.values["pos_embed"])


def test_a_hook_that_cannot_be_copied_stays_on_the_model_and_off_the_copy():
    """A server counts the model's forwards with a hook bound to an object holding a lock (which cannot be
    deep-copied); the fresh weights are drawn all the same, and the hook keeps counting on the model only."""
    import threading

    class Counter:
        def __init__(self):
            self.lock, self.calls = threading.Lock(), 0

        def count(self, module, args):
            with self.lock:
                self.calls += 1

    handle = tiny_handle("cls")
    counter = Counter()
    hook = handle.model.register_forward_pre_hook(counter.count)
    try:
        fresh = fresh_weights(handle, seed=7)
        assert counter.calls == 0  # the initialiser ran no forward, on the copy or the model
        hook.remove()
        assert all(torch.equal(v, fresh_weights(handle, seed=7).values[k]) for k, v in fresh.values.items())
        hook = handle.model.register_forward_pre_hook(counter.count)
        with torch.no_grad():
            handle.forward(_x(handle))
        assert counter.calls == 1
    finally:
        hook.remove()


def test_hugging_face_weights_are_redrawn_although_marked_initialised():
    handle = handle_from_hf(tiny_hf(), device="cpu")
    fresh = fresh_weights(handle, seed=0)
    trained = dict(handle.model.named_parameters())
    name = "vit.layers.1.mlp.fc1.weight"
    assert not torch.equal(fresh.values[name], trained[name])
    assert 0.015 < fresh.values[name].std() < 0.025  # normal(0, initializer_range = .02)


@pytest.mark.parametrize("kind", sorted(TINY_TIMM))
def test_randomised_changes_only_its_layers_and_restores_them_bit_for_bit(kind):
    handle = tiny_handle(kind)
    x = _x(handle)
    state = _state(handle)
    with torch.no_grad():
        before = handle.forward(x)
        with randomised(handle, [1], seed=0) as chosen:
            assert chosen == [1]
            inside = handle.forward(x)
            params = dict(handle.model.named_parameters())
            assert torch.equal(params["blocks.1.attn.qkv.weight"],
                               fresh_weights(handle, 0).values["blocks.1.attn.qkv.weight"])
            assert torch.equal(params["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])
            assert torch.equal(params["head.weight"], state["head.weight"])
        assert (inside - before).abs().max() > 1e-4
        assert _equal(handle, state)
        assert torch.equal(handle.forward(x), before)


def test_an_exception_restores_the_model_exactly_and_leaves_no_hooks():
    handle = tiny_handle("reg4")
    x = _x(handle)
    state = _state(handle)
    parameters_before = [id(p) for p in handle.model.parameters()]
    with torch.no_grad():
        before = handle.forward(x)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(handle), ablate_heads(handle, [(0, 0)]), randomised(handle, [0, EMBEDDING]):
            handle.forward(x)
            raise RuntimeError("boom")
    assert _equal(handle, state)
    assert [id(p) for p in handle.model.parameters()] == parameters_before  # the same Parameter objects
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in handle.model.modules()) == 0
    with torch.no_grad():
        assert torch.equal(handle.forward(x), before)


def test_cascading_by_nesting_equals_randomising_the_layers_at_once():
    handle = tiny_handle("cls")
    x = _x(handle)
    state = _state(handle)
    fresh = fresh_weights(handle, seed=3)
    outputs = []
    with torch.no_grad(), ExitStack() as stack:
        for layer in cascade_order(handle.depth):
            stack.enter_context(randomised(handle, [layer], fresh))
            outputs.append(handle.forward(x))
        with pytest.raises(ValueError):
            raise ValueError("an error deep inside the cascade")
    assert _equal(handle, state)
    with torch.no_grad():
        for count, output in enumerate(outputs, 1):
            with randomised(handle, cascade_order(handle.depth)[:count], fresh):
                assert torch.equal(handle.forward(x), output)
    assert _equal(handle, state)


def test_layers_are_checked():
    handle = tiny_handle("cls")
    with pytest.raises(InterventionError, match="does not exist"):
        with randomised(handle, [2]):
            pass
    with pytest.raises(InterventionError, match="does not exist"):
        with randomised(handle, ["head"]):
            pass
    with randomised(handle, [-1]) as chosen:
        assert chosen == [1]
    with pytest.raises(InterventionError, match="not the model's"):
        with randomised(handle, [0], fresh_weights(handle_from_hf(tiny_hf(), device="cpu"))):
            pass

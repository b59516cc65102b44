"""The logit lens reads each residual stream exactly as the model's own head reads its last one."""
from __future__ import annotations

import pytest
import torch
from support import TINY_TIMM, tiny_handle, tiny_hf

from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.passes.lens import lens_readouts, lens_tokens

# the leading tokens a class-token head reads (class, distillation, registers); 0: a pooled head reads them all
TOKENS_READ = {"cls": 1, "gap": 0, "distilled": 2, "reg4": 5, "no_embed_class": 1, "patch14": 1, "patch16": 1,
               "nonsquare": 1}


@pytest.mark.parametrize("kind", sorted(TINY_TIMM))
def test_the_lens_of_the_tokens_read_equals_the_models_own_norm_and_head(kind):
    handle = tiny_handle(kind, seed=3)
    model = handle.model
    x = torch.randn(2, handle.layout().num_tokens, handle.embed_dim)
    assert lens_tokens(handle) == TOKENS_READ[kind]
    read = lens_tokens(handle) or x.shape[1]
    with torch.no_grad():
        expected = model.forward_head(model.norm(x))
        lens = {name: readout(x[:, :read]) for name, readout in lens_readouts(handle).items()}
    assert lens["readout"].shape == expected.shape == (2, model.num_classes)
    torch.testing.assert_close(lens["readout"], expected, rtol=1e-6, atol=1e-6)
    if kind == "distilled":  # each token through its own head
        torch.testing.assert_close(lens["class"], model.head(model.norm(x)[:, 0]), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lens["distillation"], model.head_dist(model.norm(x)[:, 1]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distilled", [False, True])
def test_a_hugging_face_heads_lens_reads_its_prefix_tokens(distilled):
    model = tiny_hf(distilled, seed=2)
    handle = handle_from_hf(model, device="cpu")
    x = torch.randn(2, handle.layout().num_tokens, handle.embed_dim)
    assert lens_tokens(handle) == (2 if distilled else 1)
    readouts = lens_readouts(handle)
    with torch.no_grad():
        for name, readout in readouts.items():
            torch.testing.assert_close(readout(x[:, :lens_tokens(handle)]), readout(x), rtol=1e-6, atol=1e-6)
        normed = model.base_model.layernorm(x)
        head = (model.classifier(normed[:, 0]) if not distilled else
                (model.cls_classifier(normed[:, 0]) + model.distillation_classifier(normed[:, 1])) / 2)
        torch.testing.assert_close(readouts["readout"](x[:, :lens_tokens(handle)]), head, rtol=1e-6, atol=1e-6)

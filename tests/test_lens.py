"""The logit lens reads each residual stream exactly as the model's own head reads its last one."""
from __future__ import annotations

import pytest
import torch

from conftest import EXPECTED_PREFIX, TINY_TIMM, tiny_handle
from vit_inspect.lens import lens_readouts


@pytest.mark.parametrize("kind", sorted(TINY_TIMM))
def test_the_lens_equals_the_models_own_norm_and_head(kind):
    handle = tiny_handle(kind, seed=3)
    model = handle.model
    x = torch.randn(2, handle.layout().num_tokens, handle.embed_dim)
    seen = []
    hook = model.norm.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            lens = lens_readouts(handle)["readout"](x)
    finally:
        hook.remove()
    with torch.no_grad():
        expected = model.forward_head(model.norm(x))
    assert lens.shape == expected.shape == (2, model.num_classes)
    torch.testing.assert_close(lens, expected, rtol=1e-6, atol=1e-6)
    # a class-token head needs only its prefix tokens normalised (class, distillation, registers); a pooled
    # head reads every patch token, so every token goes through the norm
    assert seen == [EXPECTED_PREFIX[kind] if kind != "gap" else x.shape[1]]

"""Input × Gradient (Shrikumar, Greenside, Shcherbina & Kundaje 2016, "Not Just a Black Box: Learning
Important Features Through Propagating Activation Differences", Sec. 2 and Eq. 1 there: attribution =
x ⊙ ∂S/∂x) as a vit_inspect method, registered through the entry point group ``vit_inspect.methods``.

x is the (1, 3, H, W) normalised model input the pass saw and S the explained score: the logit of the
target class (minus the contrast class's logit when the pass explained one). The (3, H, W) attribution is
reduced to the patch grid by summing over the three channels and then over each patch's pixels, so a
patch's value is the sum of x ⊙ ∂S/∂x over its patch_h × patch_w × 3 inputs (signed, in logit units).
Cost: one forward and one backward of its own per map.
"""
from __future__ import annotations

import numpy as np
import torch

from vit_inspect.methods import Method, MethodContext


def input_x_gradient(context: MethodContext) -> np.ndarray | None:
    """(grid_h, grid_w) float64 sum per patch of x ⊙ ∂S/∂x over channels and pixels; None without a head."""
    if context.target is None:
        return None
    handle, layout = context.handle, context.result.layout
    x = context.model_input().detach().to(handle.device).clone().requires_grad_(True)  # (1, 3, H, W)
    with torch.enable_grad():
        logits = handle.forward(x).float()  # (1, num_classes)
        score = logits[0, context.target]
        if context.result.contrast is not None:
            score = score - logits[0, context.result.contrast]
        (gradient,) = torch.autograd.grad(score, x)
    pixels = (x.detach() * gradient)[0].sum(0).double().cpu()  # (H, W)
    grid = pixels.reshape(layout.grid_h, layout.patch_h, layout.grid_w, layout.patch_w)
    return grid.sum(dim=(1, 3)).numpy()  # (grid_h, grid_w)


METHOD = Method(
    name="input_x_gradient", title="Input × Gradient, summed per patch", unit="logit (x · ∂S/∂x summed)",
    paper="Shrikumar et al. 2016, Eq. 1 (x ⊙ ∂S/∂x), summed over channels and each patch's pixels",
    reads="own passes", forwards=1, backwards=1, compute=input_x_gradient, signed=True, cmap="RdBu_r")

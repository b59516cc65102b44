"""Every block's output patch tokens, for the analyses that read the residual stream of any block (concepts,
patch similarity).

The pass (`pipeline.analyze_image`) records the residual stream after every block anyway (for the logit lens);
where every block's patch tokens are small in float16 (`keeps_block_tokens`: DeiT-Ti at 224 px, 0.9 MB; ViT-B/16
at 224 px, 3.6 MB) the result keeps them (`ImageAnalysis.block_tokens`), so that a concept or similarity redraw
never goes back to the model. A larger model's result keeps none (DINOv2-L/14 at 518 px would hold 67 MB), and
`block_tokens` then runs one forward without gradients over the result's own input (its ``rgb``, normalised:
the very input of a pass over an image file) and records the block asked for.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch

from vit_inspect.core.errors import InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.result import ImageAnalysis

BLOCK_TOKENS_BYTES = 4 * 2 ** 20  # float16 patch tokens of every block a result keeps, at most


def keeps_block_tokens(depth: int, num_patches: int, dim: int) -> bool:
    """Whether a result keeps every block's (P, D) patch tokens in float16: depth * P * D * 2 bytes at most
    `BLOCK_TOKENS_BYTES`."""
    return depth * num_patches * dim * 2 <= BLOCK_TOKENS_BYTES


def stacked_patch_tokens(residuals: Sequence[torch.Tensor], layout: TokenLayout) -> np.ndarray:
    """(depth, P, D) float16 patch tokens of image 0 from each block's (B, N, D) output, rounded once by torch."""
    return torch.stack([layout.patches(x[0], axis=0) for x in residuals]).float().to(torch.float16).cpu().numpy()


def checked_layer(layer: int | None, depth: int) -> int:
    """The 0-based block ``layer`` names (None: the last; negative counts from the end), or an `InputError`
    with a sentence when the model has no such block."""
    if layer is None:
        return depth - 1
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -depth <= layer < depth:
        raise InputError(f"Block {layer!r} does not exist: this model has blocks 0 to {depth - 1}.")
    return int(layer) % depth


@contextmanager
def recording_blocks(handle: ViTHandle, layers: Sequence[int],
                     detach: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Inside the block, each forward's (B, N, D) output of the blocks ``layers`` (0-based) lands in the dict
    it yields, detached (``detach=False``: still in the autograd graph); the hooks are removed on leaving, also
    after an exception."""
    seen: dict[int, torch.Tensor] = {}

    def hook_of(layer: int):
        def hook(module, args, output) -> None:
            tokens = output[0] if isinstance(output, tuple) else output
            seen[layer] = tokens.detach() if detach else tokens
        return hook

    hooks = []
    try:
        for layer in layers:
            hooks.append(handle.blocks[layer].register_forward_hook(hook_of(layer)))
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def block_tokens(handle: ViTHandle, result: ImageAnalysis, layer: int | None = None) -> np.ndarray:
    """(P, D) float32 output patch tokens of block ``layer`` (None: the last) for the image of ``result``: the
    result's own where it kept them (`keeps_block_tokens`), otherwise from one forward without gradients over
    its input (module docstring). ``handle`` must be the model of ``result``."""
    if result.model_name != handle.name or result.depth != handle.depth:
        raise InputError(f"This result is of {result.model_name!r}, not of {handle.name!r}.")
    layer = checked_layer(layer, handle.depth)
    if result.block_tokens is not None:
        return result.block_tokens[layer].astype(np.float32)
    return input_block_tokens(handle, handle.preprocess.normalize(result.rgb), layer, result.layout)


def input_block_tokens(handle: ViTHandle, pixels: torch.Tensor, layer: int, layout: TokenLayout) -> np.ndarray:
    """(P, D) float32 output patch tokens of block ``layer`` (0-based) for the (1, 3, H, W) normalised input
    ``pixels`` whose token layout is ``layout``: one forward without gradients."""
    with torch.no_grad(), recording_blocks(handle, [layer]) as seen:
        handle.forward(pixels.to(handle.device))
    return layout.patches(seen[layer][0], axis=0).float().cpu().numpy()

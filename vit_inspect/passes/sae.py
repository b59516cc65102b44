"""A block's output read, or replaced by an SAE's reconstruction, in context managers: hooks on, removed in
`finally`, even after an exception.

The output of block l is the residual stream after it, (B, N, d), the SAE's input (`analysis.sae`). With an
SAE trained on the patch tokens only, only those are read or replaced; the prefix tokens pass unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from vit_inspect.analysis.sae import encode, normalise, reconstruct
from vit_inspect.core.errors import CaptureError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.tokens import TokenLayout


def token_slice(layout: TokenLayout, tokens: str) -> slice:
    """The token axis an SAE reads: every token ("all") or the patch tokens ("patches")."""
    return layout.patch_slice if tokens == "patches" else slice(0, layout.num_tokens)


def _block(handle: ViTHandle, layer: int) -> torch.nn.Module:
    if not 0 <= layer < handle.depth:
        raise CaptureError(f"{handle.name!r} has blocks 0 to {handle.depth - 1}; there is no block {layer}.")
    return handle.blocks[layer]


class _StopForward(Exception):
    """Raised by `block_output(..., stop=True)` once it has the block's output; never leaves the context."""


@contextmanager
def block_output(handle: ViTHandle, layer: int, on_output: Callable[[torch.Tensor], None],
                 stop: bool = False) -> Iterator[None]:
    """Calls `on_output` with the (B, N, d) detached output of block `layer` in every forward run inside. With
    `stop`, the forward ends there (the blocks after it are never run, and the forward returns nothing): the
    rest of the `with` body after the forward is skipped, so the forward must be its last statement."""
    def hook(module, args, output):
        on_output((output[0] if isinstance(output, tuple) else output).detach())
        if stop:
            raise _StopForward

    removable = _block(handle, layer).register_forward_hook(hook)
    try:
        yield
    except _StopForward:
        pass
    finally:
        removable.remove()


@contextmanager
def replaced_block_output(handle: ViTHandle, sae: SparseAutoencoder, layout: TokenLayout,
                          on_pair: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> Iterator[None]:
    """Forwards run inside see block `sae.info.layer`'s output with the SAE's tokens (`token_slice`) replaced by
    their reconstruction x̂; `on_pair(tokens, x̂)`, when given, sees both, each (B, n, d)."""
    where = token_slice(layout, sae.info.tokens)

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        tokens = hidden[:, where]  # (B, n, d)
        x_hat = reconstruct(tokens.float(), sae).to(hidden.dtype)
        if on_pair is not None:
            on_pair(tokens.detach(), x_hat.detach())
        replaced = hidden.clone()
        replaced[:, where] = x_hat
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    removable = _block(handle, sae.info.layer).register_forward_hook(hook)
    try:
        yield
    finally:
        removable.remove()


def patch_codes(handle: ViTHandle, sae: SparseAutoencoder, pixels: torch.Tensor, logits: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((B, P, F) codes z of the patch tokens of block `sae.info.layer`'s output, (B, C) logits or None) for
    (B, 3, H, W) normalised pixels, without gradients. Only the patch tokens are encoded (a prefix token has no
    place in the image), whatever tokens the SAE was trained on; the SAE must be on the handle's device. With
    `logits` the whole forward runs; otherwise it stops after the block."""
    captured: list[torch.Tensor] = []
    with torch.no_grad():
        with block_output(handle, sae.info.layer, captured.append, stop=not logits):
            out = handle.forward(pixels.to(handle.device))
        layout = handle.layout(tuple(pixels.shape[-2:]))
        tokens = layout.patches(captured[0], axis=1).float()  # (B, P, d)
        codes = encode(normalise(tokens, sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)  # (B, P, F)
    return codes, (out if logits else None)

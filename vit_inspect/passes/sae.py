"""A block's output read, or replaced by an SAE's reconstruction, in context managers: hooks on, removed in
`finally`, even after an exception.

The output of block l is the residual stream after it, (B, N, d), the SAE's input (`analysis.sae`). With an
SAE trained on the patch tokens only, only those are read or replaced; the prefix tokens pass unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

from vit_inspect.analysis.sae import edited_tokens, reconstruct
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


@contextmanager
def edited_block_output(handle: ViTHandle, sae: SparseAutoencoder, layout: TokenLayout, scales: dict[int, float],
                        patches: Sequence[int] | None = None) -> Iterator[None]:
    """Forwards run inside see block `sae.info.layer`'s output with the SAE's features scaled
    (`analysis.sae.edited_tokens`: feature f's code times `scales[f]`, the SAE's error kept) at the SAE's tokens
    (`token_slice`), or only at the patch tokens numbered `patches` (row-major over the grid, from 0). Gradients
    flow through the edit."""
    where = token_slice(layout, sae.info.tokens)
    count = where.stop - where.start
    positions = None
    if patches is not None:
        offset = layout.patch_slice.start - where.start  # patch p sits at token offset + p within the SAE's slice
        picked = [offset + int(p) for p in patches]
        if any(not offset <= i < offset + layout.num_patches for i in picked):
            raise CaptureError(f"the image has patches 0 to {layout.num_patches - 1}.")
        positions = torch.zeros(count, dtype=torch.bool)
        positions[picked] = True

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        mask = None if positions is None else positions.to(hidden.device)
        edited = edited_tokens(hidden[:, where].float(), sae, scales, mask).to(hidden.dtype)
        replaced = torch.cat([hidden[:, :where.start], edited, hidden[:, where.stop:]], 1)
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    removable = _block(handle, sae.info.layer).register_forward_hook(hook)
    try:
        yield
    finally:
        removable.remove()

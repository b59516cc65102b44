"""A block's output read, or replaced by an SAE's reconstruction, in context managers: hooks on, removed in
`finally`, even after an exception.

The output of block l is the residual stream after it, (B, N, d), the SAE's input (`analysis.sae`). With an
SAE trained on the patch tokens only, only those are read or replaced; the prefix tokens pass unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from vit_inspect.analysis.sae import edited_tokens, encode, normalise, rank_features, reconstruct
from vit_inspect.core.errors import CaptureError, InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.core.sae_index import SAEIndex
from vit_inspect.core.tokens import TokenLayout


def token_slice(layout: TokenLayout, tokens: str) -> slice:
    """The token axis an SAE reads: every token ("all") or the patch tokens ("patches")."""
    return layout.patch_slice if tokens == "patches" else slice(0, layout.num_tokens)


def _block(handle: ViTHandle, layer: int) -> torch.nn.Module:
    if not 0 <= layer < handle.depth:
        raise CaptureError(f"{handle.name!r} has blocks 0 to {handle.depth - 1}; there is no block {layer}.")
    return handle.blocks[layer]


@contextmanager
def _hooked(block: torch.nn.Module, hook: Callable) -> Iterator[None]:
    """`hook` on `block`'s forward inside, removed in `finally`."""
    removable = block.register_forward_hook(hook)
    try:
        yield
    finally:
        removable.remove()


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
                          on_pair: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                          keep_graph: bool = False) -> Iterator[None]:
    """Forwards run inside see block `sae.info.layer`'s output with the SAE's tokens (`token_slice`) replaced by
    their reconstruction x̂; `on_pair(tokens, x̂)`, when given, sees both, each (B, n, d): detached, or, with
    `keep_graph`, x̂ as computed (a loss on it reaches the SAE's tensors when they require gradients)."""
    where = token_slice(layout, sae.info.tokens)

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        tokens = hidden[:, where]  # (B, n, d)
        x_hat = reconstruct(tokens.float(), sae).to(hidden.dtype)
        if on_pair is not None:
            on_pair(tokens.detach(), x_hat if keep_graph else x_hat.detach())
        replaced = hidden.clone()
        replaced[:, where] = x_hat
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    with _hooked(_block(handle, sae.info.layer), hook):
        yield


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


@dataclass(frozen=True)
class FeatureActivation:
    """One feature of one image (`image_features`)."""

    feature: int
    activation: float  # its code summed over the image's patches, or at the one patch asked for
    peak: float  # its largest code over the image's patches
    peak_patch: tuple[int, int]  # (row, col) of that code
    label: str  # the classes where it fires most, from the index ("" without one)

    def as_dict(self) -> dict:
        return {"feature": self.feature, "activation": self.activation, "peak": self.peak,
                "peak_patch": list(self.peak_patch), "label": self.label}


@dataclass(frozen=True)
class ImageFeatures:
    """An image's SAE features: the codes of every patch and the top features over the image or at one patch."""

    codes: np.ndarray  # (grid_h, grid_w, F) float32 codes z of the patch tokens at block `layer`'s output
    layer: int  # the block the SAE reads
    patch: tuple[int, int] | None  # the (row, col) the features were ranked at; None: over the image
    features: tuple[FeatureActivation, ...]  # largest activation first

    def feature_map(self, feature: int) -> np.ndarray:
        """(grid_h, grid_w) codes of one feature over the image."""
        if not 0 <= int(feature) < self.codes.shape[-1]:
            raise InputError(f"Feature {feature} does not exist: this SAE has features 0 to {self.codes.shape[-1] - 1}.")
        return self.codes[..., int(feature)]


def image_features(handle: ViTHandle, sae: SparseAutoencoder, rgb: np.ndarray, top: int = 10,
                   patch: tuple[int, int] | None = None, index: SAEIndex | None = None) -> ImageFeatures:
    """The SAE features of one (H, W, 3) uint8 preprocessed image (the crop the model sees): one forward up to
    block `sae.info.layer` (`patch_codes`), then the `top` features by summed activation over the image, or
    by activation at patch (row, col); labels from `index` when given (the caller checks it fits)."""
    check_fits(sae, handle.name, handle.depth, handle.embed_dim)
    layout = handle.layout(rgb.shape[:2])
    if patch is not None and not (0 <= patch[0] < layout.grid_h and 0 <= patch[1] < layout.grid_w):
        raise InputError(f"Patch {patch} is outside the {layout.grid_h}×{layout.grid_w} grid (rows and columns "
                         "count from 0).")
    if top < 1:
        raise InputError("The number of features shown must be at least 1.")
    codes, _ = patch_codes(handle, sae.to(handle.device), handle.preprocess.normalize(rgb))
    grid = codes[0].reshape(layout.grid_h, layout.grid_w, -1).cpu()  # (grid_h, grid_w, F)
    indices, values = rank_features(grid, top, patch)
    rows = []
    for f, value in zip(indices.tolist(), values.tolist()):
        column = grid[..., f]
        peak = int(column.argmax())
        rows.append(FeatureActivation(f, float(value), float(column.max()), divmod(peak, layout.grid_w),
                                      index.label(f) if index is not None else ""))
    return ImageFeatures(grid.numpy(), sae.info.layer, patch, tuple(rows))


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

    with _hooked(_block(handle, sae.info.layer), hook):
        yield

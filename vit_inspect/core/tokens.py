"""Token geometry of a ViT: prefix tokens, the patch grid, patch centres, pixel <-> patch.

A ViT's sequence is ``num_prefix_tokens`` special tokens (class, distillation, registers; in that
order for timm and Hugging Face models) followed by ``grid_h * grid_w`` patch tokens in row-major
order. This module is the only place that splits the two; everything else asks a `TokenLayout`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLayout:
    """Where each token of one forward pass sits."""

    num_prefix_tokens: int  # class + distillation + register tokens, all before the patches
    has_class_token: bool  # token 0 is the class token
    num_dist_tokens: int  # distillation tokens (DeiT distilled: 1), right after the class token
    num_reg_tokens: int  # register tokens (Darcet et al. 2024), after class/distillation tokens
    grid_h: int  # patch rows
    grid_w: int  # patch columns
    patch_h: int  # patch height in input pixels
    patch_w: int  # patch width in input pixels

    def __post_init__(self) -> None:
        expected = int(self.has_class_token) + self.num_dist_tokens + self.num_reg_tokens
        if expected != self.num_prefix_tokens:
            raise ValueError(
                f"num_prefix_tokens={self.num_prefix_tokens} but class/dist/reg tokens add up to {expected}")
        if min(self.grid_h, self.grid_w, self.patch_h, self.patch_w) < 1:
            raise ValueError(f"empty patch grid {self.grid_h}x{self.grid_w} of {self.patch_h}x{self.patch_w} px patches")

    @property
    def num_patches(self) -> int:
        return self.grid_h * self.grid_w

    @property
    def num_tokens(self) -> int:
        """N, the sequence length: prefix tokens plus patch tokens."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def input_size(self) -> tuple[int, int]:
        """(H, W) in pixels covered by the patch grid."""
        return self.grid_h * self.patch_h, self.grid_w * self.patch_w

    @property
    def class_token_index(self) -> int | None:
        return 0 if self.has_class_token else None

    @property
    def patch_slice(self) -> slice:
        return slice(self.num_prefix_tokens, self.num_tokens)

    def split(self, x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """Split a token axis into (prefix part, patch part); works for numpy arrays and torch tensors."""
        if x.shape[axis] != self.num_tokens:
            raise ValueError(f"axis {axis} has {x.shape[axis]} tokens, layout has {self.num_tokens}")
        index = [slice(None)] * x.ndim
        index[axis] = slice(0, self.num_prefix_tokens)
        prefix = x[tuple(index)]
        index[axis] = self.patch_slice
        return prefix, x[tuple(index)]

    def join(self, prefix, patches, axis: int = 1):
        """The inverse of `split` for torch tensors: prefix tokens then patch tokens along ``axis``."""
        import torch

        if prefix.shape[axis] != self.num_prefix_tokens or patches.shape[axis] != self.num_patches:
            raise ValueError(f"expected {self.num_prefix_tokens} prefix and {self.num_patches} patch tokens, got "
                             f"{prefix.shape[axis]} and {patches.shape[axis]}")
        return torch.cat([prefix, patches], dim=axis)

    def patches(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """Only the patch tokens of a token axis."""
        return self.split(x, axis)[1]

    def to_grid(self, patch_values: np.ndarray) -> np.ndarray:
        """(..., grid_h * grid_w) patch values -> (..., grid_h, grid_w), row-major like the tokens."""
        if patch_values.shape[-1] != self.num_patches:
            raise ValueError(f"expected {self.num_patches} patch values, got {patch_values.shape[-1]}")
        return patch_values.reshape(*patch_values.shape[:-1], self.grid_h, self.grid_w)

    def patch_centers(self) -> np.ndarray:
        """(grid_h * grid_w, 2) centres of the patches as (y, x) in input pixels, row-major."""
        ys = (np.arange(self.grid_h) + 0.5) * self.patch_h
        xs = (np.arange(self.grid_w) + 0.5) * self.patch_w
        yy, xx = np.meshgrid(ys, xs, indexing="ij")
        return np.stack([yy.ravel(), xx.ravel()], axis=1)

    def patch_at(self, y: float, x: float) -> tuple[int, int]:
        """(row, col) of the patch holding input pixel (y, x); clamped to the grid."""
        row = int(np.clip(y // self.patch_h, 0, self.grid_h - 1))
        col = int(np.clip(x // self.patch_w, 0, self.grid_w - 1))
        return row, col

    def token_index(self, row: int, col: int) -> int:
        """Sequence index of the patch token at (row, col)."""
        if not (0 <= row < self.grid_h and 0 <= col < self.grid_w):
            raise ValueError(f"patch ({row}, {col}) is outside the {self.grid_h}x{self.grid_w} grid")
        return self.num_prefix_tokens + row * self.grid_w + col

    def prefix_names(self) -> tuple[str, ...]:
        """Human names of the prefix tokens, in sequence order."""
        return (("class",) if self.has_class_token else ()) + ("distillation",) * self.num_dist_tokens + tuple(
            f"register {i}" for i in range(self.num_reg_tokens))

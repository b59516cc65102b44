"""The model handle: one ViT, with everything later code reads from the model itself."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn

from vit_inspect.core.images import Preprocess
from vit_inspect.core.linear import onednn_linears
from vit_inspect.core.tokens import TokenLayout

if TYPE_CHECKING:
    from vit_inspect.core.prompts import ClipParts

DEFAULT_MODEL = "deit_tiny_patch16_224"


def default_checkpoint_dir() -> Path:
    """`$VIT_INSPECT_CHECKPOINTS`, else `checkpoints/` beside the package folder (the repository's)."""
    env = os.environ.get("VIT_INSPECT_CHECKPOINTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "checkpoints"  # core/ -> vit_inspect/ -> repo


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when available and nothing is asked for; otherwise the device asked for, checked."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"Unknown device {device!r}; use 'cpu', 'cuda', 'cuda:0' or 'auto'.") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA was asked for but no CUDA GPU is available; use --device cpu.")
    return resolved


@dataclass(frozen=True, eq=False)
class ViTHandle:
    """A loaded ViT in eval mode plus its geometry, labels and preprocessing."""

    name: str  # what the user asked for: timm name, HF id or folder
    family: str  # "timm", "hf", "open_clip" (a CLIP/SigLIP vision tower) or "module" (opened with a ModuleSpec)
    model: nn.Module  # in eval mode, on `device`
    device: torch.device
    weights: str  # where the weights came from, for display ("random" when none)
    patch_size: tuple[int, int]  # (ph, pw) in input pixels
    native_grid: tuple[int, int]  # (grid_h, grid_w) the position embeddings were trained for
    num_prefix_tokens: int  # class + distillation + register tokens
    has_class_token: bool
    num_dist_tokens: int
    num_reg_tokens: int
    no_embed_class: bool  # position embeddings have no slots for prefix tokens (timm's no_embed_class)
    global_pool: str  # readout of the head: "token" (class token) or "avg" (mean of patch tokens)
    depth: int  # number of transformer blocks
    num_heads: int
    embed_dim: int
    labels: tuple[str, ...]  # class names by index (zero-shot labels for OpenCLIP); empty without a head
    preprocess: Preprocess
    blocks: tuple[nn.Module, ...] = field(repr=False)  # the transformer blocks, input to output
    attention_modules: tuple[nn.Module, ...] = field(repr=False)  # one attention module per block
    norm1_modules: tuple[nn.Module, ...] = field(repr=False)  # the first LayerNorm of each block
    patch_projection: nn.Conv2d = field(repr=False)  # the patch-embedding convolution
    _forward: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)  # pixels -> logits (or features)
    _pos_embed: Callable[[tuple[int, int]], torch.Tensor | None] = field(repr=False)  # grid -> (gh*gw, D)
    clip: ClipParts | None = field(default=None, repr=False)  # OpenCLIP: text tower, zero-shot head, readouts

    @property
    def input_size(self) -> tuple[int, int]:
        """The model's default (H, W) input size."""
        return self.preprocess.input_size

    @property
    def has_head(self) -> bool:
        return bool(self.labels)

    def layout(self, input_size: tuple[int, int] | None = None) -> TokenLayout:
        """Token layout for an (H, W) input (default: the model's own size)."""
        height, width = input_size or self.input_size
        ph, pw = self.patch_size
        if height < ph or width < pw:
            raise ValueError(f"input {height}×{width} is smaller than one {ph}×{pw} patch")
        return TokenLayout(
            num_prefix_tokens=self.num_prefix_tokens, has_class_token=self.has_class_token,
            num_dist_tokens=self.num_dist_tokens, num_reg_tokens=self.num_reg_tokens,
            grid_h=height // ph, grid_w=width // pw, patch_h=ph, patch_w=pw)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised pixels -> (B, num_classes) logits, or (B, D) features without a head.

        Without gradients on the CPU, the model's large linear layers compute through oneDNN
        (`core.linear.onednn_linears`: the same float32 product, in 0.72-0.87 of torch's time for the large
        layers of the bench machine)."""
        pixels = pixels.to(self.device)
        if self.device.type == "cpu" and not torch.is_grad_enabled():
            with onednn_linears(self.model):
                return self._forward(pixels)
        return self._forward(pixels)

    def patch_embed_weight(self) -> np.ndarray:
        """(embed_dim, C, ph, pw) weights of the patch-embedding projection (ViT's E, Eq. 1)."""
        return self.patch_projection.weight.detach().float().cpu().numpy()

    def patch_pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(grid_h, grid_w, D) position embeddings of the patch slots, prefix slots removed.

        For a grid other than the native one they are resampled exactly as the model does it in its
        own forward pass. None when the model has no learned absolute position embeddings.
        """
        grid_h, grid_w = grid or self.native_grid
        with torch.no_grad():
            pos = self._pos_embed((grid_h, grid_w))
        if pos is None:
            return None
        return pos.detach().float().cpu().numpy().reshape(grid_h, grid_w, -1)

    def top_labels(self, probs: np.ndarray, k: int = 5) -> list[dict]:
        """The k most probable classes as {index, label, prob}."""
        order = np.argsort(-probs)[:k]
        return [{"index": int(i), "label": self.label(int(i)), "prob": float(probs[i])} for i in order]

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

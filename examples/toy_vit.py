"""A small Vision Transformer written by hand, the way people write one to learn: for CIFAR-10.

32×32 input, 4×4 patches (an 8×8 grid), a class token with learned position embeddings, six pre-norm
encoder blocks whose multi-head attention returns ``(output, attention weights)``, and an MLP head.
Nothing here knows about vit_inspect except `SPEC`, which tells `handle_from_module` where to look.

    python examples/train_cifar10.py                      # trains it, saves checkpoints/toy_vit_cifar10.safetensors
    python app.py --model-file examples/toy_vit.py:build --weights checkpoints/toy_vit_cifar10.safetensors
"""
from __future__ import annotations

import torch
from torch import nn

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)  # per-channel mean of the CIFAR-10 training set, 0..1 scale
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product self-attention (Vaswani et al. 2017, Eq. 1) that also returns its weights."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, heads, N, head_dim)
        weights = (q @ k.transpose(-2, -1) * self.head_dim ** -0.5).softmax(dim=-1)  # (B, heads, N, N)
        out = (self.drop(weights) @ v).transpose(1, 2).reshape(batch, tokens, dim)  # (B, N, D)
        return self.proj(out), weights


class Block(nn.Module):
    """Pre-norm encoder block: x + MHA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _weights = self.attn(self.norm1(x))
        x = x + attended
        return x + self.mlp(self.norm2(x))


class ToyViT(nn.Module):
    """Patch embedding (Conv2d, kernel = stride = patch), class token, learned position embeddings,
    `depth` pre-norm blocks, final LayerNorm and an MLP head on the class token."""

    def __init__(self, img_size: int = 32, patch_size: int = 4, embed_dim: int = 128, depth: int = 6,
                 num_heads: int = 4, mlp_ratio: float = 2.0, num_classes: int = 10, dropout: float = 0.0):
        super().__init__()
        grid = img_size // patch_size
        self.patch_embed = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + grid * grid, embed_dim) * 0.02)  # class slot + patches
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, gh*gw, D), row-major patches
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed  # (B, 1+gh*gw, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])  # (B, num_classes) from the class token


SPEC = dict(
    blocks="blocks",  # the ModuleList of encoder blocks
    attention="attn",  # inside each block: the module that returns (output, weights)
    attention_output="tuple",
    norm1="norm1",  # inside each block: the LayerNorm before attention (Grad-CAM hooks here)
    patch_embed="patch_embed",
    pos_embed="pos_embed",
    pos_embed_prefix_slots=1,  # pos_embed has a slot for the class token
    num_heads=4,
    class_token=True,
    readout="token",
    input_size=(32, 32),
    mean=CIFAR10_MEAN,
    std=CIFAR10_STD,
    interpolation="bilinear",
    labels=CIFAR10_CLASSES,
)


def build() -> tuple[ToyViT, dict]:
    """The toy ViT with random weights, and the spec that tells vit_inspect how to read it."""
    return ToyViT(num_heads=SPEC["num_heads"], num_classes=len(CIFAR10_CLASSES)), SPEC

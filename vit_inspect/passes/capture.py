"""Attention capture: every layer's attention probabilities from one ordinary forward pass.

timm computes attention with fused `scaled_dot_product_attention` by default, which never
materialises the probabilities, so hooks on `attn_drop` silently see nothing. Inside
`capture_attention` each block's `fused_attn` flag is off (timm, and OpenCLIP towers, whose attention
`core.open_clip_models.SelfAttention` writes out as timm's; Hugging Face models: the eager attention
implementation is on; hand-written models: the module their `ModuleSpec` names already gives the
probabilities, as its output or as the second item of `(output, weights)`) and hooks record them;
on leaving - normally or through an exception - every hook is removed and every flag restored. Each
family's switch is its adapter's (`core.families`, `FamilyAdapter.probabilities`).

A pass without gradients that only reduces the maps (`passes.pipeline` on the CPU, for models whose maps are
not kept) asks for them a block of query rows at a time instead (``rows``, `blocked_attention`): timm's
`Attention` then computes softmax(s·q_b·Kᵀ) and its rows of P·V per block, so a layer's probabilities are
never whole in memory and each block is reduced while it is in the cache (DINOv2-L/14 at 518: 16 x 1,374²
float32 probabilities, 121 MB a layer, read once in 8 MiB blocks instead of several times whole).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Protocol, Sequence

import torch
from timm.layers.attention import Attention as TimmAttention
from torch import nn

from vit_inspect.core.errors import CaptureError
from vit_inspect.core.families import adapter_of
from vit_inspect.core.handle import ViTHandle


ROW_BLOCK_BYTES = 8 * 2 ** 20  # float32 probabilities of one block of query rows, at most (about a core's cache share)


class RowSink(Protocol):
    """Takes one layer's probabilities a block of query rows at a time (`capture_attention`'s ``rows``)."""

    def on_rows(self, layer: int, start: int, block: torch.Tensor) -> None:
        """(heads, b, N) probabilities of query rows start .. start + b - 1 of image 0."""

    def on_layer_done(self, layer: int) -> None:
        """Every row of ``layer`` was given."""


def rows_per_block(heads: int, num_tokens: int, budget: int | None = None) -> int:
    """Query rows whose (heads, rows, N) float32 probabilities fit ``budget`` bytes (default `ROW_BLOCK_BYTES`;
    at least 1 row)."""
    return max(1, (budget or ROW_BLOCK_BYTES) // (4 * heads * num_tokens))


def blocked_attention(attn: TimmAttention, layer: int, sink: RowSink) -> Callable:
    """A forward for one timm `Attention` that computes its attention a block of query rows at a time and
    hands each block's probabilities to ``sink``: per block, P = softmax(s·q_b·Kᵀ) and its rows of the output
    P·V, the same operations as timm's unfused path (q scaled first, then the product, then the softmax), so
    one layer's probabilities are never whole in memory and each block is reduced while it is in the cache.
    Used for one image, without gradients, dropout or a mask; any other call runs timm's own forward (the
    unfused path, whose probabilities the `attn_drop` hook records whole)."""
    whole = type(attn).forward

    def forward(x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal or attn.training or torch.is_grad_enabled() or x.shape[0] != 1:
            return whole(attn, x, attn_mask, is_causal)
        batch, num_tokens, _ = x.shape
        gate = attn.gate(x).sigmoid() if attn.gate is not None else None
        qkv = attn.qkv(x).reshape(batch, num_tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * attn.scale
        keys = k.transpose(-2, -1)
        # (1, N, heads, d): each block's rows of P·V are copied in token order, so the heads join by a view
        # (a product written through ``out=`` into a (1, heads, N, d) slice, then the transposed copy of the
        # whole, took 3-4 ms a layer more for DINOv2-L/14 at 518 on 2 CPU cores)
        out = v.new_empty(batch, num_tokens, attn.num_heads, attn.head_dim)
        step = rows_per_block(attn.num_heads, num_tokens)
        for start in range(0, num_tokens, step):
            block = (q[:, :, start:start + step] @ keys).softmax(dim=-1)  # (1, heads, b, N)
            sink.on_rows(layer, start, block[0])
            out[:, start:start + step].copy_((block @ v).transpose(1, 2))
        sink.on_layer_done(layer)
        x = out.view(batch, num_tokens, attn.attn_dim)
        x = attn.norm(x)
        if gate is not None:
            x = x * gate
        return attn.proj_drop(attn.proj(x))
    return forward


class AttentionRecorder:
    """What the hooks saw during the forward passes inside one `capture_attention` block.

    With gradients enabled the recorded tensors stay in the autograd graph, so one backward pass
    (`backward(target)`) yields d(target)/d(attention) and d(target)/d(activation) for every recorded
    layer. It uses `torch.autograd.grad` on those tensors only: no parameter `.grad` is allocated.
    """

    def __init__(self, depth: int, activation_layers: Sequence[int], keep_attention: bool = True,
                 on_attention: Callable[[int, torch.Tensor], None] | None = None):
        self.depth = depth
        self.activation_layers = tuple(activation_layers)
        self.keep_attention = keep_attention  # False: maps are handed to on_attention and not kept
        self.on_attention = on_attention  # called with (layer, (B, heads, N, N) probabilities) as they appear
        self._attention: list[torch.Tensor | None] = [None] * depth
        self._activations: dict[int, torch.Tensor] = {}
        self._residual: dict[int, torch.Tensor] = {}
        self._attention_grads: list[torch.Tensor] | None = None
        self._activation_grads: dict[int, torch.Tensor] = {}

    def _attention_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            probs = output[1] if isinstance(output, tuple) else output  # HF returns (out, weights)
            if isinstance(probs, torch.Tensor):
                if self.on_attention is not None:
                    self.on_attention(layer, probs)
                if self.keep_attention:
                    self._attention[layer] = probs
        return hook

    def _activation_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            self._activations[layer] = output
        return hook

    def _residual_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self._residual[layer] = output[0] if isinstance(output, tuple) else output
        return hook

    def clear(self) -> None:
        """Forget what was recorded, before the next forward pass in the same block."""
        self._attention = [None] * self.depth
        self._activations = {}
        self._residual = {}
        self._attention_grads = None
        self._activation_grads = {}

    def attention_tensors(self) -> list[torch.Tensor]:
        """The per-layer (B, heads, N, N) tensors as recorded (graph-connected when grads are on)."""
        missing = [i for i, a in enumerate(self._attention) if a is None]
        if missing:
            raise CaptureError(
                f"No attention map was recorded for layer(s) {missing} (of layers 0 to {self.depth - 1}); was a "
                "forward pass run inside capture_attention, and does this model compute attention in the standard "
                "module?")
        return list(self._attention)  # type: ignore[arg-type]

    @property
    def attention(self) -> torch.Tensor:
        """(B, depth, heads, N, N) attention probabilities, rows summing to 1, detached."""
        return torch.stack([a.detach() for a in self.attention_tensors()], dim=1)

    def backward(self, target: torch.Tensor) -> None:
        """One backward pass from the scalar `target` to every recorded attention map and activation."""
        attention = self.attention_tensors()
        layers = sorted(self._activations)
        inputs = attention + [self._activations[i] for i in layers]
        if not target.requires_grad:
            raise CaptureError("The forward pass ran without gradients; run it under torch.enable_grad().")
        grads = torch.autograd.grad(target, inputs, allow_unused=True)
        self._attention_grads = [torch.zeros_like(a) if g is None else g for a, g in zip(attention, grads)]
        self._activation_grads = {i: g if g is not None else torch.zeros_like(self._activations[i])
                                  for i, g in zip(layers, grads[len(attention):])}

    def residual(self, layer: int) -> torch.Tensor:
        """(B, N, D) residual stream after block `layer` (recorded with `residual=True`), detached."""
        if layer not in self._residual:
            raise CaptureError(f"No residual stream recorded after block {layer}; use capture_attention(residual=True).")
        return self._residual[layer].detach()

    def attention_grad(self) -> torch.Tensor:
        """(B, depth, heads, N, N) gradients of the backward target w.r.t. the attention probabilities."""
        return torch.stack(self.attention_grad_tensors(), dim=1)

    def attention_grad_tensors(self) -> list[torch.Tensor]:
        """Per-layer (B, heads, N, N) gradients w.r.t. the attention probabilities (no stacked copy)."""
        if self._attention_grads is None:
            raise CaptureError("No attention gradients yet: call backward(target) after the forward pass.")
        return self._attention_grads

    def activation(self, layer: int) -> torch.Tensor:
        """(B, N, D) output of block `layer`'s first LayerNorm."""
        if layer not in self._activations:
            raise CaptureError(f"No activation recorded for layer {layer}; recorded: {sorted(self._activations)}.")
        return self._activations[layer].detach()

    def activation_grad(self, layer: int) -> torch.Tensor:
        """(B, N, D) gradient of the backward target w.r.t. block `layer`'s first-LayerNorm output."""
        if layer not in self._activation_grads:
            raise CaptureError(f"No gradient for the activation of layer {layer}; call backward(target) first.")
        return self._activation_grads[layer]


@contextmanager
def capture_attention(handle: ViTHandle, activation_layers: Sequence[int] = (), residual: bool = False,
                      keep_attention: bool = True,
                      on_attention: Callable[[int, torch.Tensor], None] | None = None,
                      rows: RowSink | None = None) -> Iterator[AttentionRecorder]:
    """Record attention probabilities of every block (and the first-LayerNorm output of
    `activation_layers`, and with `residual` every block's output) for forward passes run inside the block.
    With ``on_attention`` each layer's probabilities are handed to it as they appear; ``keep_attention=False``
    then lets them go (a pass without gradients never holds every layer's maps at once). With ``rows``, each
    timm `Attention` (that class itself, not a subclass) computes its attention a block of query rows at a
    time (`blocked_attention`) in a forward without gradients, and hands the blocks to ``rows`` instead of
    the whole maps to ``on_attention``.

    >>> with capture_attention(handle) as rec:
    ...     logits = handle.forward(x)
    >>> rec.attention.shape  # (B, depth, heads, N, N)
    """
    layers = [range(handle.depth)[i] for i in activation_layers]  # negative indices allowed, range checked
    recorder = AttentionRecorder(handle.depth, layers, keep_attention, on_attention)
    blocked = None if rows is None else (  # timm's Attention itself, not a subclass
        lambda attn, i: blocked_attention(attn, i, rows) if type(attn) is TimmAttention else None)
    hooks: list[torch.utils.hooks.RemovableHandle] = []
    with adapter_of(handle).probabilities(handle, recorder._attention_hook, blocked):
        try:
            for i in layers:
                hooks.append(handle.norm1_modules[i].register_forward_hook(recorder._activation_hook(i)))
            for i in range(handle.depth) if residual else ():
                hooks.append(handle.blocks[i].register_forward_hook(recorder._residual_hook(i)))
            yield recorder
        finally:
            for hook in hooks:
                hook.remove()

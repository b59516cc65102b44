"""Attention capture: every layer's attention probabilities from one ordinary forward pass.

timm computes attention with fused `scaled_dot_product_attention` by default, which never
materialises the probabilities, so hooks on `attn_drop` silently see nothing. Inside
`capture_attention` each block's `fused_attn` flag is off (timm, and OpenCLIP towers, whose attention
`core.open_clip_models.SelfAttention` writes out as timm's; Hugging Face models: the eager attention
implementation is on; hand-written models: the module their `ModuleSpec` names already gives the
probabilities, as its output or as the second item of `(output, weights)`) and hooks record them;
on leaving - normally or through an exception - every hook is removed and every flag restored.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from vit_inspect.core.errors import CaptureError
from vit_inspect.core.handle import ViTHandle


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
                f"No attention map was recorded for layer(s) {missing} of {self.depth}; was a forward pass run "
                "inside capture_attention, and does this model compute attention in the standard module?")
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
                      on_attention: Callable[[int, torch.Tensor], None] | None = None) -> Iterator[AttentionRecorder]:
    """Record attention probabilities of every block (and the first-LayerNorm output of
    `activation_layers`, and with `residual` every block's output) for forward passes run inside the block.
    With ``on_attention`` each layer's probabilities are handed to it as they appear; ``keep_attention=False``
    then lets them go (a pass without gradients never holds every layer's maps at once).

    >>> with capture_attention(handle) as rec:
    ...     logits = handle.forward(x)
    >>> rec.attention.shape  # (B, depth, heads, N, N)
    """
    layers = [range(handle.depth)[i] for i in activation_layers]  # negative indices allowed, range checked
    recorder = AttentionRecorder(handle.depth, layers, keep_attention, on_attention)
    hooks: list[torch.utils.hooks.RemovableHandle] = []
    saved_fused: list[tuple[nn.Module, bool]] = []
    saved_impl: str | None = None
    try:
        if handle.family in ("timm", "open_clip"):  # timm's Attention, or OpenCLIP's written out as it
            for i, attn in enumerate(handle.attention_modules):
                saved_fused.append((attn, attn.fused_attn))
                attn.fused_attn = False
                hooks.append(attn.attn_drop.register_forward_hook(recorder._attention_hook(i)))
        else:  # Hugging Face, or a hand-written model whose spec names a module that gives the probabilities
            if handle.family == "hf":
                saved_impl = handle.model.config._attn_implementation
                if saved_impl != "eager":
                    handle.model.set_attn_implementation("eager")
            for i, attn in enumerate(handle.attention_modules):
                hooks.append(attn.register_forward_hook(recorder._attention_hook(i)))
        for i in layers:
            hooks.append(handle.norm1_modules[i].register_forward_hook(recorder._activation_hook(i)))
        for i in range(handle.depth) if residual else ():
            hooks.append(handle.blocks[i].register_forward_hook(recorder._residual_hook(i)))
        yield recorder
    finally:
        for hook in hooks:
            hook.remove()
        for attn, fused in saved_fused:
            attn.fused_attn = fused
        if saved_impl is not None and saved_impl != handle.model.config._attn_implementation:
            handle.model.set_attn_implementation(saved_impl)

"""AttnLRP's modified backward and LeGrad's layer scores, beside `capture_attention`, from the same forward.

`relevance_rules(handle)` is a context manager. Inside it, forward hooks wrap the outputs of the patch
convolution, the Linear layers, the LayerNorms, the GELUs and the attention probabilities in a switch
(a custom autograd function). An ordinary backward passes straight through every switch, so capture's
gradients (Grad-CAM, Chefer) and LeGrad are unchanged; inside `recorder.lrp_mode()` the switches apply
the LRP rules instead, so one more backward from the target logit to the pixels yields AttnLRP relevance
as gradient × input (the lxt "efficient" formulation). On exit every hook is removed, also after an
exception.

AttnLRP (Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers",
ICML 2024), rules as gradient modifications, relevance R = x · ∂*y/∂x:
- LayerNorm: identity rule on the normalisation (Sec. 3.3.2): the standard deviation is a constant in
  the backward, ∂*/∂x = (g⊙w − mean(g⊙w)) / σ; the mean subtraction and the affine part stay linear.
- GELU: identity rule (Eq. 9), ∂*/∂x = g · GELU(x) / x.
- Attention: the CP-LRP variant inside attention (the softmax output is a constant in the backward, so
  relevance flows only through the values), as lxt's torchvision-ViT example does; the matmul A·V is then
  linear in V and needs no rule.
- Linear layers: zennit's generalised Gamma rule (Montavon et al. 2019; Andéol et al. 2021), γ = 0.25 on
  the patch convolution, γ = 0.1 on the MLP and head Linears, γ = 0 (LRP-0, i.e. the plain gradient) on
  the attention's own projections. The last choice reproduces the reference: in lxt's torchvision run,
  `nn.MultiheadAttention` applies its value and output projections functionally, so zennit's module hooks
  never fire there. Biases, the class token and the position embeddings absorb relevance.
- Residual additions and the mean/token readout: plain gradient (= the z-rule for a sum).
- A CLIP-style zero-shot head: ‖f‖ held constant in f / ‖f‖ (`unit_norm_rule`), then the product with the fixed
  unit text embeddings is linear (plain gradient), so relevance sums to the cosine similarity (times s).

LeGrad (Bousselham et al., "LeGrad: An Explainability Method for Vision Transformers via Feature
Formation Sensitivity", ICCV 2025): for each of the last layers l, the layer's class score
s^l = head(final_norm(z^l)) from the block output z^l read as the model reads its last layer; its
gradient with respect to that layer's attention probabilities (one short backward per layer through
that block only) is kept, ReLU'd and averaged by `analysis.legrad.legrad_map`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from vit_inspect.core.errors import UnsupportedModelError
from vit_inspect.core.families import adapter_of
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.prompts import UnitNormalize

Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (input, output, grad_out) -> grad_in


@dataclass(frozen=True)
class LRPRules:
    """The LRP rule parameters (see the module docstring)."""

    conv_gamma: float = 0.25  # Gamma rule on the patch-embedding convolution
    linear_gamma: float = 0.1  # Gamma rule on the MLP and classifier Linear layers
    attention_gamma: float = 0.0  # Gamma rule on the attention's projections; 0 = LRP-0 = plain gradient
    stabilizer: float = 1e-6  # zennit's denominator stabiliser for the Gamma rule


def stabilize(x: torch.Tensor, epsilon: float) -> torch.Tensor:
    """x + ε·sign(x), with sign(0) = +1 (zennit's `stabilize`); one select instead of sign, compare and cast."""
    return torch.where(x < 0, x - epsilon, x + epsilon)


class _State:
    lrp = False  # True while the LRP backward runs


class _Switch(torch.autograd.Function):
    """Forward: y unchanged. Backward: the ordinary gradient to y, or in LRP mode `rule` straight to x."""

    @staticmethod
    def forward(ctx, state: _State, rule: Rule | None, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.state, ctx.rule = state, rule
        ctx.save_for_backward(x, y)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.state.lrp:
            return None, None, None, grad
        if ctx.rule is None:  # CP-LRP: a constant in the LRP backward
            return None, None, None, None
        x, y = ctx.saved_tensors
        return None, None, ctx.rule(x.detach(), y.detach(), grad), None


def layer_norm_rule(module: nn.LayerNorm) -> Rule:
    """Identity rule on the normalisation: σ held constant (AttnLRP Sec. 3.3.2)."""
    def rule(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        std = (x.var(-1, unbiased=False, keepdim=True) + module.eps).sqrt()
        scaled = grad * module.weight if module.weight is not None else grad
        return (scaled - scaled.mean(-1, keepdim=True)) / std
    return rule


def identity_rule(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Identity rule for an element-wise non-linearity: relevance passes unchanged (AttnLRP Eq. 9)."""
    return grad * y / stabilize(x, 1e-10)


def gamma_rule(forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
               weight: torch.Tensor, bias: torch.Tensor | None, gamma: float, stabilizer: float,
               channels_first: bool = False,
               transposed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> Rule:
    """zennit's generalised Gamma rule for a linear map y = forward(x, W, b), in gradient form.

    With R_j = y_j g_j, W± = W + γ·W^±, for outputs y_j > 0:
    R_i = Σ_j [x⁺_i W⁺_ij + x⁻_i W⁻_ij] R_j / (x⁺·W⁺_j + x⁻·W⁻_j + b_j + γ b_j⁺), and symmetrically with
    W⁺/W⁻ swapped for y_j < 0; the gradient returned is R_i / x_i.

    Computed with two products instead of zennit's four (forward bilinear in x and W): with z = f(x, W)
    and a = f(|x|, |W|), x⁺·W^+ + x⁻·W^- = (z + a)/2 and x⁺·W^- + x⁻·W^+ = (z - a)/2, so the denominators
    are z + γ(z ± a)/2 + b + γ b^±; with u, l the y > 0 and y < 0 parts of R / denominator, s = u + l and
    d = u - l, R_i = (1 + γ/2) x_i fᵀ(s; W)_i + (γ/2) |x_i| fᵀ(d; |W|)_i (fᵀ the transposed map, one
    backward each). Only one of u, l is non-zero per output, so s = R / den and d = ±s, den the denominator
    of the output's sign. ``transposed(g, W)``: fᵀ itself (`linear_transposed`), the product autograd's backward
    would take; without it fᵀ is taken by autograd. tests/passes/test_relevance.py checks it against the
    four-product form. ``channels_first``: the output's channels are its axis 1 (a convolution), not its last
    axis (a Linear).
    """
    weight, magnitude = weight.float(), weight.abs().float()  # the rule runs in float32, also under autocast
    bias_pos = None if bias is None else (bias + gamma * bias.clamp(min=0)).float()
    bias_neg = None if bias is None else (bias + gamma * bias.clamp(max=0)).float()

    def rule(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x, y, grad = x.float(), y.float(), grad.float()
        relevance_out = grad * y
        x_abs = x.abs()
        with torch.set_grad_enabled(transposed is None), torch.autocast(x.device.type, enabled=False):
            signed, absolute = ((x, x_abs) if transposed
                                else (x.detach().requires_grad_(), x_abs.detach().requires_grad_()))
            z, a = forward(signed, weight, None), forward(absolute, magnitude, None)
            upper_den, lower_den = z + gamma / 2 * (z + a), z + gamma / 2 * (z - a)
            if bias is not None:
                shape = (-1, *[1] * (z.ndim - 2)) if channels_first else (-1,)
                upper_den, lower_den = upper_den + bias_pos.view(shape), lower_den + bias_neg.view(shape)
            positive = y > 0
            ratio = relevance_out.detach() / stabilize(torch.where(positive, upper_den, lower_den).detach(), stabilizer)
            signed_ratio = torch.where(positive, ratio, -ratio)
            if transposed:
                through_w, through_abs = transposed(ratio, weight), transposed(signed_ratio, magnitude)
            else:
                through_w, through_abs = torch.autograd.grad((z, a), (signed, absolute), (ratio, signed_ratio))
        relevance_in = (1 + gamma / 2) * x * through_w + gamma / 2 * x_abs * through_abs
        return (relevance_in / stabilize(x, 1e-10)).to(dtype)
    return rule


def linear_transposed(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(…, in) the transposed map of ``F.linear(·, weight)`` applied to (…, out) ``grad``: the product its
    backward takes (grad · W over the flattened leading axes)."""
    return grad.reshape(-1, weight.shape[0]).mm(weight).view(*grad.shape[:-1], weight.shape[1])


def _linear_rule(module: nn.Module, gamma: float, stabilizer: float) -> Rule:
    if isinstance(module, nn.Conv2d):
        return gamma_rule(module._conv_forward, module.weight.detach(),
                          None if module.bias is None else module.bias.detach(), gamma, stabilizer, channels_first=True)
    return gamma_rule(F.linear, module.weight.detach(), None if module.bias is None else module.bias.detach(),
                      gamma, stabilizer, transposed=linear_transposed)


class RelevanceRecorder:
    """Block outputs for LeGrad and the switch into the LRP backward, for one `relevance_rules` block."""

    def __init__(self, handle: ViTHandle) -> None:
        self.handle = handle
        self.state = _State()
        self.block_outputs: list[torch.Tensor | None] = [None] * handle.depth
        self.unsupported: str | None = None  # why the LRP rules could not be placed on this model, if so

    @contextmanager
    def lrp_mode(self) -> Iterator[None]:
        """Backward passes run inside use the LRP rules instead of the gradient."""
        self.state.lrp = True
        try:
            yield
        finally:
            self.state.lrp = False

    def attnlrp(self, target: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) AttnLRP relevance of the scalar `target` at the input pixels (gradient × input).
        The graph is kept for the ordinary backward that follows."""
        if self.unsupported:
            raise UnsupportedModelError(self.unsupported)
        with self.lrp_mode():
            grad, = torch.autograd.grad(target, pixels, retain_graph=True)
        return pixels.detach() * grad

    def legrad_gradients(self, attention: list[torch.Tensor], target: int, layers: range,
                         projection: str = "model") -> torch.Tensor:
        """(len(layers), B, heads, N, N) ∂s^l/∂A^l, s^l the class-`target` score read from block l's output.

        ``attention`` holds capture's graph-connected per-layer probabilities; ``projection`` is "model"
        (the model's own readout: class token, or the pooled tokens) or "mean" (mean of all tokens before
        the final norm: torchcam's default). Each gradient is one short backward through block l only.
        """
        project = score_projection(self.handle, projection)
        grads = []
        for layer in layers:
            tokens = self.block_outputs[layer]
            if tokens is None or self.unsupported:
                raise UnsupportedModelError(f"Block {layer} produced no token output for LeGrad.")
            score = project(tokens)[:, target].sum()
            grad, = torch.autograd.grad(score, attention[layer], retain_graph=True)
            grads.append(grad)
        return torch.stack(grads)


def score_projection(handle: ViTHandle, projection: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """(B, N, D) intermediate tokens -> (B, num_classes) class scores, through the model's final norm and head.

    An OpenCLIP tower reads them as LeGrad's package does (`ClipParts.legrad_embedding`: for OpenCLIP's
    VisionTransformer the mean of all tokens through ``ln_post`` and ``proj``, `compute_legrad_clip`; for a
    timm trunk its final norm, pooler and projection), then the zero-shot head, whatever ``projection``."""
    if projection not in ("model", "mean"):
        raise ValueError(f"unknown projection {projection!r}; use 'model' or 'mean'")
    return adapter_of(handle).score_projection(handle, projection)


def unit_norm_rule(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """y = x / ‖x‖ with ‖x‖ held constant in the backward (as a LayerNorm's σ, AttnLRP Sec. 3.3.2): ∂*/∂x = g / ‖x‖.
    Then Σ_i x_i ∂*(y·t)/∂x_i = y·t: a cosine similarity's relevance is conserved through the normalisation."""
    return grad / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _attention_linears(handle: ViTHandle) -> set[nn.Module]:
    return {m for attn in handle.attention_modules for m in attn.modules() if isinstance(m, nn.Linear)}


def _is_gelu(module: nn.Module) -> bool:
    return isinstance(module, nn.GELU) or "GELU" in type(module).__name__


@contextmanager
def relevance_rules(handle: ViTHandle, rules: LRPRules = LRPRules()) -> Iterator[RelevanceRecorder]:
    """Hook the LRP switches and the block outputs for forward passes run inside the block (enter it
    after `capture_attention`, so capture records the attention before its switch)."""
    recorder = RelevanceRecorder(handle)
    state = recorder.state
    hooks: list[torch.utils.hooks.RemovableHandle] = []

    def switch(rule: Rule | None):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            return _Switch.apply(state, rule, args[0], output)
        return hook

    def constant_in_lrp(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return _Switch.apply(state, None, output, output)

    def block_output(layer: int):
        def hook(module: nn.Module, args: tuple, output) -> None:
            recorder.block_outputs[layer] = output[0] if isinstance(output, tuple) else output
        return hook

    adapter = adapter_of(handle)
    recorder.unsupported = adapter.lrp_unsupported(handle)
    if recorder.unsupported:  # no hooks, no LeGrad/AttnLRP maps
        yield recorder
        return
    try:
        attention_linears = _attention_linears(handle)
        for module in adapter.lrp_modules(handle):
            if module is handle.patch_projection:
                hooks.append(module.register_forward_hook(switch(_linear_rule(module, rules.conv_gamma,
                                                                              rules.stabilizer))))
            elif isinstance(module, nn.Linear):
                gamma = rules.attention_gamma if module in attention_linears else rules.linear_gamma
                if gamma:
                    hooks.append(module.register_forward_hook(switch(_linear_rule(module, gamma, rules.stabilizer))))
            elif isinstance(module, nn.LayerNorm):
                hooks.append(module.register_forward_hook(switch(layer_norm_rule(module))))
            elif _is_gelu(module):
                hooks.append(module.register_forward_hook(switch(identity_rule)))
            elif isinstance(module, UnitNormalize):
                hooks.append(module.register_forward_hook(switch(unit_norm_rule)))
        for attn in handle.attention_modules:
            try:
                constants = adapter.lrp_constants(handle, attn)  # held constant: the probabilities are (CP-LRP)
            except UnsupportedModelError as exc:
                recorder.unsupported = str(exc)
                constants = ()
            for module in constants:
                hooks.append(module.register_forward_hook(constant_in_lrp))
        for layer, block in enumerate(handle.blocks):
            hooks.append(block.register_forward_hook(block_output(layer)))
        yield recorder
    finally:
        for hook in hooks:
            hook.remove()

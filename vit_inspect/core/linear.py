"""Linear layers through oneDNN in forwards without gradients on the CPU.

A float32 `nn.Linear` on an x86 CPU runs `torch.addmm`, which calls the BLAS PyTorch was built with (MKL in
the official wheels). oneDNN, which PyTorch ships beside it, computes the same y = x·Wᵀ + b (x: (..., in),
W: (out, in), b: (out,) or none) in IEEE float32 with its own kernels; only the order of the float32 sums
differs, so the two agree to float32 rounding (tested against a float64 product). Measured on the benches'
AMD EPYC with two threads (`bench/bench_linear.py`, one block's four layers, oneDNN's time ÷ torch's, two
runs): DINOv2-L/14 at 518 px (1,374 tokens) 0.72-0.79, ViT-B/16 at 224 0.79-0.87 (a batch of 8 images 0.79),
a batch of 32 DeiT-Ti images 0.84, ViT-L/16 at 384 1.01-1.02, and one DeiT-Ti image 1.17-1.23, where each
call's fixed cost outweighs the product. So a call goes through oneDNN only from `ONEDNN_MIN_MACS`
multiply-adds on (tokens × in × out: ViT-B/16's smallest layer has 116 million, one DeiT-Ti image's largest
29 million). The linear layers are most of a large model's forward (DINOv2-L/14 at 518 px: about 5 of 7 s),
so its pass gains most of that.

`onednn_linears` routes a model's `nn.Linear` layers (that class itself, not subclasses) through oneDNN's
inner product (`torch.ops.mkldnn._linear_pointwise`, the op PyTorch's own compiler uses for linear layers on
the CPU) while inside the block, for calls that meet every condition of `_onednn_applies`: gradients off,
no CPU autocast, float32 tensors in PyTorch's ordinary layout on the CPU, a contiguous weight, at least
`ONEDNN_MIN_MACS` multiply-adds, and oneDNN available, enabled and left at its IEEE float32 precision (a user
who set `torch.backends.mkldnn` to bfloat16 or TF32 arithmetic, or turned it off, keeps the BLAS path). Every
other call runs the layer's own forward, so a pass with gradients and every forward outside the block are
untouched. `handle.ViTHandle.forward` enters the block for every forward without gradients on the CPU: the
pass of a model without a head, the faithfulness metrics' batches, head ablation, folder jobs.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

ENABLED = True  # module switch, for benches and tests comparing both paths
ONEDNN_MIN_MACS = 2 ** 26  # multiply-adds of one call (67 million) from which oneDNN is used (see above)


def _op_available() -> bool:
    try:
        return hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # PyTorch before 2.4
        return torch.is_autocast_cpu_enabled()


def _ieee_float32() -> bool:
    """oneDNN left at IEEE float32 arithmetic (PyTorch's default: precision "none" or "ieee")."""
    for settings in (getattr(torch.backends.mkldnn, "matmul", None), torch.backends.mkldnn):
        precision = getattr(settings, "fp32_precision", None)
        if precision is not None and precision not in ("none", "ieee"):
            return False
    return True


def available() -> bool:
    """Whether this PyTorch can route linear layers through oneDNN at all (built with it, enabled, IEEE
    float32, the op present)."""
    return bool(ENABLED and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
                and _ieee_float32() and _op_available())


def _onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """One call's conditions: no gradients, no CPU autocast, float32 strided CPU tensors, a contiguous weight
    (oneDNN would reorder any other on every call), and at least `ONEDNN_MIN_MACS` multiply-adds."""
    if torch.is_grad_enabled() or _cpu_autocast():
        return False
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (x.ndim >= 2 and weight.is_contiguous() and x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS
            and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided
                    for t in tensors))


def _forward(layer: nn.Linear, original: Callable) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if not _onednn_applies(x, layer.weight, layer.bias):
            return original(x)
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
    return forward


@contextmanager
def onednn_linears(model: nn.Module) -> Iterator[int]:
    """Inside the block, every `nn.Linear` of ``model`` computes through oneDNN where `_onednn_applies`
    holds; the number of layers rerouted is given to ``as`` (0 when `available` is false: nothing changes).
    Each layer's `forward` is an instance attribute while inside, deleted on leaving, normally or through an
    exception; the layers' hooks run as before."""
    layers = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in vars(m)] if available() else []
    try:
        for layer in layers:
            layer.forward = _forward(layer, nn.Linear.forward.__get__(layer))
        yield len(layers)
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)

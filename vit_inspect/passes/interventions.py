"""Head ablation as a context manager beside `capture_attention`: hooks on, restored in `finally`.

A head's output is its slice of the attention output before the output projection,
``o_h = A_h V_h`` (B, N, head_dim); the block adds ``W_O [o_1 .. o_H] + b`` to the residual stream
(Vaswani et al. 2017, Eq. "MultiHead"). Ablating head h of layer l replaces o_h by

- ``zero``:    0 (the head contributes nothing but the projection bias is kept);
- ``mean``:    its mean over a reference set of images, per token position (`mean_head_outputs`);
- ``uniform``: the output of uniform attention, A_h = 1/N, i.e. the mean of the head's values over the
  N keys (the recorded attention of the head then shows 1/N too).

The replacement happens in a forward pre-hook on the module that receives the concatenated heads
(timm: `attn.proj`, or `attn.norm` when the model normalises before the projection; Hugging Face:
`o_proj`; each family's adapter in `core.families` names it), so it works with timm's fused attention, with HF's eager attention and inside
`capture_attention`. Every hook and switch is removed/restored on leaving, even after an exception.
Masks may differ per batch row: row b ablates the heads set in ``mask[b]`` (one forward over L·H
rows ranks every head, see `vit_inspect.heads.head_importance`).
"""
from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from PIL import Image
from torch import nn

from vit_inspect.core.errors import ImageError, InterventionError
from vit_inspect.core.families import adapter_of
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits, load_image

ABLATION_MODES = ("zero", "mean", "uniform")
HeadSet = Iterable[tuple[int, int]] | np.ndarray | torch.Tensor  # (layer, head) pairs, or a bool mask


@dataclass(frozen=True, eq=False)
class HeadMeans:
    """Mean output of every head per token position over a reference set (for ``mode="mean"``)."""

    values: np.ndarray  # (depth, N, heads * head_dim) float32, the pre-projection attention output
    num_images: int  # images averaged
    input_size: tuple[int, int]  # (H, W) of the inputs; the means fit only this token count N


def head_mask(heads: HeadSet, depth: int, num_heads: int) -> torch.Tensor:
    """A bool mask (rows, depth, heads) of the heads to ablate; rows is 1 for a set of (layer, head)
    pairs or a (depth, heads) mask (every batch row alike), B for a (B, depth, heads) mask.
    Negative layer and head indices count from the end; anything out of range is refused."""
    if isinstance(heads, (np.ndarray, torch.Tensor)):
        mask = torch.as_tensor(np.asarray(heads) if isinstance(heads, np.ndarray) else heads).bool()
        if mask.ndim == 2:
            mask = mask[None]
        if mask.ndim != 3 or tuple(mask.shape[1:]) != (depth, num_heads):
            raise InterventionError(f"A head mask must be (depth, heads) = ({depth}, {num_heads}) or "
                                    f"(batch, {depth}, {num_heads}); got shape {tuple(mask.shape)}.")
        return mask.cpu()
    mask = torch.zeros(1, depth, num_heads, dtype=torch.bool)
    for pair in heads:
        try:
            layer, head = (int(v) for v in pair)
        except (TypeError, ValueError):
            raise InterventionError(f"A head is a (layer, head) pair of integers; got {pair!r}.") from None
        if not (-depth <= layer < depth and -num_heads <= head < num_heads):
            raise InterventionError(f"Head ({layer}, {head}) does not exist: the model has {depth} layers "
                                    f"(0..{depth - 1}) of {num_heads} heads (0..{num_heads - 1}).")
        mask[0, layer, head] = True
    return mask


def head_output_module(handle: ViTHandle, layer: int) -> nn.Module:
    """The module whose input is layer `layer`'s concatenated head outputs (B, N, heads * head_dim)."""
    module = adapter_of(handle).head_output_module(handle, handle.attention_modules[layer])  # refuses families
    if not isinstance(module, nn.Module):
        raise InterventionError(f"Cannot find the output projection of layer {layer}'s attention in {handle.name!r}.")
    return module


def _rows(mask: torch.Tensor, batch: int) -> torch.Tensor:
    """(rows, heads) mask -> one row per batch row."""
    if mask.shape[0] not in (1, batch):
        raise InterventionError(f"The head mask has {mask.shape[0]} rows but the batch has {batch} images.")
    return mask


@contextmanager
def ablate_heads(handle: ViTHandle, heads: HeadSet, mode: str = "zero",
                 mean: HeadMeans | None = None) -> Iterator[torch.Tensor]:
    """Ablate `heads` (see `head_mask`) in every forward pass run inside the block; yields the mask.

    >>> with ablate_heads(handle, [(3, 1), (5, 0)], "zero"):
    ...     logits = handle.forward(x)

    ``mode="mean"`` needs `mean` from `mean_head_outputs` for the same input size. Combine with
    `capture_attention` in either order; the ablation's hooks run before capture's.
    """
    if mode not in ABLATION_MODES:
        raise InterventionError(f"Unknown ablation mode {mode!r}; use one of {', '.join(ABLATION_MODES)}.")
    mask = head_mask(heads, handle.depth, handle.num_heads).to(handle.device)  # (rows, depth, heads)
    head_output_module(handle, 0)  # refuses models whose head outputs it cannot find, before any hook
    if mode == "mean":
        if mean is None:
            raise InterventionError("Mean ablation needs the heads' mean outputs over a reference set "
                                    "(mean_head_outputs).")
        if mean.values.shape[0] != handle.depth or mean.values.shape[2] % handle.num_heads:
            raise InterventionError(f"The mean outputs have shape {mean.values.shape}, which does not fit this "
                                    f"model ({handle.depth} layers of {handle.num_heads} heads).")
        means = torch.as_tensor(mean.values, device=handle.device)  # (depth, N, heads * head_dim)
    layers = [i for i in range(handle.depth) if bool(mask[:, i].any())]
    adapter = adapter_of(handle)
    hooks: list[torch.utils.hooks.RemovableHandle] = []
    values: dict[int, torch.Tensor] = {}  # uniform mode where the mean values replace the heads: this pass's value projections

    def replace_heads(layer: int):
        def hook(module: nn.Module, args: tuple):
            x = args[0]  # (B, N, heads * head_dim)
            batch, tokens, width = x.shape
            split = x.reshape(batch, tokens, handle.num_heads, width // handle.num_heads)  # (B, N, heads, head_dim)
            rows = _rows(mask[:, layer], batch)[:, None, :, None]  # (B|1, 1, heads, 1)
            if mode == "zero":
                replacement = torch.zeros((), dtype=x.dtype, device=x.device)
            elif mode == "mean":
                if means.shape[1] != tokens:
                    raise InterventionError(
                        f"The mean outputs were taken at {means.shape[1]} tokens (input {mean.input_size[0]}x"
                        f"{mean.input_size[1]}); this input has {tokens}. Recompute them at this input size.")
                replacement = means[layer].to(x.dtype).view(1, tokens, handle.num_heads, -1)
            else:  # uniform attention: every query's output is the mean of the values
                if layer not in values:
                    raise InterventionError(f"Layer {layer}'s value projection was not seen in this forward pass; "
                                            "uniform ablation cannot be applied to this model.")
                v = values.pop(layer).reshape(batch, tokens, handle.num_heads, -1)
                replacement = v.mean(dim=1, keepdim=True).to(x.dtype)  # (B, 1, heads, head_dim)
            return (torch.where(rows, replacement, split).reshape(batch, tokens, width),) + tuple(args[1:])
        return hook

    def uniform_probs(layer: int):
        def hook(module: nn.Module, args: tuple, output: object):
            probs = output[1] if isinstance(output, tuple) else output  # (B, heads, N, N)
            if not isinstance(probs, torch.Tensor):
                return None
            rows = _rows(mask[:, layer], probs.shape[0])[:, :, None, None]  # (B|1, heads, 1, 1)
            uniform = torch.full((), 1.0 / probs.shape[-1], dtype=probs.dtype, device=probs.device)
            probs = torch.where(rows, uniform, probs)
            return (output[0], probs) + tuple(output[2:]) if isinstance(output, tuple) else probs
        return hook

    def keep_values(layer: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            values[layer] = output
        return hook

    try:
        with ExitStack() as switches:
            for i in layers:
                if mode == "uniform" and not switches.enter_context(
                        adapter.uniform_attention(handle, i, uniform_probs(i), keep_values(i))):
                    continue  # the probabilities themselves are uniform: the heads' outputs follow
                hooks.append(head_output_module(handle, i).register_forward_pre_hook(replace_heads(i)))
            yield mask
    finally:
        for hook in hooks:
            hook.remove()
        values.clear()


def mean_head_outputs(handle: ViTHandle, images: Iterable[str | os.PathLike | Image.Image | torch.Tensor],
                      batch_size: int = 16, input_size: tuple[int, int] | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      limits: ImageLimits = ImageLimits()) -> HeadMeans:
    """Every head's output averaged over `images`, per token position: the reference for mean ablation.

    Images are files, PIL images or already preprocessed (3, H, W) tensors; unreadable files are
    skipped. Only running sums are kept: memory is depth * N * heads * head_dim floats.
    """
    items = list(images)
    size = tuple(input_size or handle.input_size)
    sums: dict[int, torch.Tensor] = {}
    count = 0
    batch: list[torch.Tensor] = []

    def record(layer: int):
        def hook(module: nn.Module, args: tuple) -> None:
            total = args[0].detach().float().sum(dim=0)  # (N, heads * head_dim)
            sums[layer] = total if layer not in sums else sums[layer] + total
        return hook

    def flush() -> None:
        nonlocal count
        hooks = [head_output_module(handle, i).register_forward_pre_hook(record(i)) for i in range(handle.depth)]
        try:
            with torch.no_grad():
                handle.forward(torch.stack(batch))
        finally:
            for hook in hooks:
                hook.remove()
        count += len(batch)
        batch.clear()

    for done, item in enumerate(items, 1):
        if isinstance(item, torch.Tensor):
            batch.append(item)
        else:
            try:
                picture = item if isinstance(item, Image.Image) else load_image(item, limits)
                batch.append(handle.preprocess.apply(picture, size)[0][0])
            except ImageError:
                pass
        if len(batch) == batch_size:
            flush()
        if progress is not None:
            progress(done, len(items))
    if batch:
        flush()
    if count == 0:
        raise InterventionError("None of the reference images could be read; mean ablation needs at least one.")
    values = torch.stack([sums[i] for i in range(handle.depth)]) / count  # (depth, N, heads * head_dim)
    return HeadMeans(values=values.cpu().numpy().astype(np.float32), num_images=count, input_size=size)


def parse_heads(text: str) -> list[tuple[int, int]]:
    """'3:1,5:0' -> [(3, 1), (5, 0)] (layer:head pairs, comma-separated)."""
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            layer, head = (int(v) for v in part.split(":"))
        except ValueError:
            raise InterventionError(f"Heads look like 3:1,5:0 (layer:head pairs); could not read {part[:40]!r}.") from None
        pairs.append((layer, head))
    if not pairs:
        raise InterventionError("No heads given; write them as layer:head pairs, e.g. 3:1,5:0.")
    return pairs


def model_heads(pairs: list[tuple[int, int]], depth: int, num_heads: int) -> list[tuple[int, int]]:
    """(layer, head) pairs as the model's own indices: negative ones counted from the end, sorted, each
    once; a head the model lacks is refused (`head_mask`)."""
    mask = head_mask(pairs, depth, num_heads)[0]  # (depth, heads)
    return [(int(layer), int(head)) for layer, head in np.argwhere(mask.cpu().numpy())]


__all__ = ["ABLATION_MODES", "HeadMeans", "ablate_heads", "head_mask", "head_output_module",
                          "mean_head_outputs", "model_heads", "parse_heads"]

"""What heads do for the prediction: an image analysed with heads ablated, and per-image head importance.

Both run the model inside `interventions.ablate_heads`: the ablated analysis is one `analyze_image`
pass (one forward, one backward) of the ablated model; head importance ablates each head alone,
one ablation mask per batch row, L·H rows (+ one unablated row) in chunks of `batch_size`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from PIL import Image

from vit_inspect.core.errors import Cancelled, VitInspectError
from vit_inspect.core.geometry import warn_if_blurred
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits, load_image
from vit_inspect.passes.interventions import HeadMeans, HeadSet, ablate_heads
from vit_inspect.passes.options import STUDY_OPTIONS, PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.result import ImageAnalysis

ImageInput = Image.Image | str | os.PathLike | bytes


def analyze_ablated(handle: ViTHandle, image: ImageInput, heads: HeadSet, mode: str = "zero",
                    mean: HeadMeans | None = None, target: int | None = None,
                    options: PassOptions = STUDY_OPTIONS, **settings) -> ImageAnalysis:
    """`analyze_image` of the model with `heads` ablated (see `ablate_heads`): its probabilities, maps,
    Grad-CAM, lens and head statistics, from one forward and one backward pass. ``options`` (`PassOptions`,
    ``settings`` replacing its fields as in `analyze_image`): its geometry makes the same input as the
    unablated pass it is compared with; ``relevance=False`` leaves out LeGrad and AttnLRP (their extra
    backwards), for callers that do not show them."""
    with ablate_heads(handle, heads, mode, mean):
        return analyze_image(handle, image, target, options.replace(**settings))


@dataclass(frozen=True)
class AblationEffect:
    """The prediction before and after an ablation, for one target class."""

    target: int  # class whose logit and probability are compared
    logit_before: float
    logit_after: float
    prob_before: float
    prob_after: float
    top_before: tuple[tuple[int, float], ...]  # (class, probability), most probable first
    top_after: tuple[tuple[int, float], ...]

    @property
    def delta_logit(self) -> float:
        """after - before, in logits."""
        return self.logit_after - self.logit_before

    @property
    def delta_prob(self) -> float:
        """after - before, as a probability difference."""
        return self.prob_after - self.prob_before

    @property
    def prediction_changed(self) -> bool:
        return self.top_before[0][0] != self.top_after[0][0]


def ablation_effect(original: ImageAnalysis, ablated: ImageAnalysis, target: int | None = None, k: int = 5) -> AblationEffect:
    """Compare two passes over the same image (original and ablated model) for `target`
    (default: the original's target, i.e. its top class)."""
    if original.heads is None or ablated.heads is None or not original.heads.logits.size:
        raise VitInspectError("Comparing an ablation needs the logits of a model with a classification head.")
    chosen = original.target if target is None else int(target)
    if chosen is None:
        chosen = int(np.argmax(original.probs))

    def top(probs: np.ndarray) -> tuple[tuple[int, float], ...]:
        return tuple((int(i), float(probs[i])) for i in np.argsort(-probs, kind="stable")[:k])

    return AblationEffect(
        target=chosen, logit_before=float(original.heads.logits[chosen]), logit_after=float(ablated.heads.logits[chosen]),
        prob_before=float(original.probs[chosen]), prob_after=float(ablated.probs[chosen]),
        top_before=top(original.probs), top_after=top(ablated.probs))


@dataclass(frozen=True)
class HeadImportance:
    """Per-image head importance: the target's drop when each head alone is ablated."""

    target: int  # class index
    mode: str  # ablation mode ("zero", "mean", "uniform")
    logit: float  # the target's logit without ablation
    prob: float  # its probability without ablation
    logit_drop: np.ndarray  # (depth, heads) logit - logit with that head ablated, in logits
    prob_drop: np.ndarray  # (depth, heads) the same for the probability
    top_changed: np.ndarray  # (depth, heads) bool: the top class changes when that head is ablated


def _pixels(handle: ViTHandle, image: ImageInput | torch.Tensor, input_size: tuple[int, int] | None,
            limits: ImageLimits) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        return image if image.ndim == 4 else image[None]
    picture = image if isinstance(image, Image.Image) else load_image(image, limits)
    warn_if_blurred(picture.size, handle.patch_size)
    return handle.preprocess.apply(picture, input_size)[0]


def head_importance(handle: ViTHandle, image: ImageInput | torch.Tensor, target: int | None = None,
                    mode: str = "zero", mean: HeadMeans | None = None, batch_size: int = 16,
                    input_size: tuple[int, int] | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cancelled: Callable[[], bool] | None = None,
                    limits: ImageLimits = ImageLimits()) -> HeadImportance:
    """Drop in the target logit when each head alone is ablated, for one image.

    ``drop(l, h) = y - y_{-(l,h)}``: y is the target logit of the unablated model, y_{-(l,h)} that of
    the model with head h of layer l ablated (`mode`, see `ablate_heads`); positive when the head
    supports the target. The 1 + L·H rows (row 0 unablated) run under `torch.no_grad()` in chunks of
    `batch_size` rows, each row with its own ablation mask. `progress(done_rows, total_rows)` is called
    after each chunk; when `cancelled()` turns true the next chunk is not started and `Cancelled` is raised.
    """
    if not handle.has_head:
        raise VitInspectError("Head importance needs a classification head: this model has none.")
    if batch_size < 1:
        raise VitInspectError(f"batch_size must be at least 1, got {batch_size}.")
    pixels = _pixels(handle, image, input_size, limits).to(handle.device)  # (1, 3, H, W)
    depth, heads = handle.depth, handle.num_heads
    masks = torch.zeros(1 + depth * heads, depth, heads, dtype=torch.bool)  # row 0: nothing ablated
    masks[1:].view(depth * heads, depth * heads)[torch.arange(depth * heads), torch.arange(depth * heads)] = True
    logits: list[torch.Tensor] = []
    for start in range(0, len(masks), batch_size):
        if cancelled is not None and cancelled():
            raise Cancelled(f"Head importance was cancelled after {start} of {len(masks)} rows.")
        chunk = masks[start:start + batch_size]
        with torch.no_grad(), ablate_heads(handle, chunk, mode, mean):
            logits.append(handle.forward(pixels.expand(len(chunk), -1, -1, -1)).float().cpu())  # (rows, C)
        if progress is not None:
            progress(min(start + batch_size, len(masks)), len(masks))
    all_logits = torch.cat(logits)  # (1 + L*H, C)
    probs = all_logits.softmax(-1)
    chosen = int(all_logits[0].argmax()) if target is None else int(target)
    if not 0 <= chosen < all_logits.shape[1]:
        raise VitInspectError(f"Target class {chosen} is out of range: the model has {all_logits.shape[1]} classes.")
    return HeadImportance(
        target=chosen, mode=mode, logit=float(all_logits[0, chosen]), prob=float(probs[0, chosen]),
        logit_drop=(all_logits[0, chosen] - all_logits[1:, chosen]).view(depth, heads).numpy(),
        prob_drop=(probs[0, chosen] - probs[1:, chosen]).view(depth, heads).numpy(),
        top_changed=(all_logits[1:].argmax(-1) != all_logits[0].argmax()).view(depth, heads).numpy())

"""Concepts of a class over many images (CRAFT, Fel et al. 2023, CVPR; `analysis.craft`), on a ViT's residual
stream after block l.

1. **Crops.** From each image, as the model sees it (the model's resize and centre crop), ``crops`` random
   squares of side `CROP_FRACTION` of the shorter side (the reference's 64-pixel crops of 224-pixel images),
   at positions drawn from ``seed``, each resized back to the model's input (bilinear, as the reference).
2. **Activations.** Block l's output patch tokens of each crop, A (P, D). The residual stream is not
   non-negative, and CRAFT's NMF needs it to be (the reference reads post-ReLU CNN features and asserts it):
   every channel is shifted by its least value over all the crops' patch tokens, o_d = min A_d, so that
   A − o >= 0, and each crop's activation is the mean of A − o over its patches (the reference's average
   pooling of its (C, h, w) activations).
3. **Concepts.** NMF of the (n, D) crop activations: U (n, k), the bank W (k, D) (`fit_concept_bank`).
4. **Coefficients of an image.** Each patch token of a whole image, max(A_p − o, 0) (clipped: a token of
   another image may lie below a crop minimum), projected on W (`concept_coefficients`): U (P, k), concept j's
   heatmap on that image being column j.
5. **Importance.** For each image, h(M) = the class logit of the model's remaining blocks and head
   (`passes.tail`) run on block l's tokens with the patches rebuilt as (U ⊙ M) W + o + R, M ∈ [0, 1]^k the same
   mask on every patch (the reference's 4-D re-parameterisation), and the prefix tokens as they were; the
   total-order Sobol indices of h by Jansen's estimator, averaged over the images (`Craft.estimate_importance`).
   R is what the k concepts leave out of each patch, R_p = A_p − (U_p W + o), so that h(1) is the model's own
   logit and a mask changes nothing but the concepts (``residual=True``, the default). The reference rebuilds
   the activations from the concepts alone (R = 0, ``residual=False``): its h(1) is then the logit of an
   approximation of the image, and a concept's importance and drop are measured from there.
   Each image costs (k + 2) N + k + 1 runs of the remaining blocks (395 for k = 10 and the reference's N = 32),
   so they are averaged over ``importance_images`` of the images, evenly spaced in their order (all of them
   when there are no more); the concepts are fitted on every image's crops.
6. **Logit drop.** h(1) − h(1 − e_j): the class logit lost when concept j's coefficients are set to 0 on every
   patch, averaged over the images (with R kept, the model's logit minus its logit without concept j).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis.craft import (
    DESIGN,
    concept_coefficients,
    fit_concept_bank,
    jansen_total_indices,
    sobol_design,
)
from vit_inspect.core.errors import Cancelled, InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import load_image
from vit_inspect.passes.block_tokens import checked_layer, recording_blocks
from vit_inspect.passes.lens import lens_tokens
from vit_inspect.passes.tail import model_tail

DEFAULT_CONCEPTS = 10  # k when none is asked for (the reference README's)
MAX_CONCEPTS = 20  # k at most (the reference's default number of concepts)
DEFAULT_CROPS = 8  # crops per image (the reference's grid of 64-pixel crops, stride 51, on 224 px, makes 16)
MAX_CROPS = 64
MAX_IMAGES = 200  # images of one class at most
CROP_FRACTION = 64 / 224  # crop side over the image's shorter side (the reference's)
GALLERY = 8  # crops shown per concept
GALLERY_SIDE = 64  # pixels of a gallery crop's side
IMPORTANCE_IMAGES = 16  # images the importance and logit drop are averaged over, by default (cost: see below)
BATCH = 64  # sequences per forward


@dataclass(frozen=True)
class ClassConcepts:
    """k concepts of one class at one block, ordered by importance (highest first)."""

    model_name: str  # the model whose tokens were factorised
    layer: int  # 0-based block whose output tokens were factorised
    target: int  # the class whose logit is explained
    seed: int  # the crops' positions
    images: tuple[str, ...]  # the images' names, in order
    explained: tuple[int, ...]  # indices of the images the importance and logit drop are averaged over
    bank: np.ndarray  # (k, D) float32 W, each concept in the shifted token space (tokens minus `offset`)
    offset: np.ndarray  # (D,) float32 o, the channels' least values over the crops' patch tokens
    importance: np.ndarray  # (k,) float64 total-order Sobol index of the class logit, mean over the images
    logit_drop: np.ndarray  # (k,) float64 class logit lost when the concept is removed, mean over the images
    logit_rebuilt: float  # mean class logit with every patch rebuilt from all k concepts (and R when kept), h(1)
    logit_model: float  # mean class logit of the model itself on those images
    crop_coefficients: np.ndarray  # (n_crops, k) float32 U of the crops' activations
    crop_boxes: np.ndarray  # (n_crops, 4) int: image index, top, left, side in the model input's pixels
    galleries: np.ndarray  # (k, GALLERY, GALLERY_SIDE, GALLERY_SIDE, 3) uint8 each concept's top crops
    error: float  # ||A - U W||_F / ||A||_F of the crops' activations
    residual: bool = True  # whether the rebuilt patches keep what the concepts leave out (module docstring, 5)

    @property
    def k(self) -> int:
        return int(self.bank.shape[0])


def _pictures(handle: ViTHandle, images: Sequence) -> tuple[list[str], torch.Tensor, np.ndarray]:
    """(names, (n, 3, H, W) normalised pixels, (n, H, W, 3) uint8 RGB) of the images as the model sees them."""
    names, pixels, rgbs = [], [], []
    for index, source in enumerate(images):
        picture = load_image(source)
        x, rgb = handle.preprocess.apply(picture)
        names.append(os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike))
                     else f"image {index + 1}")
        pixels.append(x)
        rgbs.append(rgb)
    return names, torch.cat(pixels), np.stack(rgbs)


def _block_output(handle: ViTHandle, layer: int, pixels: torch.Tensor) -> torch.Tensor:
    """(B, N, D) float32 output tokens of block ``layer``, `BATCH` images per forward, on the model's device."""
    outs = []
    with torch.no_grad(), recording_blocks(handle, [layer]) as seen:
        for start in range(0, len(pixels), BATCH):
            handle.forward(pixels[start:start + BATCH])
            outs.append(seen[layer].float())
    return torch.cat(outs)


def random_crops(pixels: torch.Tensor, crops: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """(n, 3, H, W) -> ((n * crops, 3, H, W) crops resized to (H, W) bilinearly, (n * crops, 4) boxes of image
    index, top, left and side): squares of side `CROP_FRACTION` of min(H, W) at uniform positions from ``seed``."""
    n, _, height, width = pixels.shape
    side = max(1, round(CROP_FRACTION * min(height, width)))
    rng = np.random.default_rng(seed)
    tops = rng.integers(0, height - side + 1, (n, crops))
    lefts = rng.integers(0, width - side + 1, (n, crops))
    boxes = np.array([(i, tops[i, c], lefts[i, c], side) for i in range(n) for c in range(crops)], dtype=np.int64)
    cut = torch.stack([pixels[i, :, t:t + side, left:left + side] for i, t, left, _ in boxes])
    return torch.nn.functional.interpolate(cut, size=(height, width), mode="bilinear", align_corners=False), boxes


def _gallery(rgbs: np.ndarray, boxes: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """(k, GALLERY, s, s, 3) uint8: each concept's crops of highest coefficient, highest first, as thumbnails."""
    k = coefficients.shape[1]
    shown = min(GALLERY, len(boxes))
    out = np.zeros((k, GALLERY, GALLERY_SIDE, GALLERY_SIDE, 3), np.uint8)
    for j in range(k):
        for slot, c in enumerate(np.argsort(-coefficients[:, j], kind="stable")[:shown]):
            i, top, left, side = boxes[c]
            crop = Image.fromarray(rgbs[i, top:top + side, left:left + side])
            out[j, slot] = np.asarray(crop.resize((GALLERY_SIDE, GALLERY_SIDE), Image.Resampling.BILINEAR))
    return out


def _checked(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InputError(f"The number of {name} must be a whole number from {low} to {high}, not {value!r}.")
    return int(value)


def default_layer(handle: ViTHandle) -> int:
    """The block CRAFT reads when none is asked for: the last but one for a head that reads the prefix tokens
    alone (after the last block, patch concepts could not change its logit), else the last."""
    return handle.depth - (2 if lens_tokens(handle) or handle.global_pool == "token" else 1)


def class_concepts(handle: ViTHandle, images: Sequence, target: int, k: int = DEFAULT_CONCEPTS,
                   layer: int | None = None, crops: int = DEFAULT_CROPS, seed: int = 0,
                   design: int = DESIGN, importance_images: int = IMPORTANCE_IMAGES, residual: bool = True,
                   progress: Callable[[int, int], None] | None = None,
                   cancelled: Callable[[], bool] | None = None) -> ClassConcepts:
    """CRAFT's ``k`` concepts of class ``target`` over ``images`` (paths or PIL images of that class) at block
    ``layer`` (None: `default_layer`), from ``crops`` random crops per image (module docstring), ordered by
    importance, which is averaged over ``importance_images`` of the images. ``design`` is N of the Sobol design
    (h runs (k + 2) N + k + 1 times per image). ``residual`` keeps, in every rebuilt patch, what the concepts leave
    out of it (module docstring, 5). An
    `InputError` with a sentence for an image count, crop count, k, block or class out of range.

    ``progress(done, total)`` is called after the crops' forwards (step 1) and after each image's importance
    (one step each); ``cancelled()`` is read before each of those steps, and when it turns true `Cancelled` is
    raised before the next one starts."""
    _checked("images", len(images), 1, MAX_IMAGES)
    crops = _checked("crops per image", crops, 1, MAX_CROPS)
    _checked("design points", design, 2, 1024)
    importance_images = _checked("images for the importance", importance_images, 1, MAX_IMAGES)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        raise InputError(f"The seed must be a whole number from 0 to {2 ** 32 - 1}, not {seed!r}.")
    layer = default_layer(handle) if layer is None else checked_layer(layer, handle.depth)
    if not handle.has_head:
        raise InputError(f"{handle.name!r} has no classification head: there is no class logit to explain.")
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or not 0 <= target < len(handle.labels):
        raise InputError(f"Class {target!r} does not exist: the model has classes 0 to {len(handle.labels) - 1}.")
    if layer == handle.depth - 1 and (lens_tokens(handle) or handle.global_pool == "token"):
        raise InputError(f"After block {layer}, the last, the head reads the class token alone, so concepts of the "
                         "patches cannot change its logit; choose an earlier block.")
    k = _checked("concepts", k, 1, min(MAX_CONCEPTS, len(images) * crops, handle.embed_dim))
    names, pixels, rgbs = _pictures(handle, images)
    layout = handle.layout()
    tail = model_tail(handle, layer, pixels[:1])

    chosen = np.unique(np.linspace(0, len(pixels) - 1, min(importance_images, len(pixels))).round().astype(int))
    steps = 1 + len(chosen)

    def step(done: int) -> None:
        if progress is not None:
            progress(done, steps)
        if cancelled is not None and cancelled():
            raise Cancelled(f"Class concepts were cancelled after {done} of {steps} steps.")

    step(0)
    cut, boxes = random_crops(pixels, crops, seed)
    crop_tokens = layout.patches(_block_output(handle, layer, cut), axis=1)  # (n_crops, P, D)
    offset = crop_tokens.amin(dim=(0, 1))  # (D,)
    pooled = (crop_tokens - offset).mean(dim=1).cpu().numpy()  # (n_crops, D), >= 0
    u, w = fit_concept_bank(pooled, k)
    w = w.astype(np.float32)  # the bank as it is kept, so that coefficients found later from it are these
    error = float(np.linalg.norm(pooled - u @ w) / max(np.linalg.norm(pooled), 1e-30))

    step(1)
    tokens = _block_output(handle, layer, pixels[chosen])  # (m, N, D)
    prefix, patches = layout.split(tokens, axis=1)
    with torch.no_grad():
        logits_model = tail(tokens)[:, target].cpu().numpy()
    masks = sobol_design(k, design)  # (M, k)
    masks = np.concatenate([masks, np.ones((1, k), np.float32), 1 - np.eye(k, dtype=np.float32)])  # + h(1), h(1-e_j)
    bank = torch.as_tensor(w, dtype=torch.float32, device=tokens.device)
    importance, drops, rebuilt = [], [], []
    for i in range(len(chosen)):
        shifted = (patches[i] - offset).clamp_min(0).cpu().numpy()  # (P, D)
        coefficients = torch.as_tensor(concept_coefficients(shifted, w), dtype=torch.float32, device=tokens.device)
        rest = patches[i] - (coefficients @ bank + offset) if residual else 0.0  # R, (P, D)
        outputs = []
        for start in range(0, len(masks), BATCH):
            m = torch.as_tensor(masks[start:start + BATCH], device=tokens.device)  # (b, k)
            rebuilt_patches = (coefficients[None] * m[:, None, :]) @ bank + offset + rest  # (b, P, D)
            sequence = layout.join(prefix[i:i + 1].expand(len(m), -1, -1), rebuilt_patches, axis=1)
            outputs.append(tail(sequence)[:, target].float().cpu().numpy())
        y = np.concatenate(outputs)
        sobol, full, removed = y[:-(k + 1)], y[-(k + 1)], y[-k:]
        importance.append(jansen_total_indices(sobol, k, design))
        drops.append(full - removed)
        rebuilt.append(full)
        if i + 1 < len(chosen):
            step(2 + i)
    if progress is not None:
        progress(steps, steps)
    importance, drops = np.nanmean(importance, axis=0), np.mean(drops, axis=0)
    order = np.argsort(-np.nan_to_num(importance, nan=-np.inf), kind="stable")
    return ClassConcepts(
        model_name=handle.name, layer=layer, target=int(target), seed=int(seed), images=tuple(names),
        explained=tuple(int(i) for i in chosen),
        bank=w[order].astype(np.float32), offset=offset.cpu().numpy().astype(np.float32),
        importance=importance[order], logit_drop=drops[order], logit_rebuilt=float(np.mean(rebuilt)),
        logit_model=float(logits_model.mean()), crop_coefficients=u[:, order].astype(np.float32), crop_boxes=boxes,
        galleries=_gallery(rgbs, boxes, u[:, order]), error=error, residual=bool(residual))


def class_concept_heatmaps(handle: ViTHandle, concepts: ClassConcepts, image) -> np.ndarray:
    """(k, grid_h, grid_w) float32 coefficients of each concept at each patch of ``image`` (a path or PIL image,
    as the model sees it): its block tokens shifted and clipped, projected on the bank (module docstring, 4)."""
    if concepts.model_name != handle.name or concepts.bank.shape[1] != handle.embed_dim:
        raise InputError(f"These concepts are of {concepts.model_name!r}, not of {handle.name!r}.")
    _, pixels, _ = _pictures(handle, [image])
    layout = handle.layout()
    patches = layout.patches(_block_output(handle, concepts.layer, pixels)[0], axis=0)  # (P, D)
    shifted = (patches - torch.as_tensor(concepts.offset, device=patches.device)).clamp_min(0).cpu().numpy()
    return layout.to_grid(concept_coefficients(shifted, concepts.bank).T).astype(np.float32)

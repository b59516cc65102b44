"""One pass per image: a single forward with capture and a single backward feed every method.

`analyze_image` returns an `ImageAnalysis` of plain, compact arrays (attention in float16). Raw
attention, rollout and mean distance for any option are recomputed from it without the model;
Grad-CAM (every layer) and gradient-weighted attention are computed during the pass for the target.
`model_report` and `dataset_attention_distance` are the model-level and folder-level analyses.
"""
from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from PIL import Image

from .analysis import (FilterPCA, attention_map, chefer_relevance, filter_pca, gradcam_from_tokens,
                       gradient_fused_attention, gradient_rollout, legrad_map, mean_attention_distance,
                       patch_relevance, pos_embed_similarity, prefix_shares, rollout)
from .capture import capture_attention
from .errors import UnsupportedModelError, VitInspectError
from .geometry import InputGeometry, prepare, seen_box
from .head_pass import HeadPass, build_head_pass
from .images import ImageLimits, load_image
from .models import ViTHandle
from .relevance import relevance_rules
from .tokens import TokenLayout

LEGRAD_LAYERS = 4  # LeGrad over the last 4 blocks, as the reference (torchcam) runs it
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


@dataclass(frozen=True)
class ImageAnalysis:
    """The cached result of one pass over one image: everything the maps need, no tensors."""

    model_name: str
    layout: TokenLayout  # token geometry of this input size
    rgb: np.ndarray  # (H, W, 3) uint8, the exact crop the model saw
    probs: np.ndarray  # (num_classes,) float32 softmax; empty for a model without a head
    attention: np.ndarray  # (depth, heads, N, N) float16 attention probabilities
    mean_distance: np.ndarray  # (depth, heads) mean attention distance in input pixels
    target: int | None  # class the gradients were taken for; None without a head
    gradcam: np.ndarray | None  # (depth, grid_h, grid_w) raw Grad-CAM at each block's first LayerNorm
    chefer: np.ndarray | None  # (grid_h, grid_w) gradient-weighted attention relevance (Chefer et al. 2021)
    readout: str  # "class" (class-token readout) or "mean" (mean over patch tokens)
    heads: HeadPass | None = None  # logit lens, token norms and per-head statistics of this pass
    legrad: np.ndarray | None = None  # (grid_h, grid_w) LeGrad (Bousselham et al. 2025), last LEGRAD_LAYERS layers
    attnlrp: np.ndarray | None = None  # (grid_h, grid_w) AttnLRP relevance per patch (Achtibat et al. 2024)
    patch_features: np.ndarray | None = None  # (grid_h, grid_w, D) float16 last block's output patch tokens
    contrast: int | None = None  # gradients are of logit[target] - logit[contrast]; None: of logit[target]
    grad_attention: np.ndarray | None = None  # (depth, N, N) float16 `gradient_fused_attention`, for gradient rollout
    geometry: str = "crop"  # `InputGeometry.mode` the input was made with
    seen_box: tuple[float, float, float, float] | None = None  # (left, top, right, bottom) of the upload seen, pixels
    preview: np.ndarray | None = None  # (h, w, 3) uint8 the whole upload, longer side at most PREVIEW_SIDE
    source_size: tuple[int, int] | None = None  # (width, height) of the upload, pixels

    @property
    def depth(self) -> int:
        return self.attention.shape[0]

    @property
    def num_heads(self) -> int:
        return self.attention.shape[1]

    def attention_map(self, layer: int, head: int | None = None, query=None) -> np.ndarray:
        """(grid_h, grid_w) raw attention of one layer/head (None: mean of heads) from a query token."""
        return attention_map(self.attention[layer:layer + 1].astype(np.float32), self.layout, 0, head,
                             self.readout if query is None else query)

    def rollout(self, head_fusion: str = "mean", discard_ratio: float = 0.0, residual: bool = True,
                start_layer: int = 0, end_layer: int | None = None, query=None, discard: str = "row") -> np.ndarray:
        """(grid_h, grid_w) attention rollout (Abnar & Zuidema 2020) with the given options
        (``discard``: "row" ours, "matrix" vit-explain's; see `analysis.rollout_matrix`)."""
        return rollout(self.attention, self.layout, head_fusion=head_fusion, discard_ratio=discard_ratio,
                       residual=residual, start_layer=start_layer, end_layer=end_layer,
                       query=self.readout if query is None else query, discard=discard)

    def gradient_rollout(self, discard_ratio: float = 0.9, start_layer: int = 0, end_layer: int | None = None,
                         query=None, discard: str = "matrix") -> np.ndarray | None:
        """(grid_h, grid_w) class-specific gradient rollout (vit-explain) for this result's target
        (and contrast); None for a model without a head."""
        if self.grad_attention is None:
            return None
        return gradient_rollout(self.grad_attention, self.layout, discard_ratio, start_layer=start_layer,
                                end_layer=end_layer, query=self.readout if query is None else query, discard=discard)

    def head_maps(self, layer: int, query=None) -> np.ndarray:
        """(heads, grid_h, grid_w) raw attention of every head of one layer from a query token."""
        return np.stack([self.attention_map(layer, head, query) for head in range(self.num_heads)])

    def prefix_share(self, layer: int, head: int | None = None, query=None) -> dict[str, float]:
        """{prefix token name: share of the query's attention on it} for one layer and head (None: mean)."""
        heads = self.attention[layer].astype(np.float32)  # (heads, N, N)
        matrix = heads.mean(axis=0) if head is None else heads[head]
        shares = prefix_shares(matrix, self.layout, self.readout if query is None else query)
        return dict(zip(self.layout.prefix_names(), (float(v) for v in shares)))

    def nbytes(self) -> int:
        """Memory held by the arrays of this result."""
        arrays = (self.rgb, self.probs, self.attention, self.mean_distance, self.gradcam, self.chefer, self.legrad,
                  self.attnlrp, self.patch_features, self.grad_attention, self.preview)
        return sum(a.nbytes for a in arrays if a is not None) + (self.heads.nbytes() if self.heads else 0)


def readout_query(handle: ViTHandle) -> str:
    """The token the head reads: the class token, or the mean of patch tokens for pooled models."""
    return "class" if handle.global_pool == "token" and handle.has_class_token else "mean"


def autocast_dtype(device: torch.device) -> torch.dtype:
    """Half precision for `autocast=True`: float16 on CUDA, bfloat16 on CPU (CPU float16 is slow)."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def analyze_image(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes, target: int | None = None,
                  input_size: tuple[int, int] | None = None, gradients: bool = True,
                  autocast: bool = False, limits: ImageLimits = ImageLimits(),
                  geometry: InputGeometry | None = None, contrast: int | None = None) -> ImageAnalysis:
    """Run one forward pass with attention capture and, for models with a head, one backward pass
    from the logit of `target` (default: the top prediction).

    Grad-CAM is taken at the first LayerNorm of every block (patch tokens only: at the final output
    only the class token reaches the head, so patch tokens get no gradient there); the last block's
    is the usual choice. Gradient-weighted attention follows Chefer et al. 2021, Eq. 5-6.
    LeGrad (last `LEGRAD_LAYERS` blocks, the model's own readout) takes one short backward per layer
    through that block only; AttnLRP takes one more, modified, backward to the pixels over the same graph
    (`vit_inspect.relevance`): the rules change only the backward, so no second forward is needed.
    `autocast=True` runs the pass under `torch.autocast` in half precision (`autocast_dtype`); the
    maps then agree with float32 to the tolerance stated in tests/test_pipeline.py.
    The last block's output patch tokens are kept too (`patch_features`, for the DINOv2-style feature PCA).

    `geometry` chooses what the model sees (`geometry.InputGeometry`: the model's crop, the whole image
    squashed, or the whole image with its aspect ratio on a non-square grid); without it, the model's
    crop at `input_size`. With `contrast`, the backward pass starts from logit[target] - logit[contrast]
    ("why target and not contrast?"). The result also keeps, per layer, the head-fused gradient-weighted
    attention of vit-explain's gradient rollout (`analysis.gradient_fused_attention`, float16).
    """
    picture = image if isinstance(image, Image.Image) else load_image(image, limits)
    if geometry is None:
        pixels, rgb = handle.preprocess.apply(picture, input_size)
        box = seen_box(handle.preprocess, picture.size, rgb.shape[:2])
    else:
        pixels, rgb, box = prepare(handle.preprocess, picture, geometry, handle.patch_size)
    layout = handle.layout(rgb.shape[:2])
    use_grad = gradients and handle.has_head
    pixels = pixels.to(handle.device).requires_grad_(use_grad)  # graph exists even for frozen weights
    layers = range(handle.depth) if use_grad else ()
    with (torch.set_grad_enabled(use_grad), capture_attention(handle, activation_layers=layers, residual=True) as rec,
          relevance_rules(handle) as lrp, torch.autocast(handle.device.type, dtype=autocast_dtype(handle.device), enabled=autocast)):
        logits = handle.forward(pixels)  # (1, num_classes) or (1, D)
    attention = rec.attention[0].float().cpu().numpy()  # (depth, heads, N, N)
    features = layout.patches(rec.residual(handle.depth - 1)[0].float().cpu().numpy(), axis=0)  # (P, D)
    probs = logits.detach()[0].float().softmax(-1).cpu().numpy() if handle.has_head else np.zeros(0, np.float32)
    query = readout_query(handle)
    chosen = gradcam = chefer = attention_grad = legrad = attnlrp = grad_attention = None
    if use_grad:
        chosen = int(np.argmax(probs)) if target is None else int(target)
        for index in (chosen, contrast):
            if index is not None and not 0 <= index < len(probs):
                raise VitInspectError(f"Class {index} is out of range: the model has classes 0 to {len(probs) - 1}.")
        if contrast is not None and contrast == chosen:
            raise VitInspectError("The contrast class is the target class itself; choose another class to compare.")
        last = range(handle.depth)[-LEGRAD_LAYERS:]
        with suppress(UnsupportedModelError):  # a readout or attention LeGrad/AttnLRP cannot follow: maps absent
            legrad = legrad_map(lrp.legrad_gradients(rec.attention_tensors(), chosen, last)[:, 0].float().cpu().numpy(),
                                layout).astype(np.float32)
        with suppress(UnsupportedModelError):
            attnlrp = patch_relevance(lrp.attnlrp(logits[0, chosen].float(), pixels)[0].float().cpu().numpy(),
                                      layout).astype(np.float32)
        score = logits[0, chosen] if contrast is None else logits[0, chosen] - logits[0, contrast]
        rec.backward(score.float())
        attention_grad = rec.attention_grad()[0].float().cpu().numpy()  # (depth, heads, N, N)
        chefer = chefer_relevance(attention, attention_grad, layout, query=query).astype(np.float32)
        grad_attention = gradient_fused_attention(attention, attention_grad).astype(np.float16)  # (depth, N, N)
        gradcam = np.stack([
            gradcam_from_tokens(rec.activation(i)[0].float().cpu().numpy(),
                                rec.activation_grad(i)[0].float().cpu().numpy(), layout)
            for i in layers]).astype(np.float32)  # (depth, grid_h, grid_w)
    heads = build_head_pass(handle, rec, logits, attention, attention_grad, layout,
                            tolerance=5e-2 if autocast else 1e-3)
    return ImageAnalysis(
        model_name=handle.name, layout=layout, rgb=rgb, probs=probs.astype(np.float32),
        attention=attention.astype(np.float16), mean_distance=mean_attention_distance(attention, layout),
        target=chosen, gradcam=gradcam, chefer=chefer, readout=query, heads=heads, legrad=legrad, attnlrp=attnlrp,
        patch_features=features.reshape(layout.grid_h, layout.grid_w, -1).astype(np.float16),
        contrast=contrast if use_grad else None, grad_attention=grad_attention,
        geometry="crop" if geometry is None else geometry.mode, seen_box=box, preview=_preview(picture),
        source_size=picture.size)


PREVIEW_SIDE = 448  # pixels: longer side of the whole-upload preview kept with a result


def _preview(picture: Image.Image) -> np.ndarray:
    """(h, w, 3) uint8 copy of the whole upload, its longer side at most PREVIEW_SIDE."""
    thumb = picture.convert("RGB")
    thumb.thumbnail((PREVIEW_SIDE, PREVIEW_SIDE), Image.Resampling.BILINEAR)
    return np.asarray(thumb, dtype=np.uint8)


@dataclass(frozen=True)
class ModelReport:
    """Model-level analyses (ViT paper Fig. 7 left and centre); no image needed."""

    filter_pca: FilterPCA
    pos_similarity: np.ndarray | None  # (grid_h, grid_w, grid_h, grid_w) at the native grid; None without pos. embed.
    grid: tuple[int, int]  # the native grid


def model_report(handle: ViTHandle, k: int = 28) -> ModelReport:
    """Patch-embedding filter PCA and position-embedding cosine similarity at the native grid."""
    return ModelReport(filter_pca=filter_pca(handle.patch_embed_weight(), k),
                       pos_similarity=pos_similarity_at(handle, handle.native_grid), grid=handle.native_grid)


def pos_similarity_at(handle: ViTHandle, grid: tuple[int, int]) -> np.ndarray | None:
    """Position-embedding cosine similarity for a (grid_h, grid_w) grid, using the model's own
    interpolation of the embeddings when the grid differs from the native one."""
    pos = handle.patch_pos_embed(grid)
    return None if pos is None else pos_embed_similarity(pos)


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Image files named directly, or found (sorted, non-recursively) in the folders named."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()))
        else:
            found.append(path)
    return found


@dataclass(frozen=True)
class DatasetDistance:
    """Mean attention distance averaged over a set of images."""

    distances: np.ndarray  # (depth, heads) pixels
    num_images: int  # images that contributed
    skipped: tuple[tuple[str, str], ...]  # (file name, reason) of each file that could not be read


def dataset_attention_distance(handle: ViTHandle, images: Iterable[str | os.PathLike | Image.Image],
                               batch_size: int = 16, input_size: tuple[int, int] | None = None,
                               progress: Callable[[int, int], None] | None = None,
                               limits: ImageLimits = ImageLimits()) -> DatasetDistance:
    """Mean attention distance (see `mean_attention_distance`) averaged over many images, in batches,
    streaming: only running sums are kept, never the maps. Unreadable files are skipped and listed.
    In-process with this handle; `engine.run_job` with a `jobs.AttentionDistanceJob` runs the same
    job on Ray."""
    from .engine import EngineOptions, run_job
    from .jobs import AttentionDistanceJob, AttentionDistanceWorker

    job = AttentionDistanceJob(handle.name, input_size=input_size)
    result, _ = run_job(job, images, "local", EngineOptions(batch_size=batch_size, limits=limits), progress,
                        worker=AttentionDistanceWorker(handle, input_size))
    return result

"""Concepts of one image (deep feature factorisation at any block) and patch similarity, from a pass's result.

`image_concepts` factorises one block's output patch tokens (`block_tokens.block_tokens`) into k concepts
(`analysis.concepts.deep_feature_factorization`, Collins et al. 2018) and reads each concept's embedding through
the model's own head, as pytorch-grad-cam's ``DeepFeatureFactorization`` runs its ``computation_on_concepts``
(the classifier) on the concepts: here the head of the logit lens (`lens.lens_readouts`, the final norm and
head), given a sequence whose every token is the concept's embedding, so that a class-token, distilled or
pooled head reads the concept alone. `patch_similarity` is `analysis.similarity.cosine_similarity` of one
patch's token to the patches of its own image and of another.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vit_inspect.analysis.concepts import deep_feature_factorization
from vit_inspect.analysis.logit_lens import lens_probs
from vit_inspect.analysis.similarity import cosine_similarity
from vit_inspect.core.errors import InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.block_tokens import block_tokens, checked_layer
from vit_inspect.passes.lens import lens_readouts
from vit_inspect.passes.result import ImageAnalysis

DEFAULT_CONCEPTS = 5  # k when none is asked for (pytorch-grad-cam's run_dff_on_image)
MAX_CONCEPTS = 20  # k at most: more parts than a picture can show side by side


@dataclass(frozen=True)
class ImageConcepts:
    """One image's k concepts at one block, ordered by their logit for ``target`` (highest first), or by their
    area for a model without a head."""

    model_name: str  # the model whose tokens were factorised
    layer: int  # 0-based block whose output patch tokens were factorised
    target: int | None  # the class each concept's logit is read for (the pass's target, else its top class)
    seed: int  # the NMF's random initialisation
    heatmaps: np.ndarray  # (k, grid_h, grid_w) float32 H: each concept's non-negative weight at each patch
    embeddings: np.ndarray  # (k, D) float32 concept embeddings W_j + o in the block's token space
    areas: np.ndarray  # (k,) float64 each concept's share of the factorisation's mass, adding up to 1
    logits: np.ndarray | None  # (k, num_classes) float32 the head's logits of each embedding; None: no head
    error: float  # relative reconstruction error of the shifted tokens, ||A⁺ - WH||_F / ||A⁺||_F
    iterations: int  # NMF iterations run

    @property
    def k(self) -> int:
        return int(self.heatmaps.shape[0])

    def class_logits(self) -> np.ndarray | None:
        """(k,) each concept's logit for ``target`` (the head reading the concept's embedding alone); None
        without a head."""
        return None if self.logits is None or self.target is None else self.logits[:, self.target]

    def class_probabilities(self) -> np.ndarray | None:
        """(k,) each concept's softmax probability of ``target`` over all classes (the number pytorch-grad-cam's
        ``create_labels_legend`` prints beside a concept); None without a head."""
        return None if self.logits is None or self.target is None else lens_probs(self.logits)[:, self.target]


def concept_logits(handle: ViTHandle, embeddings: np.ndarray, layout: TokenLayout) -> np.ndarray | None:
    """(k, D) concept embeddings -> (k, num_classes) float32 logits of the model's head (`lens_readouts`'s
    ``"readout"``: its final norm and head) over a sequence of ``layout.num_tokens`` copies of each embedding;
    None for a model without a head, or one whose head vit_inspect cannot replay."""
    read = lens_readouts(handle).get("readout")
    if read is None:
        return None
    x = torch.as_tensor(np.asarray(embeddings, np.float32), device=handle.device)  # (k, D)
    with torch.no_grad():
        return read(x[:, None, :].expand(-1, layout.num_tokens, -1)).float().cpu().numpy()  # (k, C)


def explained_class(result: ImageAnalysis, target: int | None, num_classes: int) -> int:
    """The class a concept's logit is read for: ``target`` if given (an `InputError` when the head has no such
    class), else the pass's target, else its top class (also for a pass that explained a text prompt, whose
    column of a CLIP-style model's zero-shot head is not one of the head's classes)."""
    if target is None:
        chosen = result.target
        return int(chosen) if chosen is not None and chosen < num_classes else int(np.argmax(result.probs))
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or not 0 <= target < num_classes:
        raise InputError(f"Class {target!r} does not exist: the model has classes 0 to {num_classes - 1}.")
    return int(target)


def image_concepts(handle: ViTHandle, result: ImageAnalysis, k: int = DEFAULT_CONCEPTS, layer: int | None = None,
                   seed: int = 0, target: int | None = None, tokens: np.ndarray | None = None) -> ImageConcepts:
    """The ``k`` concepts of ``result``'s image at block ``layer`` (None: the last), by deep feature
    factorisation of that block's output patch tokens (module docstring), each with its heatmap, its area and
    its logits through the model's head, ordered by their logit for ``target`` (`explained_class`; default the
    pass's target, else its top class). ``k`` from 1 to `MAX_CONCEPTS` (and at most the patches and
    channels); an `InputError` with a sentence for a k, block or class out of range. ``tokens``: the (P, D) block
    output patch tokens to factorise instead of the result's own (of another input of the same model and grid)."""
    layer = checked_layer(layer, handle.depth)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        raise InputError(f"The seed must be a whole number from 0 to {2 ** 32 - 1}, not {seed!r}.")
    most = min(MAX_CONCEPTS, result.layout.num_patches, handle.embed_dim)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= most:
        raise InputError(f"The number of concepts must be a whole number from 1 to {most}, not {k!r}.")
    tokens = block_tokens(handle, result, layer) if tokens is None else tokens  # (P, D)
    parts = deep_feature_factorization(tokens, int(k), seed=seed)
    logits = concept_logits(handle, parts.concepts, result.layout)
    target = None if logits is None else explained_class(result, target, logits.shape[1])
    areas = parts.areas
    order = np.argsort(-(logits[:, target] if logits is not None else areas), kind="stable")
    return ImageConcepts(
        model_name=handle.name, layer=layer, target=target, seed=seed,
        heatmaps=result.layout.to_grid(parts.heatmaps[order]).astype(np.float32),
        embeddings=parts.concepts[order].astype(np.float32), areas=areas[order],
        logits=None if logits is None else logits[order], error=parts.error, iterations=parts.iterations)


def patch_similarity(handle: ViTHandle, result: ImageAnalysis, patch: tuple[int, int], layer: int | None = None,
                     other: ImageAnalysis | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """((grid_h, grid_w) float64 cosine similarity of patch ``patch`` = (row, col)'s token at block ``layer``
    (None: the last) to every patch of ``result``'s image, the same for every patch of ``other``'s image (a
    result of the same model; its grid may differ) or None). An `InputError` for a patch outside the grid."""
    layer = checked_layer(layer, handle.depth)
    layout = result.layout
    try:
        index = layout.token_index(*(int(v) for v in patch)) - layout.num_prefix_tokens
    except (TypeError, ValueError):
        raise InputError(f"Patch {patch!r} is not a (row, column) of the {layout.grid_h}x{layout.grid_w} "
                         "patch grid.") from None
    tokens = block_tokens(handle, result, layer)  # (P, D)
    query = tokens[index]
    own = layout.to_grid(cosine_similarity(query, tokens))
    if other is None:
        return own, None
    return own, other.layout.to_grid(cosine_similarity(query, block_tokens(handle, other, layer)))

"""The maps vit_inspect ships, registered exactly as a plugin's `Method` is. Each reads the one pass
(`ImageAnalysis`); the papers' equations are implemented in `vit_inspect.analysis` and `vit_inspect.passes`."""
from __future__ import annotations

import numpy as np

from vit_inspect.methods.method import Method, MethodContext
from vit_inspect.methods.registry import register
from vit_inspect.passes.block_tokens import checked_layer, input_block_tokens
from vit_inspect.passes.concepts import DEFAULT_CONCEPTS, image_concepts

RELEVANCE_UNIT = "relevance ({score} units)"  # {score}: what the gradient maps explain, logit or cosine


def attention(context: MethodContext, layer: int | None = None, head: int | None = None, query=None) -> np.ndarray:
    """One layer's attention probabilities from a query token (default: the last layer, the mean of heads,
    the readout query: the class token, or the mean of patch queries; or a (row, col) patch)."""
    result = context.result
    return result.attention_map(result.depth - 1 if layer is None else layer, head, query)


def rollout(context: MethodContext, **options) -> np.ndarray:
    """Attention rollout with `ImageAnalysis.rollout`'s options (head_fusion, discard_ratio, residual,
    start_layer, end_layer, query, discard); default: mean fusion over every layer."""
    return context.result.rollout(**options)


def gradcam(context: MethodContext, layer: int = -1) -> np.ndarray | None:
    """Grad-CAM at the first LayerNorm of block `layer` (default the last), signed: activation × gradient."""
    maps = context.result.gradcam  # (depth, grid_h, grid_w)
    return None if maps is None else maps[layer]


def gradcam_relu(context: MethodContext, layer: int = -1) -> np.ndarray | None:
    """Grad-CAM of block `layer` after the paper's ReLU (Eq. 2), as it is drawn."""
    signed = gradcam(context, layer)
    return None if signed is None else np.maximum(signed, 0.0)


def chefer(context: MethodContext) -> np.ndarray | None:
    return context.result.chefer


def legrad(context: MethodContext) -> np.ndarray | None:
    return context.result.legrad


def attnlrp(context: MethodContext) -> np.ndarray | None:
    return context.result.attnlrp


def gradient_rollout(context: MethodContext, **options) -> np.ndarray | None:
    """vit-explain's class-specific gradient rollout with `ImageAnalysis.gradient_rollout`'s options."""
    return context.result.gradient_rollout(**options)


def dff_concept(context: MethodContext, k: int = DEFAULT_CONCEPTS, layer: int = -1, seed: int = 0) -> np.ndarray:
    """The heatmap of the first of the image's ``k`` DFF concepts at block ``layer`` (default the last; NMF seed
    ``seed``) in `passes.concepts.image_concepts`' order: the concept whose embedding the head reads with the
    largest logit for the explained class (by area for a model without a head). Its tokens are the pass's own
    where it kept them; a context with other ``pixels`` (or a pass that kept none) takes one forward."""
    result, handle = context.result, context.handle
    tokens = None
    if context.pixels is not None:
        tokens = input_block_tokens(handle, context.pixels, checked_layer(layer, handle.depth), result.layout)
    return image_concepts(handle, result, k, layer, seed, tokens=tokens).heatmaps[0]


register(Method(
    name="attention", title="raw attention, last layer, mean of heads", unit="attention weight (probability)",
    paper="Vaswani et al. 2017, Eq. 1 (softmax(QK^T / sqrt(d_k))), the readout query's row",
    reads="attention", compute=attention, record=False))
register(Method(
    name="rollout", title="attention rollout (Abnar & Zuidema 2020), defaults", unit="rollout weight (fraction)",
    paper="Abnar & Zuidema 2020, Sec. 3 (attention rollout, residual folded in as 0.5 A + 0.5 I)",
    reads="attention", compute=rollout))
register(Method(
    name="gradcam", title="Grad-CAM last block, signed", unit="activation × gradient",
    paper="Selvaraju et al. 2017, Eq. 1-2, on the tokens at the last block's first LayerNorm",
    reads="gradients", compute=gradcam, signed=True, relu=True))
register(Method(
    name="gradcam_relu", title="Grad-CAM last block, ReLU'd (as drawn)", unit="activation × gradient",
    paper="Selvaraju et al. 2017, Eq. 2 (the ReLU kept), on the tokens at the last block's first LayerNorm",
    reads="gradients", compute=gradcam_relu, record=False))
register(Method(
    name="chefer", title="gradient-weighted attention (Chefer et al. 2021)", unit=RELEVANCE_UNIT,
    paper="Chefer, Gur & Wolf 2021, Eq. 5-6 (mean over heads of (∇A ⊙ A)^+, rolled out)",
    reads="gradients", compute=chefer))
register(Method(
    name="legrad", title="LeGrad (Bousselham et al. 2025)", unit=RELEVANCE_UNIT,
    paper="Bousselham et al. 2025 (ICCV), Eq. 4-6, over the last layers",
    reads="relevance", compute=legrad))
register(Method(
    name="attnlrp", title="AttnLRP (Achtibat et al. 2024)", unit=RELEVANCE_UNIT,
    paper="Achtibat et al. 2024 (ICML), Sec. 3.3 and Eq. 9, relevance x · ∂*y/∂x summed per patch",
    reads="relevance", compute=attnlrp, signed=True))
register(Method(
    name="gradient_rollout", title="class-specific gradient rollout (vit-explain)", unit="rollout weight (fraction)",
    paper="Gildenblat 2020 (vit-explain), rollout of max(0, mean_h(A ⊙ ∂y/∂A)) per layer",
    reads="gradients", compute=gradient_rollout, faithfulness=False, sanity=False, record=False))
register(Method(
    name="dff_concept", title="DFF concept with the largest class logit, last block, k 5",
    unit="NMF coefficient (token units over the concept's scale)",
    paper="Collins, Achanta & Süsstrunk 2018 (ECCV), Sec. 3, Eq. 1: H of the NMF of the block's shifted patch tokens",
    reads="own passes", compute=dff_concept, forwards=1, sanity=False, record=False))

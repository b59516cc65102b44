"""Targets beyond a class: an SAE feature or a deep-feature-factorisation concept at block L, explained by
Grad-CAM, LeGrad and AttnLRP.

A target is a differentiable score of block L's output tokens (`Target.score`):

- `FeatureTarget` (an SAE's feature i): s = sum over the patch tokens p of z_pi, with
  z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)) and x the token normalised as the SAE says
  (`analysis.sae.feature_score`, Gao et al. 2024 Eq. 3). Only the patch tokens count, whatever tokens the SAE
  was trained on.
- `ConceptTarget` (concept j of the image's DFF at block L, `passes.concepts.image_concepts`): s = sum over the
  patches of concept j's coefficient, h_p = (a_p - o) W⁺ with W the concept parts and o the channel offsets of
  the image's factorisation (`analysis.concepts.concept_coefficients`), held fixed: the NMF solves a
  constrained problem with no gradient, and the pseudo-inverse projection is the linear map that returns the
  NMF's coefficients wherever the tokens are exact non-negative combinations of the parts.

Only blocks 0 to L take part. One forward (with gradients, every block's attention captured, the blocks
after L run but outside the score's graph) and, per map, backwards from s:

- Grad-CAM (Selvaraju et al. 2017, Eq. 1-2, `analysis.gradcam.gradcam_from_tokens`) reads the output of block
  ``gradcam_layer`` (default L, the tokens the score reads; any block up to L): there, unlike a class
  logit's, the patch tokens receive the score's gradient directly. One backward.
- LeGrad (Bousselham et al. 2025, Eq. 4-6, `analysis.legrad.legrad_map`) sums over the `LEGRAD_LAYERS`
  blocks ending at L (fewer when L is small): for each such block l, the target's own score read from block
  l's output, s^l = score(z^l), as LeGrad reads a class from an intermediate layer through the model's final
  readout; its gradient with respect to block l's attention, ReLU'd and averaged. One short backward per block.
- AttnLRP (Achtibat et al. 2024, `passes.relevance`) starts from s: through the SAE's encoder relevance
  passes as through a linear layer with the TopK and ReLU gates held fixed (the identity rule on the gates,
  LRP-0 i.e. the plain gradient on the linear map, the biases b_enc and b_dec absorbing their share); through
  the concept projection, linear already, likewise; then the blocks up to L under the model's AttnLRP rules to
  the pixels, summed per patch. One modified backward.

Maps are (grid_h, grid_w) float64 in units of the score: SAE activation, or concept coefficient.
"""
from __future__ import annotations

import os
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis.concepts import concept_coefficients, shifted_channels
from vit_inspect.analysis.gradcam import gradcam_from_tokens
from vit_inspect.analysis.legrad import legrad_map, patch_relevance
from vit_inspect.analysis.sae import feature_score
from vit_inspect.core.errors import InputError, UnsupportedModelError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import load_image
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.block_tokens import block_tokens, checked_layer, recording_blocks
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.concepts import DEFAULT_CONCEPTS, image_concepts
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import LEGRAD_LAYERS, model_input
from vit_inspect.passes.records import rounded
from vit_inspect.passes.relevance import relevance_rules
from vit_inspect.passes.result import ImageAnalysis

TARGET_METHODS = ("gradcam", "legrad", "attnlrp")  # the maps that explain a target's score


class Target(Protocol):
    """A score of block `layer`'s output that the gradient maps explain."""

    layer: int  # 0-based block whose output the score reads

    def score(self, tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """(B,) the score of (B, N, D) block outputs, differentiable."""

    def record(self) -> dict:
        """What the target is, for a JSON record."""

    def text(self) -> str:
        """How figure titles name the target."""


@dataclass(frozen=True)
class FeatureTarget:
    """Feature ``feature`` of an SAE on block ``sae.info.layer``'s output (module docstring)."""

    sae: SparseAutoencoder  # the top-k SAE (`core.sae_load.load_sae`)
    feature: int  # index of the feature, 0 to F - 1
    name: str = "SAE"  # how records and titles name the SAE: its file's name

    def __post_init__(self) -> None:
        features = self.sae.info.features
        if isinstance(self.feature, bool) or not isinstance(self.feature, (int, np.integer)) \
                or not 0 <= self.feature < features:
            raise InputError(f"Feature {self.feature!r} does not exist: this SAE has features 0 to {features - 1}.")

    @property
    def layer(self) -> int:
        return self.sae.info.layer

    def score(self, tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """(B,) sum over the patch tokens of the feature's activation (`analysis.sae.feature_score`)."""
        sae = self.sae.to(tokens.device)
        return feature_score(tokens[:, layout.patch_slice].float(), sae, int(self.feature))

    def record(self) -> dict:
        return {"kind": "sae_feature", "feature": int(self.feature), "sae": self.name, "block": self.layer}

    def text(self) -> str:
        return f"SAE feature {int(self.feature)} ({self.name}, block {self.layer})"


@dataclass(frozen=True)
class ConceptTarget:
    """Concept ``index`` of one image's DFF with ``k`` concepts at block ``layer`` (seed ``seed``), ordered as
    `passes.concepts.image_concepts` orders them; made by `concept_target`."""

    layer: int  # 0-based block whose output patch tokens were factorised
    k: int  # concepts in the factorisation
    index: int  # the concept, in `image_concepts`' order (highest logit for the explained class first)
    seed: int  # the NMF's random initialisation
    parts: np.ndarray  # (k, D) float32 W_j = c_j - o, the concept parts in the shifted token space
    offset: np.ndarray  # (D,) float32 o, the per-channel offsets of the image's factorisation
    ordered_by: int | None = None  # the class whose logit ordered the concepts; None: by area (no head)

    def score(self, tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """(B,) sum over the patches of the concept's coefficient (`analysis.concepts.concept_coefficients`)."""
        patches = tokens[:, layout.patch_slice].float()  # (B, P, D)
        coefficients = concept_coefficients(patches, torch.as_tensor(self.parts, device=tokens.device),
                                            torch.as_tensor(self.offset, device=tokens.device))  # (B, P, k)
        return coefficients[..., self.index].sum(-1)

    def record(self) -> dict:
        return {"kind": "dff_concept", "block": self.layer, "k": self.k, "index": self.index, "seed": self.seed,
                "ordered_by_class": self.ordered_by}

    def text(self) -> str:
        return f"DFF concept {self.index} of {self.k} (block {self.layer}, seed {self.seed})"


def concept_target(handle: ViTHandle, result: ImageAnalysis, index: int, k: int = DEFAULT_CONCEPTS,
                   layer: int | None = None, seed: int = 0) -> ConceptTarget:
    """The `ConceptTarget` of concept ``index`` among the ``k`` concepts of ``result``'s image at block ``layer``
    (None: the last), as `image_concepts` finds and orders them; an `InputError` for an index out of range."""
    concepts = image_concepts(handle, result, k, layer, seed)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < concepts.k:
        raise InputError(f"Concept {index!r} does not exist: choose 0 to {concepts.k - 1}.")
    _, offset = shifted_channels(block_tokens(handle, result, concepts.layer))  # the offsets the NMF used
    return ConceptTarget(layer=concepts.layer, k=concepts.k, index=int(index), seed=seed,
                         parts=(concepts.embeddings - offset[None]).astype(np.float32),
                         offset=offset.astype(np.float32), ordered_by=concepts.target)


@dataclass(frozen=True)
class TargetMaps:
    """The maps of one target over one input (`target_maps`)."""

    target: dict  # the target's `record`
    text: str  # the target as figure titles name it (`Target.text`)
    score: float  # the explained score of the input (SAE activation or concept coefficient, summed over patches)
    maps: dict[str, np.ndarray | None]  # method -> (grid_h, grid_w) float64; None: the model's LRP cannot follow
    gradcam_layer: int  # the block whose output Grad-CAM read
    legrad_layers: tuple[int, ...]  # the blocks LeGrad averaged over

    def record(self) -> dict:
        """The JSON object of these maps: the target, its score, the blocks read and each map rounded (`rounded`)."""
        return {"target": self.target, "score": round(self.score, 6), "gradcam_block": self.gradcam_layer,
                "legrad_blocks": list(self.legrad_layers)} | {name: rounded(v) for name, v in self.maps.items()}


def legrad_blocks(layer: int) -> tuple[int, ...]:
    """The blocks LeGrad averages over for a target at block ``layer``: the `LEGRAD_LAYERS` ending there."""
    return tuple(range(max(0, layer - LEGRAD_LAYERS + 1), layer + 1))


def target_maps(handle: ViTHandle, pixels: torch.Tensor, target: Target, methods: tuple[str, ...] = TARGET_METHODS,
                gradcam_layer: int | None = None) -> TargetMaps:
    """The maps ``methods`` (of `TARGET_METHODS`) of ``target``'s score for the (1, 3, H, W) normalised model
    input ``pixels``, from one forward and the backwards of the module docstring. ``gradcam_layer``: the block
    whose output Grad-CAM reads, 0 to the target's block (default that block); an `InputError` otherwise."""
    unknown = [m for m in methods if m not in TARGET_METHODS]
    if unknown:
        raise InputError(f"A target is explained by {', '.join(TARGET_METHODS)}; not by {', '.join(unknown)}.")
    top = checked_layer(target.layer, handle.depth)
    cam_layer = top if gradcam_layer is None else checked_layer(gradcam_layer, handle.depth)
    if cam_layer > top:
        raise InputError(f"Grad-CAM of a target at block {top} reads a block up to {top}, not block {cam_layer}.")
    layout = handle.layout(tuple(pixels.shape[-2:]))
    blocks = legrad_blocks(top)
    pixels = pixels.detach().to(handle.device).requires_grad_(True)
    with (torch.enable_grad(), capture_attention(handle, activation_layers=(), keep_attention=True) as rec,
          (relevance_rules(handle) if "attnlrp" in methods else nullcontext()) as lrp,
          recording_blocks(handle, sorted({top, cam_layer, *blocks}), detach=False) as outputs):
        handle.forward(pixels)
    try:
        score = target.score(outputs[top], layout)[0]
        maps: dict[str, np.ndarray | None] = {}
        if "attnlrp" in methods:
            maps["attnlrp"] = None
            with suppress(UnsupportedModelError):  # an attention the rules cannot follow: no map
                relevance = lrp.attnlrp(score, pixels)[0].float().cpu().numpy()  # (3, H, W)
                maps["attnlrp"] = patch_relevance(relevance, layout)
        if "legrad" in methods:
            attention = rec.attention_tensors()
            grads = [torch.autograd.grad(target.score(outputs[b], layout)[0], attention[b], retain_graph=True)[0][0]
                     for b in blocks]  # each (heads, N, N)
            maps["legrad"] = legrad_map(torch.stack(grads).float().cpu().numpy(), layout)
        if "gradcam" in methods:
            tokens = outputs[cam_layer]
            grad, = torch.autograd.grad(score, tokens, retain_graph=True)
            maps["gradcam"] = gradcam_from_tokens(tokens[0].detach().float().cpu().numpy(),
                                                  grad[0].float().cpu().numpy(), layout)
        maps = {name: maps[name] for name in TARGET_METHODS if name in maps}  # in one order for records and figures
        return TargetMaps(target=target.record(), text=target.text(), score=float(score.detach()), maps=maps,
                          gradcam_layer=cam_layer, legrad_layers=blocks)
    finally:
        rec.clear()


def input_pixels(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes | torch.Tensor,
                 options: PassOptions = PassOptions()) -> torch.Tensor:
    """(1, 3, H, W) normalised model input: ``image`` as `analyze_image` makes it of ``options`` (input size,
    geometry, limits), or pixels given as they are ((1, 3, H, W) or (3, H, W), already normalised)."""
    if isinstance(image, torch.Tensor):
        pixels = image[None] if image.ndim == 3 else image
        if pixels.ndim != 4 or pixels.shape[:2] != (1, 3):
            raise InputError(f"Pixels are one (1, 3, H, W) input, not shape {tuple(image.shape)}.")
        return pixels
    picture = image if isinstance(image, Image.Image) else load_image(image, options.limits)
    return model_input(handle, picture, options.input_size, options.geometry)[0]


def feature_target(handle: ViTHandle, sae: SparseAutoencoder, feature: int, name: str | None = None) -> FeatureTarget:
    """The `FeatureTarget` of feature ``feature``, once the SAE is checked to fit ``handle``'s model (`check_fits`:
    width, block, model); ``name`` (a file name or path) names the SAE in records, titles and errors."""
    label = Path(name).name if name else "SAE"
    check_fits(sae, handle.name, handle.depth, handle.embed_dim, label if name else "this SAE")
    return FeatureTarget(sae, feature, label)


def explain_feature(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes | torch.Tensor,
                    sae: SparseAutoencoder, feature: int, method: str = "gradcam", *, name: str | None = None,
                    gradcam_layer: int | None = None, options: PassOptions = PassOptions()) -> np.ndarray | None:
    """The (grid_h, grid_w) float64 ``method`` map ("gradcam", "legrad" or "attnlrp") of SAE feature
    ``feature``'s summed activation over the patch tokens of ``image`` (a picture, as `analyze_image` takes it,
    or normalised pixels): `target_maps` of a `FeatureTarget`, in units of the SAE's activation. None for
    AttnLRP on a model whose attention its rules cannot follow. The SAE must fit the model (`feature_target`);
    ``name`` names it. One forward and one backward (LeGrad: one short backward per block it reads)."""
    target = feature_target(handle, sae, feature, name)
    return target_maps(handle, input_pixels(handle, image, options), target, (method,), gradcam_layer).maps[method]

"""One pass per image: a single forward with capture and a single backward feed every method.

`analyze_image` returns an `ImageAnalysis` of plain, compact arrays (attention as per-layer queries and
keys in float16, see `attention_store`). Raw attention and rollout for any option are rebuilt from it
without the model; mean attention distance is computed in the pass;
Grad-CAM (every layer) and gradient-weighted attention are computed during the pass for the target.
`model_report` and `dataset_attention_distance` are the model-level and folder-level analyses.
"""
from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis import legrad_map, patch_relevance
from vit_inspect.core.errors import UnsupportedModelError, VitInspectError
from vit_inspect.core.geometry import InputGeometry, check_input_size, prepare, seen_box, warn_if_blurred
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import load_image, preview_rgb
from vit_inspect.core.open_clip_models import prompt_view, score_factor, score_kind
from vit_inspect.core.prompts import Prompt
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.attention_store import HALF_PASS_TOLERANCE, TOLERANCE, keeps_maps, query_vector
from vit_inspect.passes.block_tokens import keeps_block_tokens, stacked_patch_tokens
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.gradient_rollouts import KEEP_FRACTION, gradient_rollouts
from vit_inspect.passes.head_pass import HeadStatsStream, build_head_pass
from vit_inspect.passes.layer_stream import LayerStream
from vit_inspect.passes.relevance import relevance_rules
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.spill import worth_spilling
from vit_inspect.passes.threads import blas_one_thread, in_background

LEGRAD_LAYERS = 4  # LeGrad over the last 4 blocks, as the reference (torchcam) runs it
LEGRAD_CLIP_LAYERS = 2  # of a CLIP-style tower: the last 2, as LeGrad's own package does (LeWrapper(layer_index=-2))


def legrad_layers(handle: ViTHandle) -> range:
    """The blocks LeGrad averages over: the last LEGRAD_CLIP_LAYERS of a CLIP-style tower, else LEGRAD_LAYERS."""
    return range(handle.depth)[-(LEGRAD_CLIP_LAYERS if handle.clip is not None else LEGRAD_LAYERS):]


def readout_query(handle: ViTHandle) -> str:
    """The token the head reads: the class token, or the mean of patch tokens for pooled models."""
    return "class" if handle.global_pool == "token" and handle.has_class_token else "mean"


def autocast_dtype(device: torch.device) -> torch.dtype:
    """Half precision for `autocast=True`: float16 on CUDA, bfloat16 on CPU (CPU float16 is slow)."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def analyze_image(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes,
                  target: int | str | Prompt | None = None, options: PassOptions = PassOptions(), *,
                  contrast: int | str | Prompt | None = None, **settings) -> ImageAnalysis:
    """Run one forward pass with attention capture and, for models with a head, one backward pass
    from the logit of `target` (default: the top prediction).

    How the pass runs is ``options`` (`PassOptions`: input size, gradients, half precision, image limits,
    geometry, relevance, score, spill), whose defaults are the app's, the CLI's and the notebook's; keyword
    ``settings`` named as its fields replace those of ``options`` for this call
    (``analyze_image(handle, image, relevance=False)`` is ``options=PassOptions(relevance=False)``).

    A prompt is a target too: for a CLIP-style model (`core.open_clip_models`) ``target`` and ``contrast`` may be
    text (or a `Prompt`), which become columns of its zero-shot head (`prompt_view`), and every gradient method
    explains ``score``: by default for such a model the cosine similarity cos(f, t) of the image and text
    embeddings (the column's logit s·cos + b divided by s), or with ``score="logit"`` the logit itself;
    with a contrast, the difference of the two. The probabilities (`probs`) stay those of the zero-shot labels.

    Grad-CAM is taken at the first LayerNorm of every block (patch tokens only: at the final output
    only the class token reaches the head, so patch tokens get no gradient there); the last block's
    is the usual choice. Gradient-weighted attention follows Chefer et al. 2021, Eq. 5-6.
    LeGrad (last `LEGRAD_LAYERS` blocks, the model's own readout) takes one short backward per layer
    through that block only; AttnLRP takes one more, modified, backward to the pixels over the same graph
    (`vit_inspect.passes.relevance`): the rules change only the backward, so no second forward is needed.
    With ``relevance=False`` neither runs (no LRP hooks either): the pass is one forward and one ordinary
    backward, at the floor of any gradient method; `add_relevance` adds the two maps to such a result
    later (one more forward, `relevance_maps`).
    `autocast=True` runs the pass under `torch.autocast` in half precision (`autocast_dtype`); the
    maps then agree with float32 to the tolerance stated in tests/passes/test_pipeline.py.
    The last block's output patch tokens are kept too (`patch_features`, for the DINOv2-style feature PCA), and
    where they are small every block's (`block_tokens`, for concepts and patch similarity at any block).

    ``geometry`` chooses what the model sees (`geometry.InputGeometry`: the model's crop, the whole image
    squashed, or the whole image with its aspect ratio on a non-square grid); without it, the model's
    crop at `input_size`. With `contrast`, the backward pass starts from logit[target] - logit[contrast]
    ("why target and not contrast?"). For vit-explain's gradient rollout the result keeps the head-fused
    gradient-weighted attention (`analysis.gradient_fused_attention`, float16) while it is no larger than
    the attention store, and otherwise the rollout for every option the app offers (`gradient_rollouts`).

    A pass whose float16 maps are small in bytes (`attention_store.keeps_maps`, e.g. DeiT-Ti at 224 px)
    keeps them as they are, with no Q/K, check or spill. Otherwise a model whose maps are dear to rebuild
    (`spill.worth_spilling`: heads * N >= 0.015 D^2, e.g. DeiT-Ti at 448 px, DINOv2-S/14 and -L/14 at 518 px)
    also writes every layer's maps with their heads fused (sum, maximum and minimum, `spill.PLANES`) to a file
    in ``options.spill`` (by default the process's own temporary folder, `spill.shared_folder`; None: nowhere),
    and the result's rollout redraws read them instead of rebuilding and fusing every head from q and k
    (`AttentionStore.spill`).
    """
    options = options.replace(**settings)
    with blas_one_thread(), torch.enable_grad():  # the backward needs it even when called under no_grad
        return _analyze_image(handle, image, target, contrast, options)


def analyze_pixels(handle: ViTHandle, pixels: torch.Tensor, target: int | None = None,
                   options: PassOptions = PassOptions(), *, contrast: int | None = None, **settings) -> ImageAnalysis:
    """`analyze_image` of a model input given as it is: (1, 3, H, W) or (3, H, W) pixels already normalised
    with the model's mean and std (e.g. ``handle.preprocess.apply(picture)[0]`` plus a perturbation), H and W
    whole patches. The same pass, so the same maps as ``analyze_image`` of the picture they came from; the
    result's `rgb` is the input denormalised and rounded to uint8 (for display only), with no preview.
    Of ``options`` (and ``settings``, as for `analyze_image`) it reads gradients, autocast, relevance and score;
    the input is given, so its size, geometry and limits do not apply, and it never spills (its callers, the
    studies, run many passes and redraw none)."""
    options = options.replace(**settings)
    pixels = pixels[None] if pixels.ndim == 3 else pixels
    if pixels.ndim != 4 or pixels.shape[:2] != (1, 3):
        raise VitInspectError(f"analyze_pixels takes one (1, 3, H, W) input, got shape {tuple(pixels.shape)}.")
    size = (int(pixels.shape[2]), int(pixels.shape[3]))
    check_input_size(handle, size)
    rgb = handle.preprocess.to_rgb(pixels)
    handle, target, contrast, prompt, versus = prompt_view(handle, target, contrast)
    with blas_one_thread(), torch.enable_grad():
        return _analyze_input(handle, pixels.detach(), rgb, (0.0, 0.0, float(size[1]), float(size[0])), None,
                              (size[1], size[0]), "crop", target, contrast, options.replace(spill=None),
                              prompt=prompt, versus=versus)


def _analyze_image(handle, image, target, contrast, options: PassOptions) -> ImageAnalysis:
    handle, target, contrast, prompt, versus = prompt_view(handle, target, contrast)
    picture = image if isinstance(image, Image.Image) else load_image(image, options.limits)
    picture.load()  # here, once: the two resamplings below read it side by side and must not load it themselves
    warn_if_blurred(picture.size, handle.patch_size, stacklevel=4)  # the caller of analyze_image
    # the preview of the whole upload and the model's input are two Pillow resamplings, which let go of the GIL:
    # they run side by side on two cores, before torch's threads start (DeiT-Ti: 2.4 + 3.7 ms -> 3.7)
    preview = in_background(preview_rgb, picture, PREVIEW_SIDE)
    pixels, rgb, box = model_input(handle, picture, options.input_size, options.geometry)
    preview = preview()
    return _analyze_input(handle, pixels, rgb, box, preview, picture.size,
                          "crop" if options.geometry is None else options.geometry.mode, target, contrast, options,
                          prompt, versus)


class _RowSinks:
    """`capture.RowSink` of the pass: each block of rows to the layer stream and the head statistics."""

    def __init__(self, *sinks) -> None:
        self.sinks = sinks

    def on_rows(self, layer: int, start: int, block: torch.Tensor) -> None:
        """Each sink's `on_rows`."""
        for sink in self.sinks:
            sink.on_rows(layer, start, block)

    def on_layer_done(self, layer: int) -> None:
        """Each sink's `on_layer_done`."""
        for sink in self.sinks:
            sink.on_layer_done(layer)


def _analyze_input(handle, pixels, rgb, box, preview, source_size, geometry_mode, target, contrast,
                   options: PassOptions, prompt=None, versus=None) -> ImageAnalysis:
    """The pass itself, on the model input `pixels` (1, 3, H, W) whose uint8 picture is `rgb`; ``handle``,
    ``target`` and ``contrast`` as `prompt_view` gives them, ``prompt`` and ``versus`` the texts behind them."""
    gradients, autocast, relevance = options.gradients, options.autocast, options.relevance
    kind = score_kind(handle, options.score)
    factor = score_factor(handle, kind)
    layout = handle.layout(rgb.shape[:2])
    use_grad = gradients and handle.has_head
    pixels = pixels.to(handle.device).requires_grad_(use_grad)  # graph exists even for frozen weights
    layers = range(handle.depth) if use_grad else ()
    spilled = None
    small = keeps_maps(handle.depth, handle.num_heads, layout.num_tokens)  # the maps kept: no Q/K, no spill
    if not small and worth_spilling(layout.num_tokens, handle.embed_dim, handle.num_heads):
        folder = options.spill_folder()
        spilled = None if folder is None else folder.reserve((handle.depth, layout.num_tokens, layout.num_tokens))
    stream = LayerStream(handle, layout, HALF_PASS_TOLERANCE if autocast else TOLERANCE, spill=spilled,
                         keep_maps=small, held_by_autograd=use_grad)
    stats = HeadStatsStream(handle.depth, layout, entropy=False)  # the entropy: from the store on first read

    def on_attention(layer: int, probs: torch.Tensor) -> None:  # per-layer reductions as the pass goes
        stream.on_attention(layer, probs)
        stats.on_attention(layer, probs)

    # a pass without gradients on the CPU that keeps Q and K: each layer's attention is computed and reduced a
    # block of query rows at a time, in the cache, instead of as whole maps (`capture.blocked_attention`)
    by_rows = (_RowSinks(stream, stats) if not use_grad and not small and not autocast and handle.device.type == "cpu"
               else None)

    # without gradients each layer's maps are reduced and dropped as the pass goes; with them, capture keeps
    # the per-layer tensors for the backward (never a stacked copy)
    with (torch.set_grad_enabled(use_grad), stream.hooks(),
          capture_attention(handle, activation_layers=layers, residual=True, keep_attention=use_grad,
                            on_attention=on_attention, rows=by_rows) as rec,
          (relevance_rules(handle) if relevance and use_grad else nullcontext()) as lrp,
          torch.autocast(handle.device.type, dtype=autocast_dtype(handle.device), enabled=autocast)):
        logits = handle.forward(pixels)  # (1, num_classes) or (1, D)
    # (P, D) float16, rounded once by torch (numpy's float32 -> float16 conversion is 8x slower)
    features = layout.patches(rec.residual(handle.depth - 1)[0], axis=0).float().to(torch.float16).cpu().numpy()
    blocks = (stacked_patch_tokens([rec.residual(i) for i in range(handle.depth)], layout)
              if keeps_block_tokens(handle.depth, layout.num_patches, handle.embed_dim) else None)  # (depth, P, D)
    # over the labels: a CLIP-style model's prompt columns follow its zero-shot labels and are not among them
    probs = (logits.detach()[0, :len(handle.labels)].float().softmax(-1).cpu().numpy() if handle.has_head
             else np.zeros(0, np.float32))
    query = readout_query(handle)
    store = stream.store()
    chosen = gradcam = chefer = first_order = legrad = attnlrp = gradient = None
    if use_grad:
        chosen = int(np.argmax(probs)) if target is None else int(target)
        for index in (chosen, contrast):
            if index is not None and not 0 <= index < logits.shape[-1]:
                raise VitInspectError(f"Class {index} is out of range: the model has classes 0 to {len(probs) - 1}.")
        if contrast is not None and contrast == chosen:
            raise VitInspectError("The contrast class is the target class itself; choose another class to compare.")
        if lrp is not None:
            legrad, attnlrp = _relevance_of_pass(handle, lrp, rec, logits, pixels, chosen, layout, factor)
        explained = logits[0, chosen] if contrast is None else logits[0, chosen] - logits[0, contrast]
        rec.backward(explained.float() * factor)
        logits = logits.detach()  # the graph is no longer needed
        keep_stack = handle.depth * layout.num_tokens ** 2 * 2 <= KEEP_FRACTION * store.nbytes()
        reduced = gradient_reductions(rec, layout, query, fused=keep_stack)
        chefer, first_order = reduced.chefer.astype(np.float32), reduced.first_order
        gradient = gradient_rollouts(reduced.fused.__getitem__ if keep_stack else partial(gradient_fused_layer, rec),
                                     handle.depth, layout, query, keep_stack=keep_stack)
        gradcam = gradcam_of_pass(rec, layers, layout)
    heads = build_head_pass(handle, rec, logits, None, stats.prefix_share(), first_order,
                            tolerance=5e-2 if autocast else 1e-3, store=store)
    rec.clear()  # the per-layer maps, gradients and residual stream go now, before the result is kept
    return ImageAnalysis(
        model_name=handle.name, layout=layout, rgb=rgb, probs=probs.astype(np.float32),
        attention_store=store, mean_distance=stream.mean_distance(),
        target=chosen, gradcam=gradcam, chefer=chefer, readout=query, heads=heads, legrad=legrad, attnlrp=attnlrp,
        patch_features=features.reshape(layout.grid_h, layout.grid_w, -1),
        contrast=contrast if use_grad else None, gradient=gradient,
        geometry=geometry_mode, seen_box=box, preview=preview, source_size=source_size, prompt=prompt, versus=versus,
        score=kind, block_tokens=blocks)


def model_input(handle: ViTHandle, picture: Image.Image, input_size: tuple[int, int] | None = None,
                geometry: InputGeometry | None = None) -> tuple[torch.Tensor, np.ndarray, tuple]:
    """(pixels (1, 3, H, W), the (H, W, 3) uint8 crop the model sees, the box of the upload it shows): the
    model's crop at `input_size` without `geometry`, otherwise `geometry.prepare`'s input; an input size the
    model cannot take is refused with a sentence (`check_input_size`)."""
    if input_size is not None:
        check_input_size(handle, input_size)
    if geometry is None:
        pixels, rgb = handle.preprocess.apply(picture, input_size)
        return pixels, rgb, seen_box(handle.preprocess, picture.size, rgb.shape[:2])
    return prepare(handle.preprocess, picture, geometry, handle.patch_size, input_size)


def _relevance_of_pass(handle: ViTHandle, lrp, rec, logits: torch.Tensor, pixels: torch.Tensor, chosen: int,
                       layout: TokenLayout, factor: float = 1.0) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(LeGrad, AttnLRP) grid maps of class `chosen` from a forward run inside `relevance_rules` and
    `capture_attention`, its graph kept; None for a map this model's readout or attention cannot follow.
    ``factor`` (`score_factor`) turns the logit into the explained score: both maps are linear in it."""
    legrad = attnlrp = None
    with suppress(UnsupportedModelError):  # a readout or attention LeGrad/AttnLRP cannot follow: maps absent
        grads = lrp.legrad_gradients(rec.attention_tensors(), chosen, legrad_layers(handle))[:, 0]
        legrad = (legrad_map(grads.float().cpu().numpy(), layout) * factor).astype(np.float32)
    with suppress(UnsupportedModelError):
        attnlrp = patch_relevance(lrp.attnlrp(logits[0, chosen].float() * factor, pixels)[0].float().cpu().numpy(),
                                  layout).astype(np.float32)
    return legrad, attnlrp


def relevance_maps(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes, target: int | str | Prompt,
                   options: PassOptions = PassOptions(), **settings) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(LeGrad, AttnLRP) (grid_h, grid_w) float32 maps of class `target` for the input `analyze_image`
    makes of the same options (input size, autocast, limits, geometry, score; ``settings`` as there): one
    forward inside `relevance_rules` (attention kept for LeGrad), the LeGrad block backwards and the AttnLRP
    backward, exactly as ``analyze_image(relevance=True)`` computes them. (None, None) for a model without a
    head; None for a map the model's readout cannot follow."""
    options = options.replace(**settings)
    autocast = options.autocast
    handle, target, _, _, _ = prompt_view(handle, target)
    factor = score_factor(handle, score_kind(handle, options.score))
    if not handle.has_head:
        return None, None
    picture = image if isinstance(image, Image.Image) else load_image(image, options.limits)
    pixels, rgb, _ = model_input(handle, picture, options.input_size, options.geometry)
    layout = handle.layout(rgb.shape[:2])
    pixels = pixels.to(handle.device).requires_grad_(True)
    with (torch.enable_grad(), capture_attention(handle, activation_layers=(), keep_attention=True) as rec,
          relevance_rules(handle) as lrp,
          torch.autocast(handle.device.type, dtype=autocast_dtype(handle.device), enabled=autocast)):
        logits = handle.forward(pixels)
    if not 0 <= int(target) < logits.shape[-1]:
        raise VitInspectError(f"Class {target} is out of range: the model has classes 0 to {logits.shape[-1] - 1}.")
    try:
        return _relevance_of_pass(handle, lrp, rec, logits, pixels, int(target), layout, factor)
    finally:
        rec.clear()


def add_relevance(handle: ViTHandle, result: ImageAnalysis, image: Image.Image | str | os.PathLike | bytes,
                  options: PassOptions = PassOptions(), **settings) -> ImageAnalysis:
    """``result`` (from ``analyze_image(relevance=False)`` of the same image and options) with its LeGrad
    and AttnLRP maps for its target (`relevance_maps`: one more forward; the score is the result's). The
    result itself is unchanged."""
    if result.target is None:
        return result
    legrad, attnlrp = relevance_maps(handle, image, result.prompt or result.target,
                                     options.replace(**settings, score=result.score))
    if legrad is not None and legrad.shape != (result.layout.grid_h, result.layout.grid_w):
        raise VitInspectError("The image given does not match this result's input; analyse it again.")
    return dataclasses.replace(result, legrad=legrad, attnlrp=attnlrp)  # the same store and rollout cache


PREVIEW_SIDE = 448  # pixels: longer side of the whole-upload preview kept with a result


@dataclass(frozen=True)
class GradientReductions:
    """What the gradient methods need from every layer's maps and their gradients, reduced in the pass."""

    chefer: np.ndarray  # (grid_h, grid_w) float64 Chefer et al. 2021 relevance of the readout query
    first_order: np.ndarray  # (depth, heads) float32 first-order head importance, logits
    fused: list[np.ndarray] | None  # depth x (N, N) float16 G_l of vit-explain's gradient rollout; None if not asked


def gradient_reductions(rec, layout: TokenLayout, query, fused: bool = True) -> GradientReductions:
    """Chefer relevance, first-order head importance and vit-explain's fused G_l from a recorder after its
    backward pass, in torch, one layer at a time from the last: with W_l = A_l * dy/dA_l (heads, N, N,
    float32, formed once per layer),

    - first order: sum_ij W_lh,ij per head (torch's cascaded float32 sum; `analysis.first_order_importance`,
      Michel et al. 2019 Eq. 2);
    - Chefer et al. 2021 Eq. 5-6: R = prod_l (I + E_h[W_l^+]) (`analysis.chefer_matrix`), read out as the
      query's row, v^T R with v the readout weights (`query_vector`): v <- v + v E_h[W_l^+] in float32 from
      the last layer down, N^2 operations per layer instead of the N^3 product;
    - G_l = max(0, E_h W_l) (`analysis.gradient_fused_attention`), kept in float16 (torch's single
      rounding from float32; numpy's conversion of float16 subnormals alone cost DeiT-Ti's pass 25 ms).

    The head means E_h are float32 products (1/heads ... 1/heads) @ W_l viewed as (heads, N^2): one matrix
    product each, 2.6x faster than torch's mean over the first axis on a CPU. Equal to the stacked numpy
    definitions (float64) to float32 rounding, G to one float16 unit in the last place (tests/passes/test_pipeline.py,
    tests/passes/test_gradient_rollouts.py); never holds more than one layer's (heads, N, N) product. Everything
    stays on the model's device until the three results cross to the host, once each; ``fused=False`` leaves
    G out (a result that keeps per-option rollouts instead, `gradient_rollouts`)."""
    depth = len(rec.attention_tensors())
    vector: torch.Tensor | None = None  # (N,) float32 v, on the maps' device
    first_order, stack = [None] * depth, [None] * depth
    with torch.no_grad():
        for layer in reversed(range(depth)):
            weighted = _weighted_attention(rec, layer)  # (heads, N, N) W_l, on the maps' device
            heads, num_tokens = weighted.shape[0], weighted.shape[-1]
            flat = weighted.view(heads, num_tokens * num_tokens)
            if vector is None:
                vector = torch.from_numpy(query_vector(layout, query)).to(weighted.device, torch.float32)
            head_mean = weighted.new_full((1, heads), 1.0 / heads)
            first_order[layer] = flat.sum(-1)
            if fused:
                stack[layer] = (head_mean @ flat).view(num_tokens, num_tokens).clamp_(min=0).to(torch.float16)
            positive = (head_mean @ flat.clamp_(min=0)).view(num_tokens, num_tokens)  # E_h[W_l^+]
            vector = vector + vector @ positive
        # to the host once each: the (depth, N, N) float16 G, the (depth, heads) sums and the readout row
        fused_host = list(torch.stack(stack).cpu().numpy()) if fused else None
        first_order_host = torch.stack(first_order).cpu().numpy().astype(np.float32)
        chefer = layout.to_grid(layout.patches(vector.double().cpu().numpy()))
    return GradientReductions(chefer=chefer, first_order=first_order_host, fused=fused_host)


def gradcam_of_pass(rec, layers: range, layout: TokenLayout) -> np.ndarray:
    """(depth, grid_h, grid_w) float32 Grad-CAM of every block from a recorder after its backward pass:
    `analysis.gradcam_from_tokens` (Selvaraju et al. 2017, Eq. 1-2 on the patch tokens, in float64) computed in
    torch on the model's device, layer by layer, and copied to the host once."""
    with torch.no_grad():
        maps = torch.stack([
            layout.patches(rec.activation(i)[0], axis=0).double()  # (P, D)
            @ layout.patches(rec.activation_grad(i)[0], axis=0).double().mean(0)  # (D,) channel weights alpha_d
            for i in layers]).cpu().numpy()  # (depth, P) float64
    return np.stack([layout.to_grid(row) for row in maps]).astype(np.float32)


def _weighted_attention(rec, layer: int) -> torch.Tensor:
    """(heads, N, N) float32 W_l = A_l * dy/dA_l of image 0 from a recorder after its backward pass, on the
    device of the maps: on a GPU only the (N, N) reductions of `gradient_reductions` cross to the CPU, not
    2 x heads x N^2 float32 per layer (ViT-L/16 at 384: 42 MB a layer)."""
    with torch.no_grad():
        attention = rec.attention_tensors()[layer][0].detach().float()
        return attention * rec.attention_grad_tensors()[layer][0].detach().float()


def gradient_fused_layer(rec, layer: int) -> np.ndarray:
    """(N, N) float64 G_l = max(0, mean_h(A_lh * dy/dA_lh)) of one layer from a recorder after its backward
    pass (`analysis.gradient_fused_attention` for that layer, from float32 products as in
    `gradient_reductions`), never the (depth, heads, N, N) stacks."""
    return _weighted_attention(rec, layer).mean(0).clamp_(min=0).cpu().double().numpy()



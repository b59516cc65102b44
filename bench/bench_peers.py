"""The full pass (``analyze_image(relevance=True)``: attention, rollout, Grad-CAM, gradient-weighted attention,
LeGrad and AttnLRP from one forward) against the peers' own code for the three gradient maps that have one, each
run as its package documents it, on the same weights and the same preprocessed image, timed side by side:

- Grad-CAM: pytorch-grad-cam's `GradCAM` at the last block's first LayerNorm, class token dropped;
- LeGrad: torchcam's `LeGrad` over the last four blocks, read out through the class token;
- AttnLRP: lxt's efficient AttnLRP for torchvision's ViT (its CP-LRP patches of GELU, LayerNorm and attention)
  with zennit's Gamma rule on the Linear layers (γ 0.25 on the patch convolution, 0.1 elsewhere), relevance =
  input × gradient summed over the colour channels.

The peers need torchvision's `VisionTransformer`, so the timm weights are copied into one of the same shape
(DeiT-Ti/16: 12 blocks, width 192, 3 heads), and its logits are checked against timm's before timing. Each peer
map is checked against ours (Spearman ρ), so that both sides compute the same maps. lxt patches
`torch.nn.GELU`, `LayerNorm` and `MultiheadAttention` for the whole process; the patches are applied only around
the AttnLRP call and undone after it, so the other candidates run the original classes.

The peers are not requirements of the project; install them beside it, without their dependencies (lxt's
module for Hugging Face models does not import with this transformers, so only its torchvision patches are
loaded, straight from their files):

    pip install --no-deps lxt==2.1 zennit==0.5.1 torchcam==0.5.0
    python -m bench.bench_peers [--weights checkpoints/deit_tiny_patch16_224.safetensors] [--repeats 15]

The ratio "full pass ÷ the peers' three" divides our pass's median by the sum of the three peers' medians;
the candidates run round-robin (`bench.common.measure`), so a change of load hits them alike.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_inspect.core.load import load_model
from vit_inspect.passes.pipeline import analyze_image

from .common import (
    REPO,
    measure,
    plain_forward_input_backward,
    print_header,
    report,
    set_threads,
)

TARGET = 1.3  # the full pass may cost at most this many times the peers' three methods
CONV_GAMMA, LINEAR_GAMMA = 0.25, 0.1  # AttnLRP's Gamma rules, as vit_inspect.passes.relevance.LRPRules
LEGRAD_LAYERS = 4


def torchvision_twin(timm_model: torch.nn.Module) -> torch.nn.Module:
    """torchvision's `VisionTransformer` of the same shape as a timm ViT with a class token and no registers,
    holding its weights (the key names mapped one to one)."""
    from torchvision.models.vision_transformer import VisionTransformer

    blocks = timm_model.blocks
    width = timm_model.embed_dim
    twin = VisionTransformer(image_size=timm_model.patch_embed.img_size[0],
                             patch_size=timm_model.patch_embed.patch_size[0], num_layers=len(blocks),
                             num_heads=blocks[0].attn.num_heads, hidden_dim=width,
                             mlp_dim=blocks[0].mlp.fc1.out_features, num_classes=timm_model.num_classes)
    ours = timm_model.state_dict()
    theirs = {"class_token": ours["cls_token"], "encoder.pos_embedding": ours["pos_embed"],
              "conv_proj.weight": ours["patch_embed.proj.weight"], "conv_proj.bias": ours["patch_embed.proj.bias"],
              "encoder.ln.weight": ours["norm.weight"], "encoder.ln.bias": ours["norm.bias"],
              "heads.head.weight": ours["head.weight"], "heads.head.bias": ours["head.bias"]}
    for i in range(len(blocks)):
        block, layer = f"blocks.{i}.", f"encoder.layers.encoder_layer_{i}."
        for timm_name, tv_name in (("norm1", "ln_1"), ("norm2", "ln_2"), ("attn.qkv", "self_attention.in_proj"),
                                   ("attn.proj", "self_attention.out_proj"), ("mlp.fc1", "mlp.0"),
                                   ("mlp.fc2", "mlp.3")):
            joint = "_" if tv_name.endswith("in_proj") else "."
            for part in ("weight", "bias"):
                theirs[f"{layer}{tv_name}{joint}{part}"] = ours[f"{block}{timm_name}.{part}"]
    twin.load_state_dict(theirs, strict=True)
    return twin.eval()


def _lxt_patches() -> types.ModuleType:
    """lxt's torchvision patches (`lxt.efficient.patches`), loaded without `lxt.efficient.__init__`, which imports
    its Hugging Face models and fails with this transformers."""
    import lxt

    folder = Path(lxt.__file__).parent / "efficient"
    package = types.ModuleType("lxt.efficient")
    package.__path__ = [str(folder)]
    sys.modules.setdefault("lxt.efficient", package)
    return importlib.import_module("lxt.efficient.patches")


@contextmanager
def lxt_attnlrp(model: torch.nn.Module, gamma: bool = True) -> Iterator[None]:
    """lxt's CP-LRP patches of torch.nn.GELU, LayerNorm and MultiheadAttention (as its `vit_torch.cp_LRP` map)
    and, with ``gamma``, zennit's Gamma composite on the model, for the duration of the block; the classes' own
    forwards after. Without ``gamma`` the Linear layers pass the plain gradient (LRP-0): a cheaper, other map."""
    from zennit.composites import LayerMapComposite
    from zennit.rules import Gamma

    patches = _lxt_patches()
    zennit_patches = importlib.import_module("lxt.efficient.zennit_patches")
    from zennit.core import BasicHook

    classes = {torch.nn.GELU: (patches.non_linear_forward, True), torch.nn.LayerNorm: (patches.layer_norm_forward, False),
               torch.nn.MultiheadAttention: (patches.cp_multi_head_attention_forward, True)}
    saved = {cls: dict(vars(cls)) for cls in classes}
    hook_saved = dict(vars(BasicHook))
    composite = LayerMapComposite([(torch.nn.Conv2d, Gamma(CONV_GAMMA)), (torch.nn.Linear, Gamma(LINEAR_GAMMA))])
    try:
        for cls, (forward, keep) in classes.items():
            patches.patch_method(forward, cls, keep_original=keep)
        zennit_patches.monkey_patch_zennit()
        if gamma:
            composite.register(model)
        yield
    finally:
        if gamma:
            composite.remove()
        for cls, attributes in [*saved.items(), (BasicHook, hook_saved)]:
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name in ("forward", "backward", "original_forward"):
                if name in attributes:
                    setattr(cls, name, attributes[name])


def peer_attnlrp(model: torch.nn.Module, pixels: torch.Tensor, target: int, gamma: bool = True) -> np.ndarray:
    """lxt + zennit AttnLRP: relevance x · ∂*y/∂x at the pixels, summed over channels, (H, W)."""
    x = pixels.detach().clone().requires_grad_(True)
    with lxt_attnlrp(model, gamma):
        model(x)[0, target].backward()
    return (x * x.grad).sum(1)[0].detach().numpy()


def peer_legrad(model: torch.nn.Module, pixels: torch.Tensor, target: int) -> np.ndarray:
    """torchcam's LeGrad over the last four blocks, class-token readout: (grid_h, grid_w)."""
    from torchcam.methods import LeGrad

    def class_token_score(tokens: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, classes)
        return model.heads(model.encoder.ln(tokens[:, 0]))

    with LeGrad(model, list(model.encoder.layers)[-LEGRAD_LAYERS:], score_projection=class_token_score) as cam:
        scores = model(pixels)
        return cam(target, scores)[0][0].detach().numpy()


def peer_gradcam(model: torch.nn.Module, pixels: torch.Tensor, target: int, grid: tuple[int, int]) -> np.ndarray:
    """pytorch-grad-cam's GradCAM at the last block's first LayerNorm, class token dropped: (H, W) in [0, 1]."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    def tokens_to_grid(tokens: torch.Tensor) -> torch.Tensor:  # (B, 1 + P, D) -> (B, D, gh, gw)
        return tokens[:, 1:].reshape(tokens.shape[0], *grid, -1).permute(0, 3, 1, 2)

    with GradCAM(model=model, target_layers=[model.encoder.layers[-1].ln_1], reshape_transform=tokens_to_grid) as cam:
        return cam(input_tensor=pixels, targets=[ClassifierOutputTarget(target)])[0]


def per_patch(pixel_map: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """An (H, W) pixel map summed over each patch: (grid_h, grid_w), as the pass reports AttnLRP."""
    height, width = pixel_map.shape
    return pixel_map.reshape(grid[0], height // grid[0], grid[1], width // grid[1]).sum(axis=(1, 3))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(np.ravel(a), np.ravel(b))[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default=str(REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors"))
    parser.add_argument("--model", default="deit_tiny_patch16_224", help="the timm name the weights are for")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    print_header("The full pass against the peers' three methods")

    handle = load_model(args.model, weights=args.weights, device="cpu")
    twin = torchvision_twin(handle.model)
    picture = Image.open(args.image).convert("RGB")
    pixels, _ = handle.preprocess.apply(picture)
    with torch.no_grad():
        difference = float((twin(pixels) - handle.model(pixels)).abs().max())
    if difference > 1e-3:
        raise SystemExit(f"torchvision's twin gives other logits (largest difference {difference:.2e})")
    result = analyze_image(handle, picture, relevance=True)
    target = int(result.target)
    grid = (result.layout.grid_h, result.layout.grid_w)

    agreement = {  # pytorch-grad-cam's map is upsampled to the pixels (bilinear): compared per patch
        "Grad-CAM": spearman(per_patch(peer_gradcam(twin, pixels, target, grid), grid), result.gradcam[-1]),
        "LeGrad": spearman(peer_legrad(twin, pixels, target), result.legrad),
        "AttnLRP": spearman(per_patch(peer_attnlrp(twin, pixels, target), grid), result.attnlrp),
        "lxt without Gamma": spearman(per_patch(peer_attnlrp(twin, pixels, target, gamma=False), grid),
                                      result.attnlrp)}
    print(f"Logits of the torchvision twin against timm's: largest difference {difference:.1e}. Target class "
          f"{target} ({handle.labels[target]}). Peer map against ours, Spearman ρ: "
          + ", ".join(f"{k} {v:.4f}" for k, v in agreement.items()) + "\n")

    names = {"ours": "ours: analyze_image(relevance=True)", "gradcam": "pytorch-grad-cam GradCAM",
             "legrad": "torchcam LeGrad (last 4 blocks)", "attnlrp": "lxt + zennit AttnLRP",
             "lrp0": "lxt alone, no Gamma rule (LRP-0 on the Linears: another map)",
             "floor": "the floor: forward + input-only backward (timm)"}
    times = measure({
        names["ours"]: lambda: analyze_image(handle, picture, relevance=True),
        names["gradcam"]: lambda: peer_gradcam(twin, pixels, target, grid),
        names["legrad"]: lambda: peer_legrad(twin, pixels, target),
        names["attnlrp"]: lambda: peer_attnlrp(twin, pixels, target),
        names["lrp0"]: lambda: peer_attnlrp(twin, pixels, target, gamma=False),
        names["floor"]: lambda: plain_forward_input_backward(handle.model, pixels, target),
    }, args.repeats)
    peers = sum(times[names[k]].median for k in ("gradcam", "legrad", "attnlrp"))
    ours, floor = times[names["ours"]].median, times[names["floor"]].median
    rows = [(label, times[label].ms(), f"{times[label].median / floor:.2f}") for label in names.values()]
    cheaper = peers - times[names["attnlrp"]].median + times[names["lrp0"]].median
    rows.append(("the peers' three, summed", f"{1e3 * peers:.1f}", f"{peers / floor:.2f}"))
    rows.append(("the same with lxt alone for AttnLRP", f"{1e3 * cheaper:.1f}", f"{cheaper / floor:.2f}"))
    print(report("peers_detail", ("candidate", "median ms (min–max)", "÷ the floor"), rows, key=("candidate",)))
    print()
    ratio = ours / peers
    held = "yes" if ratio <= TARGET else "NO"
    print(report("peers", ("model", "full pass ms", "peers' three ms", "full pass ÷ peers", "target", "held",
                           "÷ peers with lxt alone for AttnLRP"),
                 [(args.model, f"{1e3 * ours:.1f}", f"{1e3 * peers:.1f}", f"**{ratio:.2f}**", f"≤ {TARGET}", held,
                   f"{ours / cheaper:.2f}")], key=("model",)))


if __name__ == "__main__":
    main()

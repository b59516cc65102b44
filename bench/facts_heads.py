"""Not a benchmark: measures the head facts the README quotes for the real DeiT-Ti/16 weights.

1. Logit lens: from which 0-based block on the final class has rank 1 for good (`settled_block`),
   averaged over the shared ImageNet samples (every `--every`-th file).
2. First-order estimate vs real ablation: Spearman's rho over the 36 heads of each image, between
   `HeadPass.first_order` (sum A dy/dA) and `head_importance(mode="zero").logit_drop`.
3. Ablating a whole layer vs one head of it: KL(p || p_ablated) in nats, for every layer.

    python -m bench.facts_heads [--every 1] [--images-for-heads 20]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from vit_inspect.analysis.logit_lens import lens_ranks, settled_block
from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.interventions import ablate_heads
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.ablation import head_importance

from .common import SHARED, set_threads

WEIGHTS = SHARED / "models" / "deit_tiny_patch16_224.safetensors"
SAMPLES = SHARED / "data" / "imagenet_samples"


def lens_blocks(handle: ViTHandle, files) -> list[int | None]:
    """`settled_block` of the final (top) class for each image, from the analysis pass (no gradients)."""
    blocks = []
    for path in files:
        result = analyze_image(handle, path, gradients=False)
        final = int(np.argmax(result.heads.logits))
        blocks.append(settled_block(lens_ranks(result.heads.lens["readout"], final)))
    return blocks


def layer_vs_head_kl(handle: ViTHandle, path) -> tuple[np.ndarray, np.ndarray]:
    """((depth,) KL with the whole layer zero-ablated, (depth, heads) KL with one head zero-ablated), nats."""
    depth, heads = handle.depth, handle.num_heads
    masks = torch.zeros(1 + depth + depth * heads, depth, heads, dtype=torch.bool)
    for layer in range(depth):
        masks[1 + layer, layer] = True
        for head in range(heads):
            masks[1 + depth + layer * heads + head, layer, head] = True
    pixels = handle.preprocess.apply(load_image(path))[0]
    with torch.no_grad(), ablate_heads(handle, masks, "zero"):
        logp = handle.forward(pixels.expand(len(masks), -1, -1, -1)).log_softmax(-1)  # (rows, C)
    kl = (logp[0].exp() * (logp[0] - logp)).sum(-1).numpy()  # (rows,)
    return kl[1:1 + depth], kl[1 + depth:].reshape(depth, heads)


def first_order_rho(handle: ViTHandle, path) -> float:
    result = analyze_image(handle, path)
    importance = head_importance(handle, path, target=result.target, mode="zero", batch_size=37)
    return spearman(result.heads.first_order, importance.logit_drop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="use every n-th sample for the lens")
    parser.add_argument("--images-for-heads", type=int, default=20, help="images for rho and layer-vs-head")
    args = parser.parse_args()
    set_threads()
    handle = load_model("deit_tiny_patch16_224", weights=WEIGHTS, device="cpu")
    files = find_images([SAMPLES])
    print(f"command: python -m bench.facts_heads {' '.join(sys.argv[1:])}".strip())
    lens_files = files[::args.every]
    settled = [b for b in lens_blocks(handle, lens_files) if b is not None]
    before_last = sum(b < handle.depth - 1 for b in settled)
    print(f"lens: {len(lens_files)} images; final class at rank 1 for good from block {np.mean(settled):.2f} on "
          f"average (median block {np.median(settled):.0f}; blocks 0 to {handle.depth - 1}); before block "
          f"{handle.depth - 1}, the last, on {before_last} ({100 * before_last / len(lens_files):.1f}%); "
          f"histogram over blocks 0 to {handle.depth - 1} {np.bincount(settled, minlength=handle.depth).tolist()}")
    head_files = files[::max(1, len(files) // args.images_for_heads)][:args.images_for_heads]
    rhos = [first_order_rho(handle, p) for p in head_files]
    print(f"first-order vs zero ablation, Spearman rho over 36 heads, {len(rhos)} images: mean {np.mean(rhos):.3f}, "
          f"median {np.median(rhos):.3f}, min {np.min(rhos):.3f}, max {np.max(rhos):.3f}")
    wins = total = 0
    for path in head_files:
        layer_kl, head_kl = layer_vs_head_kl(handle, path)
        wins += int((layer_kl > head_kl.max(axis=1)).sum())
        total += handle.depth
    print(f"whole layer vs its single heads (KL, zero ablation): the layer changes the prediction more in "
          f"{wins} of {total} (image, layer) pairs")


if __name__ == "__main__":
    main()

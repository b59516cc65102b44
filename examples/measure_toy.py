"""Measure the trained toy ViT on the 2,000 held-out CIFAR-10 images: is its attention almost uniform?

    OMP_NUM_THREADS=1 python examples/measure_toy.py --weights checkpoints/toy_vit_cifar10.safetensors --zip ZIP

Prints a Markdown report and, with --json, writes the numbers. For each layer:
mean attention distance (ViT paper, Fig. 7 right) against the value uniform attention gives on the 8×8
grid of 4-pixel patches, computed with the same library function on a uniform map; attention entropy
against its maximum ln N; and the entropy of the class token's map over the 64 patches (what the app
draws) against ln 64. The same attention numbers for the untrained toy (random weights, seed 0) are the
baseline. On a subset it also measures how spread each per-image map is (raw attention, rollout, Grad-CAM,
gradient-weighted attention) as exp(entropy) = "effective number of patches" out of 64. Spread is not
faithfulness, so on a subset (`--faithfulness`, every k-th held-out image) it also scores each map with
the library's faithfulness protocol (`vit_inspect.studies.faithfulness.evaluate_image`, the function `vit-inspect
evaluate` maps over a folder): positive/negative perturbation AUC (top-1 accuracy, %, as patches are
removed most/least relevant first; lower/higher is better) and deletion/insertion AUC (probability of the
predicted class; lower/higher is better), mean ± standard error over the images. AttnLRP and LeGrad need
hooks inside timm/HF attention blocks, so a hand-written (`module`) model has neither: they are not rows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # examples/, repo
from train_cifar10 import DEFAULT_OUT, DEFAULT_ZIP, read_zip_split  # noqa: E402

from vit_inspect import analyze_image  # noqa: E402
from vit_inspect.analysis import mean_attention_distance  # noqa: E402
from vit_inspect.core.module_spec import load_model_file  # noqa: E402
from vit_inspect.passes.capture import capture_attention  # noqa: E402
from vit_inspect.jobs.evaluate import format_table  # noqa: E402
from vit_inspect.studies.faithfulness import FaithfulnessAccumulator, evaluate_image  # noqa: E402
from vit_inspect.analysis import AttentionDistanceAccumulator, attention_entropy, distances_per_image  # noqa: E402
from vit_inspect.core.handle import ViTHandle  # noqa: E402

TOY = f"{Path(__file__).resolve().parent / 'toy_vit.py'}:build"


def attention_statistics(handle: ViTHandle, images: np.ndarray, labels: np.ndarray, batch_size: int = 100) -> dict:
    """Accuracy and per-(layer, head) attention distance and entropies over all images, one forward per batch."""
    layout = handle.layout()
    distances = AttentionDistanceAccumulator(layout)
    entropy_sum = np.zeros((handle.depth, handle.num_heads))  # mean over query rows, summed over images
    class_entropy_sum = np.zeros((handle.depth, handle.num_heads))  # class-token row over patches, renormalised
    correct = 0
    for start in range(0, len(images), batch_size):
        rgb = images[start:start + batch_size]
        pixels = torch.cat([handle.preprocess.normalize(image) for image in rgb])  # (B, 3, 32, 32)
        with torch.no_grad(), capture_attention(handle) as rec:
            logits = handle.forward(pixels)  # (B, 10)
        correct += int((logits.argmax(-1).numpy() == labels[start:start + batch_size]).sum())
        attention = [a.float().numpy() for a in rec.attention_tensors()]  # depth x (B, heads, N, N)
        distances.add(np.concatenate([distances_per_image(a[:, None], layout) for a in attention], axis=1))
        for layer, probs in enumerate(attention):
            entropy_sum[layer] += attention_entropy(probs).mean(-1).sum(0)  # (heads,)
            to_patches = layout.patches(probs[:, :, layout.class_token_index, :])  # (B, heads, P)
            to_patches = to_patches / to_patches.sum(-1, keepdims=True)
            class_entropy_sum[layer] += attention_entropy(to_patches).sum(0)
    count = len(images)
    return {"accuracy": correct / count, "num_images": count, "distance": distances.result(),
            "entropy": entropy_sum / count, "class_entropy": class_entropy_sum / count}


def map_spread(handle: ViTHandle, images: np.ndarray) -> dict[str, tuple[float, int]]:
    """Mean exp(entropy) ("effective number of patches") of each per-image map, and how many maps counted.

    Maps are made non-negative as the app draws them (Grad-CAM after its ReLU) and divided by their sum;
    an all-zero map (Grad-CAM with no positive evidence) is left out and counted as missing."""
    spread: dict[str, list[float]] = {"raw attention (last layer, mean of heads)": [], "rollout": [],
                                      "Grad-CAM (last block, ReLU)": [], "gradient-weighted attention": []}
    for rgb in images:
        result = analyze_image(handle, Image.fromarray(rgb))
        maps = dict(zip(spread, (result.attention_map(result.depth - 1), result.rollout(),
                                 np.maximum(result.gradcam[-1], 0), np.maximum(result.chefer, 0))))
        for name, grid_map in maps.items():
            total = float(grid_map.sum())
            if total > 0:
                spread[name].append(float(np.exp(attention_entropy((grid_map / total).ravel()))))
    return {name: (float(np.mean(values)) if values else float("nan"), len(values)) for name, values in spread.items()}


FAITHFULNESS_METHODS = ("random", "attention", "rollout", "gradcam", "chefer")  # random = the floor


def faithfulness(handle: ViTHandle, images: np.ndarray, labels: np.ndarray,
                 methods: tuple[str, ...] = FAITHFULNESS_METHODS, batch_size: int = 512) -> FaithfulnessAccumulator:
    """Per-image faithfulness curves of each map (true label for pos/neg, prediction for del/ins), summed."""
    accumulator = FaithfulnessAccumulator()
    for done, (rgb, label) in enumerate(zip(images, labels), 1):
        accumulator.add(evaluate_image(handle, Image.fromarray(rgb), int(label), methods, batch_size=batch_size))
        print(f"\rfaithfulness: {done}/{len(images)} images", end="" if done < len(images) else "\n",
              file=sys.stderr, flush=True)
    return accumulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default=str(DEFAULT_OUT))
    parser.add_argument("--zip", default=DEFAULT_ZIP, required=DEFAULT_ZIP is None,
                        help="the CIFAR-10 test-split zip (default: $CIFAR10_ZIP)")
    parser.add_argument("--maps", type=int, default=200, help="held-out images (every k-th) for the per-map spread")
    parser.add_argument("--faithfulness", type=int, default=4, metavar="K",
                        help="faithfulness on every K-th held-out image (1: all 2,000; 0: skip)")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)

    images, labels = read_zip_split(args.zip)["heldout"]
    trained = load_model_file(TOY, weights=args.weights, device="cpu")
    torch.manual_seed(0)
    untrained = load_model_file(TOY, device="cpu")
    layout = trained.layout()
    tokens, patches = layout.num_tokens, layout.num_patches
    uniform = np.full((1, 1, tokens, tokens), 1.0 / tokens)  # (depth, heads, N, N): every row uniform
    uniform_distance = float(mean_attention_distance(uniform, layout)[0, 0])
    stats = {"trained": attention_statistics(trained, images, labels),
             "untrained": attention_statistics(untrained, images, labels)}
    step = max(1, len(images) // args.maps)
    spread = map_spread(trained, images[::step][:args.maps])

    t, u = stats["trained"], stats["untrained"]
    print(f"Held-out images: {t['num_images']} (CIFAR-10 test split, 200 per class, never trained on). "
          f"Weights: {Path(args.weights).name}.\n")
    print(f"Accuracy: trained {t['accuracy']:.1%}, untrained {u['accuracy']:.1%} (chance 10%).\n")
    print(f"Grid {layout.grid_h}×{layout.grid_w} of {layout.patch_h}-px patches, N = {tokens} tokens. Uniform "
          f"attention: mean distance {uniform_distance:.2f} px, entropy ln {tokens} = {np.log(tokens):.3f} nats, "
          f"class-token map entropy ln {patches} = {np.log(patches):.3f} nats.\n")
    print("| layer | mean distance, px (heads) | ÷ uniform | entropy, nats (÷ ln N) | class-token map entropy "
          "(÷ ln 64) | untrained: distance ÷ uniform, entropy ÷ ln N |")
    print("| --- | --- | --- | --- | --- | --- |")
    for layer in range(trained.depth):
        heads = " / ".join(f"{d:.1f}" for d in t["distance"][layer])
        mean_d, mean_h, mean_c = t["distance"][layer].mean(), t["entropy"][layer].mean(), t["class_entropy"][layer].mean()
        print(f"| {layer} | {mean_d:.2f} ({heads}) | {mean_d / uniform_distance:.2f} | {mean_h:.3f} "
              f"({mean_h / np.log(tokens):.2f}) | {mean_c:.3f} ({mean_c / np.log(patches):.2f}) | "
              f"{u['distance'][layer].mean() / uniform_distance:.2f}, {u['entropy'][layer].mean() / np.log(tokens):.3f} |")
    print(f"\nSpread of the per-image maps on {len(images[::step][:args.maps])} held-out images (every {step}th), "
          f"as exp(entropy) = effective number of patches out of {patches}:\n")
    print("| map | effective patches (of 64) | maps counted |")
    print("| --- | --- | --- |")
    for name, (value, count) in spread.items():
        print(f"| {name} | {value:.1f} | {count} |")
    faith = None
    if args.faithfulness:
        subset = slice(None, None, args.faithfulness)
        faith = faithfulness(trained, images[subset], labels[subset])
        print(f"\nFaithfulness on {faith.images} held-out images (every {args.faithfulness}th; methods: "
              f"{', '.join(FAITHFULNESS_METHODS)}; mean ± s.e.; pos/neg in %, del/ins as probability):\n")
        print(format_table(faith.table(), faith.images, faith.correct))
    if args.json:
        record = {"faithfulness": None if faith is None else faith.table(),"uniform_distance_px": uniform_distance, "ln_N": float(np.log(tokens)),
                  "ln_patches": float(np.log(patches)), "map_spread": spread,
                  **{f"{k}_{name}": (v.tolist() if isinstance(v, np.ndarray) else v)
                     for k, s in stats.items() for name, v in s.items()}}
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

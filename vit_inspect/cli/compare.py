"""`vit-inspect compare IMAGE... --model A --model B --out DIR`: two models side by side.

Writes, per image, the aligned maps, the attention-distance figure and both models' last-layer heads
with their DINO masks; for all images together each model's feature PCA (fitted jointly) and both
models' ViT Fig. 7 panels; and `agreement.json`, which is also printed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from vit_inspect.analysis.dino import DINO_MASS, feature_pca
from vit_inspect.cli.common import figure_stems, prompt_options, save_png, targets, with_prompt_options
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.geometry import parse_size
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.plots import compare as compare_plots
from vit_inspect.plots.compare import fig7_images
from vit_inspect.studies.comparison import (agreement_record, aligned_maps, compare_images, comparison_label,
                                            last_layer_heads)


def add_parser(sub) -> None:
    compare = sub.add_parser("compare", help="two models side by side: aligned maps, agreement JSON, DINO views")
    compare.add_argument("images", nargs="+", metavar="IMAGE_OR_FOLDER",
                         help="images to compare on (the feature PCA is fitted jointly over all of them)")
    compare.add_argument("--model", action="append", required=True,
                         help="timm name, HF id or folder; give it twice: --model A --model B")
    compare.add_argument("--weights-a", help="weights file for the first model (.safetensors preferred)")
    compare.add_argument("--weights-b", help="weights file for the second model")
    compare.add_argument("--input-size-a", help="HxW input of the first model, e.g. 224x224 (default: its own)")
    compare.add_argument("--input-size-b", help="HxW input of the second model, e.g. 224x320")
    compare.add_argument("--layer", type=int, help="the first model's layer for attention and Grad-CAM (default: "
                                                   "the last); the second model's is the same relative depth")
    compare.add_argument("--mass", type=float, default=DINO_MASS,
                         help=f"share of attention mass the DINO masks keep (default {DINO_MASS})")
    compare.add_argument("--background-threshold", type=float,
                         help="feature PCA: drop patches whose scaled first component is below this (e.g. 0.5)")
    prompt_options(compare)
    compare.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    compare.add_argument("--out", required=True, help="folder for the figures and agreement.json")
    compare.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if len(args.model) != 2:
        raise VitInspectError("Give exactly two models: --model A --model B (the same name twice is fine).")
    sizes = [parse_size(args.input_size_a), parse_size(args.input_size_b)]
    target, contrast = targets(args)
    handles = [load_model(name, weights=weights, device=args.device)
               for name, weights in zip(args.model, (args.weights_a, args.weights_b))]
    if args.zero_shot is not None or args.templates is not None:
        handles = [with_prompt_options(h, args) if h.clip is not None else h for h in handles]
    labels = [comparison_label(h, letter, size) for h, letter, size in zip(handles, "AB", sizes)]
    files = find_images(args.images)
    if not files:
        raise VitInspectError("No images found in the paths given.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, features, crops = [], ([], []), ([], [])
    for path, stem in zip(files, figure_stems(files)):
        comparison = compare_images(handles[0], handles[1], load_image(path), sizes[0], sizes[1], target_a=target,
                                    target_b=target, contrast=contrast)
        aligned = aligned_maps(comparison, layer_a=args.layer)
        record = {"image": str(path), "label_a": labels[0], "label_b": labels[1],
                  **agreement_record(comparison, aligned)}
        records.append(record)
        print(json.dumps(record), flush=True)
        save_png(compare_plots.aligned_maps_figure(comparison, aligned, *labels), out / f"{stem}_maps.png")
        results = (comparison.a, comparison.b)
        save_png(compare_plots.compare_distance_figure([r.mean_distance for r in results], labels,
                                                   [r.layout.input_size[1] for r in results],
                                                   title=f"mean attention distance: {path.name}"),
             out / f"{stem}_distance.png")
        for index, (result, letter) in enumerate(zip(results, "ab")):
            maps, masks = last_layer_heads(result, args.mass)
            save_png(compare_plots.dino_heads_figure(result, maps, masks, labels[index], args.mass),
                 out / f"{stem}_heads_{letter}.png")
            features[index].append(result.patch_features.astype(np.float32))
            crops[index].append(result.rgb)
    for index, letter in enumerate("ab"):
        pca = feature_pca(features[index], args.background_threshold)
        save_png(compare_plots.feature_pca_figure(crops[index], pca, [p.name for p in files], labels[index]),
             out / f"feature_pca_{letter}.png")
    for name, image in fig7_images(handles, labels, sizes).items():
        Image.fromarray(image).save(out / f"fig7_{name}.png")
    (out / "agreement.json").write_text(json.dumps(records, indent=1))

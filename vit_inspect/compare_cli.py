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

from . import compare_plots, model_plots, plotting
from .analysis.dino import DINO_MASS, feature_pca
from .comparison import aligned_maps, agreement_record, compare_images, last_layer_heads
from .errors import VitInspectError
from .images import load_image
from .models import ViTHandle, load_model
from .pipeline import find_images, model_report, pos_similarity_at


def model_label(handle: ViTHandle, letter: str, input_size: tuple[int, int] | None, name: str | None = None) -> str:
    """'A: name (H×W)': names both models apart even when they are the same weights at two input sizes.
    `name` replaces the handle's (the app shows a server folder by its base name)."""
    height, width = input_size or handle.input_size
    return f"{letter}: {handle.name if name is None else name} ({height}×{width})"


def _png(fig, path: Path) -> None:
    try:
        path.write_bytes(plotting.figure_to_png(fig))
    finally:
        fig.clear()


def fig7_images(handles: list[ViTHandle], labels: list[str],
                sizes: list[tuple[int, int] | None] | None = None) -> dict[str, np.ndarray]:
    """Both models' ViT Fig. 7 left and centre panels, each as one side-by-side image; the position
    similarity on the grid of each model's input size (its label's), the embeddings interpolated as the
    model does in its forward (`pos_similarity_at`)."""
    filters, similarity = [], []
    for handle, label, size in zip(handles, labels, sizes or [None] * len(handles)):
        report = model_report(handle)
        filters.append(plotting.figure_to_rgb(model_plots.filter_pca_figure(report.filter_pca, model=label)))
        layout = handle.layout(size)
        grid = (layout.grid_h, layout.grid_w)
        similarity_map = report.pos_similarity if grid == report.grid else pos_similarity_at(handle, grid)
        if similarity_map is not None:
            similarity.append(plotting.figure_to_rgb(model_plots.pos_similarity_figure(
                similarity_map, title=f"{label}: position embedding similarity, {grid[0]}×{grid[1]} grid")))
    panels = {"filters": compare_plots.side_by_side(filters)}
    if similarity:
        panels["pos_similarity"] = compare_plots.side_by_side(similarity)
    return panels


def cmd_compare(args: argparse.Namespace) -> None:
    from .cli import _parse_size, figure_stems

    if len(args.model) != 2:
        raise VitInspectError("Give exactly two models: --model A --model B (the same name twice is fine).")
    sizes = [_parse_size(args.input_size_a), _parse_size(args.input_size_b)]
    handles = [load_model(name, weights=weights, device=args.device)
               for name, weights in zip(args.model, (args.weights_a, args.weights_b))]
    labels = [model_label(h, letter, size) for h, letter, size in zip(handles, "AB", sizes)]
    files = find_images(args.images)
    if not files:
        raise VitInspectError("No images found in the paths given.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, features, crops = [], ([], []), ([], [])
    for path, stem in zip(files, figure_stems(files)):
        comparison = compare_images(handles[0], handles[1], load_image(path), sizes[0], sizes[1])
        aligned = aligned_maps(comparison, layer_a=args.layer)
        record = {"image": str(path), "label_a": labels[0], "label_b": labels[1],
                  **agreement_record(comparison, aligned)}
        records.append(record)
        print(json.dumps(record), flush=True)
        _png(compare_plots.aligned_maps_figure(comparison, aligned, *labels), out / f"{stem}_maps.png")
        results = (comparison.a, comparison.b)
        _png(compare_plots.compare_distance_figure([r.mean_distance for r in results], labels,
                                                   [r.layout.input_size[1] for r in results],
                                                   title=f"mean attention distance: {path.name}"),
             out / f"{stem}_distance.png")
        for index, (result, letter) in enumerate(zip(results, "ab")):
            maps, masks = last_layer_heads(result, args.mass)
            _png(compare_plots.dino_heads_figure(result, maps, masks, labels[index], args.mass),
                 out / f"{stem}_heads_{letter}.png")
            features[index].append(result.patch_features.astype(np.float32))
            crops[index].append(result.rgb)
    for index, letter in enumerate("ab"):
        pca = feature_pca(features[index], args.background_threshold)
        _png(compare_plots.feature_pca_figure(crops[index], pca, [p.name for p in files], labels[index]),
             out / f"feature_pca_{letter}.png")
    for name, image in fig7_images(handles, labels, sizes).items():
        Image.fromarray(image).save(out / f"fig7_{name}.png")
    (out / "agreement.json").write_text(json.dumps(records, indent=1))


def add_compare_parser(sub) -> None:
    """The `compare` subcommand, added to the main parser by `cli.build_parser`."""
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
    compare.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    compare.add_argument("--out", required=True, help="folder for the figures and agreement.json")
    compare.set_defaults(func=cmd_compare)

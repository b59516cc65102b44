"""`vit-inspect concepts IMAGE`: the concepts of one image at one block, by deep feature factorisation
(`passes.concepts.image_concepts`): a table of each concept's area, its logit for the class and the classes its
embedding reads as, or with `--json` one JSON object; with `--out` the figure of every concept's heatmap.
One pass without gradients (the forward with capture, which keeps every block's tokens where they are small);
the factorisation and the head's readings of the concepts follow from its tokens.

`vit-inspect concepts FOLDER --class C`: the concepts of class C over the folder's images (CRAFT,
`studies.class_concepts.class_concepts`): a table of each concept's importance (total-order Sobol index of the
class logit), the logit lost when it is removed and the images of its top crops, or with `--json` one object;
with `--out` a PNG of each concept's top crops, one row per concept by importance.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from vit_inspect.cli.common import model_options, save_png
from vit_inspect.core.errors import InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.passes.concepts import (
    DEFAULT_CONCEPTS,
    MAX_CONCEPTS,
    ImageConcepts,
    image_concepts,
)
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.records import rounded
from vit_inspect.plots.concepts import TOP_CLASSES, concepts_figure
from vit_inspect.studies.class_concepts import DEFAULT_CONCEPTS as CLASS_CONCEPTS
from vit_inspect.studies.class_concepts import (
    DEFAULT_CROPS,
    GALLERY,
    MAX_CROPS,
    ClassConcepts,
    class_concepts,
)


def add_parser(sub) -> None:
    parser = sub.add_parser("concepts", help="the concepts of one image at one block (deep feature factorisation), "
                                             "or of a class over a folder of its images (CRAFT)")
    parser.add_argument("image", metavar="IMAGE|FOLDER")
    parser.add_argument("--layer", type=int, help="0-based block whose output tokens are factorised; negative "
                                                  "counts from the end (default: the last; for a class behind a "
                                                  "class-token head, the last but one)")
    parser.add_argument("--k", type=int, help=f"number of concepts, 1 to {MAX_CONCEPTS} (default {DEFAULT_CONCEPTS} "
                                              f"for an image, {CLASS_CONCEPTS} for a class)")
    parser.add_argument("--seed", type=int, default=0, help="the NMF's random initialisation, or for a class the "
                                                            "crops' positions (default 0)")
    parser.add_argument("--class", dest="class_index", type=int, metavar="C",
                        help="for a folder: the class index whose concepts are found (required)")
    parser.add_argument("--crops", type=int, default=DEFAULT_CROPS,
                        help=f"for a folder: random crops per image, 1 to {MAX_CROPS} (default {DEFAULT_CROPS})")
    parser.add_argument("--target", type=int, help="class index each concept's logit is read for (default: the "
                                                   "top prediction)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    model_options(parser, out_help="folder for the PNG figure of the concepts")
    parser.set_defaults(func=run)


def concepts_record(handle: ViTHandle, concepts: ImageConcepts, image: str) -> dict:
    """The JSON object of one image's concepts: model, image, block, settings, the class, and per concept its
    area, class logit and probability, top classes and (grid_h, grid_w) heatmap, rounded for JSON."""
    logits, probs = concepts.class_logits(), concepts.class_probabilities()
    entries = []
    for j in range(concepts.k):
        entry = {"concept": j + 1, "area": float(concepts.areas[j]), "class_logit": None, "class_probability": None,
                 "top": [], "heatmap": rounded(concepts.heatmaps[j])}
        if logits is not None:
            order = concepts.logits[j].argsort()[::-1][:TOP_CLASSES]
            entry.update(class_logit=float(logits[j]), class_probability=float(probs[j]),
                         top=[{"index": int(i), "label": handle.label(int(i)), "logit": float(concepts.logits[j, i])}
                              for i in order])
        entries.append(entry)
    target = None if concepts.target is None else {"index": concepts.target, "label": handle.label(concepts.target)}
    return {"model": handle.name, "weights": handle.weights, "image": image, "layer": concepts.layer,
            "k": concepts.k, "seed": concepts.seed, "target": target, "reconstruction_error": concepts.error,
            "iterations": concepts.iterations, "concepts": entries}


def concepts_table(record: dict) -> str:
    """The record as a title line and a Markdown table, one row per concept."""
    target = record["target"]
    title = (f"{record['model']} · {Path(record['image']).name} · block {record['layer']} · k={record['k']} · "
             + ("no classification head" if target is None else f"class {target['label']} (#{target['index']})"))
    lines = [title, "| concept | area | class logit | class probability | reads as |", "| --- |" + " --- |" * 4]
    for entry in record["concepts"]:
        logit = "—" if entry["class_logit"] is None else f"{entry['class_logit']:.2f}"
        prob = "—" if entry["class_probability"] is None else f"{100 * entry['class_probability']:.2f} %"
        reads = ", ".join(top["label"].split(",")[0] for top in entry["top"]) or "—"
        lines.append(f"| {entry['concept']} | {100 * entry['area']:.0f} % | {logit} | {prob} | {reads} |")
    return "\n".join(lines)


def class_record(handle: ViTHandle, concepts: ClassConcepts, folder: str) -> dict:
    """The JSON object of a class's concepts: model, folder, block, settings, the class, the mean class logits
    of the model and of the rebuilt tokens, and per concept its importance, logit drop and top crops (image
    name and box in the model input's pixels)."""
    entries = []
    for j in range(concepts.k):
        top = np.argsort(-concepts.crop_coefficients[:, j], kind="stable")[:GALLERY]
        crops = [{"image": concepts.images[i], "top": int(t), "left": int(left), "side": int(side),
                  "coefficient": float(concepts.crop_coefficients[c, j])}
                 for c, (i, t, left, side) in zip(top, concepts.crop_boxes[top])]
        entries.append({"concept": j + 1, "importance": float(concepts.importance[j]),
                        "logit_drop": float(concepts.logit_drop[j]), "top_crops": crops})
    return {"model": handle.name, "weights": handle.weights, "folder": folder, "images": len(concepts.images),
            "importance_images": [concepts.images[i] for i in concepts.explained], "layer": concepts.layer,
            "k": concepts.k, "crops": len(concepts.crop_boxes), "seed": concepts.seed,
            "target": {"index": concepts.target, "label": handle.label(concepts.target)},
            "class_logit_model": concepts.logit_model, "class_logit_rebuilt": concepts.logit_rebuilt,
            "residual_kept": concepts.residual, "reconstruction_error": concepts.error, "concepts": entries}


def class_table(record: dict) -> str:
    """The class record as a title line and a Markdown table, one row per concept."""
    target = record["target"]
    title = (f"{record['model']} · {record['images']} images of class {target['label']} (#{target['index']}) · "
             f"block {record['layer']} · k={record['k']} · class logit {record['class_logit_model']:.2f}, rebuilt "
             f"{record['class_logit_rebuilt']:.2f}")
    lines = [title, "| concept | importance | logit drop | top crops from |", "| --- |" + " --- |" * 3]
    for entry in record["concepts"]:
        names = ", ".join(dict.fromkeys(crop["image"] for crop in entry["top_crops"][:3]))
        lines.append(f"| {entry['concept']} | {entry['importance']:.3f} | {entry['logit_drop']:.2f} | {names} |")
    return "\n".join(lines)


def run_class(args: argparse.Namespace, folder: Path) -> None:
    if args.class_index is None:
        raise InputError(f"{folder} is a folder: say which class its images are of with --class C.")
    images = find_images([folder])
    if not images:
        raise InputError(f"{folder} holds no image files.")
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    concepts = class_concepts(handle, images, args.class_index, CLASS_CONCEPTS if args.k is None else args.k,
                              args.layer, args.crops, args.seed)
    record = class_record(handle, concepts, str(folder))
    print(json.dumps(record) if args.json else class_table(record), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        k, shown, side = concepts.galleries.shape[:3]  # one row of top crops per concept, by importance
        grid = concepts.galleries.transpose(0, 2, 1, 3, 4).reshape(k * side, shown * side, 3)
        Image.fromarray(grid).save(out / f"{folder.name}_class{concepts.target}_concepts_block{concepts.layer}.png")


def run(args: argparse.Namespace) -> None:
    path = Path(args.image)
    if path.is_dir():
        return run_class(args, path)
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    result = analyze_image(handle, path, options=PassOptions(gradients=False, relevance=False))
    k = DEFAULT_CONCEPTS if args.k is None else args.k
    concepts = image_concepts(handle, result, k, args.layer, args.seed, args.target)
    record = concepts_record(handle, concepts, str(path))
    print(json.dumps(record) if args.json else concepts_table(record), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_png(concepts_figure(result.rgb, concepts, handle.label, path.name),
                 out / f"{path.stem}_concepts_block{concepts.layer}.png")

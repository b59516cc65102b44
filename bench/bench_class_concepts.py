"""Concepts of a class (CRAFT): does a concept's Sobol importance agree with the class logit it takes away when
removed, and how long do class concepts from 50 images take, on the real DeiT-Ti weights.

The ImageNet samples hold one photo per class, so each class's 50 images are augmented views of its photo: a
random square of 50 to 100 % of the photo's shorter side at a random position, mirrored left-right with
probability 1/2 (seeded), each then seen through the model's own resize and centre crop. For each class, the
Spearman correlation over the k concepts between the importance (total-order Sobol index, mean over the images
it is estimated on) and the logit drop on removal (same images)                            target >= 0.7
(a Sobol index has no sign: a concept whose removal raises the logit is important too, so the correlation
with the drop's magnitude is reported beside it)
and the time of `studies.class_concepts.class_concepts` with its defaults                  target <= 60 s

    python -m bench.bench_class_concepts [--classes 1 285 779 948 980] [--images 50] [--k 10] [--threads 2]
                                         [--weights checkpoints/deit_tiny_patch16_224.safetensors]
"""
from __future__ import annotations

import argparse
import csv
import time

import numpy as np
from PIL import Image

from .common import SHARED, print_header, real_weights, report, set_threads, verdict

MODEL = "deit_tiny_patch16_224"
SAMPLES = SHARED / "data" / "imagenet_samples"
TARGET_RHO = 0.7
TARGET_S = 60.0


def augmented(photo: Image.Image, count: int, seed: int) -> list[Image.Image]:
    """``count`` views of ``photo``: random squares of 50-100 % of its shorter side, mirrored with probability 1/2."""
    from vit_inspect.core.images import square_crops

    return square_crops(photo, count, np.random.default_rng(seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[1, 285, 779, 948, 980])
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", default=str(real_weights(MODEL)))
    args = parser.parse_args()
    set_threads(args.threads)

    from scipy.stats import spearmanr

    from vit_inspect.core.load import load_model
    from vit_inspect.studies.class_concepts import class_concepts

    handle = load_model(MODEL, weights=args.weights, device="cpu")
    with (SAMPLES / "labels.csv").open(newline="") as file:
        photos = {int(row["class_index"]): row["filename"] for row in csv.DictReader(file)}
    rows = []
    for target in args.classes:
        views = augmented(Image.open(SAMPLES / photos[target]).convert("RGB"), args.images, seed=target)
        start = time.perf_counter()
        concepts = class_concepts(handle, views, target, k=args.k)
        seconds = time.perf_counter() - start
        rho = float(spearmanr(concepts.importance, concepts.logit_drop)[0])
        rho_abs = float(spearmanr(concepts.importance, np.abs(concepts.logit_drop))[0])
        label = handle.label(target).split(",")[0]
        print(f"{label}: importance {np.round(concepts.importance, 3).tolist()}")
        print(f"{label}: logit drop {np.round(concepts.logit_drop, 2).tolist()}")
        rows.append([label, target, MODEL, concepts.layer, args.images, concepts.k, len(concepts.explained),
                     f"{rho:.2f}", verdict(rho, TARGET_RHO, at_most=False), f"{rho_abs:.2f}", f"{seconds:.1f}",
                     verdict(seconds, TARGET_S, at_most=True), f"{concepts.logit_model:.2f}",
                     f"{concepts.logit_rebuilt:.2f}", f"{concepts.error:.3f}"])
    print_header(f"Class concepts (CRAFT), {MODEL} real weights, {args.threads} thread(s)")
    print(report("class_concepts", ("class", "index", "model", "block", "images", "k", "importance images",
                                    "spearman importance vs drop", "≥ 0.7", "spearman importance vs |drop|",
                                    "time s", "≤ 60 s", "class logit",
                                    "rebuilt logit", "crop NMF error"), rows, key=("class", "model", "images", "k")))


if __name__ == "__main__":
    main()

"""Do an SAE's features carry the class? Ablating the top features of the class's most relevant patches against
ablating random active features of the same patches.

For each held-out image (by default the last 200 of the folder by file name, or, with `--held-out-seed`, the 200
that `vit-inspect sae train --holdout 200 --holdout-seed S` holds out; the SAE was trained on the others):

1. one forward and backward: the predicted class c and its Grad-CAM map at the last block's first LayerNorm
   (`analysis.gradcam.gradcam_from_tokens`, signed, before any ReLU: the pass's default Grad-CAM); the 5
   patches of largest Grad-CAM;
2. the SAE's codes of those patches (`passes.sae.patch_codes`), summed over the 5; the top 3 features by that
   sum, and 3 features drawn at random (seeded, `--seed`) from all features active on those patches;
3. logit_c unmodified, then with each set's codes set to 0 at the 5 patches only, the SAE's error kept
   (`passes.sae.edited_block_output`: t' = t + (z' − z) W_dec · input_scale); the drop is unmodified − edited.

Reported: the mean drop of each set, their ratio (goal: top-3 ≥ 5× random), the median drops and the share of
images where the top-3 drop is the larger. Writes bench/results/sae_interventions.csv.

The random draw of image i is seeded with (seed, i), so `--jobs` (processes, each with one torch thread) does not
change the result.

    python -m bench.bench_sae_interventions --sae FILE [--images FOLDER] [--held-out 200] [--held-out-seed S]
                                            [--seed 0] [--jobs 1]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from vit_inspect.analysis.gradcam import gradcam_from_tokens
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.core.sae_file import check_fits
from vit_inspect.core.sae_load import load_sae
from vit_inspect.jobs.sae_folder import split_held_out
from vit_inspect.passes.sae import edited_block_output, patch_codes

from .common import SHARED, THREADS, print_header, real_weights, report, set_threads, verdict

MODEL = "deit_tiny_patch16_224"
PATCHES = 5  # most relevant patches per image
FEATURES = 3  # features ablated per set
GOAL = 5.0  # top-3 mean drop ÷ random mean drop


def last_gradcam(handle, pixels: torch.Tensor) -> tuple[int, np.ndarray]:
    """(predicted class, (P,) signed Grad-CAM at the last block's first LayerNorm for it)."""
    seen = []
    hook = handle.norm1_modules[-1].register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        logits = handle.forward(pixels.requires_grad_(False))
    finally:
        hook.remove()
    target = int(logits[0].argmax())
    gradient, = torch.autograd.grad(logits[0, target], seen[0])
    layout = handle.layout()
    cam = gradcam_from_tokens(seen[0][0].detach().numpy(), gradient[0].numpy(), layout)
    return target, cam.ravel()


def image_drops(handle, sae, path: Path, rng: np.random.Generator) -> dict:
    """The logit drops of one image (module docstring, steps 1 to 3); `rng` draws the random features."""
    pixels = handle.preprocess.apply(load_image(path))[0]  # (1, 3, H, W)
    target, gradcam = last_gradcam(handle, pixels)
    patches = [int(p) for p in np.argsort(-gradcam, kind="stable")[:PATCHES]]
    codes, logits = patch_codes(handle, sae, pixels, logits=True)  # (1, P, F), (1, C)
    summed = codes[0, patches].sum(0)  # (F,)
    top = [int(f) for f in torch.argsort(summed, descending=True, stable=True)[:FEATURES]]
    active = np.flatnonzero(summed.numpy() > 0)
    chosen = [int(f) for f in rng.choice(active, FEATURES, replace=False)]
    base = float(logits[0, target])
    layout = handle.layout()
    drops = {}
    for name, features in (("top", top), ("random", chosen)):
        with torch.no_grad(), edited_block_output(handle, sae, layout, {f: 0.0 for f in features}, patches):
            drops[f"drop_{name}"] = base - float(handle.forward(pixels)[0, target])
    return {"image": path.name, "class": target, "top_features": top, "random_features": chosen, **drops}


_WORKER: dict = {}


def _open(sae_path: str, threads: int) -> None:
    set_threads(threads)
    handle = load_model(MODEL, weights=real_weights(MODEL), device="cpu")
    sae = load_sae(sae_path)
    check_fits(sae, handle.name, handle.depth, handle.embed_dim)
    _WORKER.update(handle=handle, sae=sae)


def _drops(task: tuple[str, int, int]) -> dict:
    path, seed, number = task
    return image_drops(_WORKER["handle"], _WORKER["sae"], Path(path), np.random.default_rng([seed, number]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sae", required=True, help="an SAE of DeiT-Ti (.safetensors)")
    parser.add_argument("--images", default=str(SHARED / "data" / "imagenet_samples"))
    parser.add_argument("--held-out", type=int, default=200, help="the last N images by file name")
    parser.add_argument("--held-out-seed", type=int, help="the N that `sae train --holdout-seed S` holds out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="processes, one torch thread each")
    args = parser.parse_args()
    files = split_held_out(find_images([args.images]), args.held_out, args.held_out_seed)[1]
    tasks = [(str(path), args.seed, number) for number, path in enumerate(files)]
    rows = []
    with multiprocessing.get_context("spawn").Pool(args.jobs, _open, (args.sae, 1 if args.jobs > 1 else THREADS)) as pool:
        for row in pool.imap(_drops, tasks):
            rows.append(row)
            print(f"{len(rows)}/{len(files)} {json.dumps(row)}", file=sys.stderr, flush=True)
    sae = load_sae(args.sae)
    top = [r["drop_top"] for r in rows]
    rand = [r["drop_random"] for r in rows]
    ratio = statistics.fmean(top) / statistics.fmean(rand)
    larger = sum(t > r for t, r in zip(top, rand)) / len(rows)
    print_header("SAE feature ablation at the class's most relevant patches")
    headers = ("model", "sae", "layer", "images", "patches", "features", "mean drop top-3", "mean drop random-3",
               "ratio", "goal >= 5", "median drop top-3", "median drop random-3", "top-3 drop larger")
    row = (MODEL, Path(args.sae).name, sae.info.layer, len(rows), PATCHES, FEATURES, f"{statistics.fmean(top):.3f}",
           f"{statistics.fmean(rand):.3f}", f"{ratio:.1f}", verdict(ratio, GOAL, at_most=False),
           f"{statistics.median(top):.3f}", f"{statistics.median(rand):.3f}", f"{larger:.0%}")
    print(report("sae_interventions", headers, [row], key=("model", "sae", "layer", "images")))


if __name__ == "__main__":
    main()

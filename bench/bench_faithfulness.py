"""Scoring every method's map for one image by perturbation, against the floor: the plain batched
forwards of the same number of inputs.

1. `score_maps` for all methods of one analysed image (planning, composing the perturbed inputs,
   the batched forwards, the curves) ÷ plain `model(batch)` forwards over the same number of inputs
   in the same batches (inputs built once, outside the timing)                   target <= 1.2
2. the seconds that scoring takes, and the one analysis pass that made the maps (for scale)
3. the same scoring with torch's own linear layers (`core.linear` switched off): its batched forwards run
   without gradients, so their large linear layers go through oneDNN, as plain `model(batch)` does not

DeiT-Ti uses the real weights from the data folder beside the checkout when present (random otherwise), ViT-B/16 random weights
(timing does not depend on them). CPU, THREADS torch threads; the machine may be shared: ratios are
measured interleaved in one run.

    python -m bench.bench_faithfulness [--models NAME ...] [--repeats 3] [--image assets/chelsea.png]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from vit_inspect.analysis.faithfulness import plan_perturbations
from vit_inspect.core import linear
from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.faithfulness import (DEFAULT_BATCH_SIZE, METHODS, image_permutation, model_scorer,
                                              score_maps, standard_maps)

from .common import (MODELS, REPO, SHARED, markdown_table, measure, plain_forward, plain_model, print_header,
                     report, set_threads, verdict)


def bench_model(name: str, picture, repeats: int, batch_size: int, summary: list[list[str]]) -> None:
    weights = SHARED / "models" / f"{name}.safetensors"
    handle = load_model(name, weights=weights if weights.is_file() else None, pretrained=weights.is_file(),
                        device="cpu")
    pixels, _ = handle.preprocess.apply(picture)
    timings_pass = measure({"analysis pass": lambda: analyze_image(handle, picture)}, repeats=1)
    analysis = analyze_image(handle, picture)
    layout = analysis.layout
    rng = image_permutation(analysis.rgb, layout.num_patches)
    permutation = rng.permutation(layout.num_patches)
    maps = standard_maps(analysis, tuple(METHODS), rng)
    inputs = plan_perturbations(maps, permutation).keep.shape[0]
    model = plain_model(handle)
    batches = [pixels.expand(min(batch_size, inputs - start), -1, -1, -1).contiguous()
               for start in range(0, inputs, batch_size)]
    score = model_scorer(handle)

    def ours() -> None:
        score_maps(score, pixels, layout, maps, int(analysis.target), int(analysis.target), permutation,
                   batch_size=batch_size)

    def floor() -> None:
        with torch.no_grad():
            for batch in batches:
                plain_forward(model, batch)

    def ours_torch_linears() -> None:  # the scoring with torch's own linear layers (`core.linear` switched off)
        linear.ENABLED = False
        try:
            ours()
        finally:
            linear.ENABLED = True

    timings = measure({"score all maps": ours, "plain forwards": floor,
                       "score all maps, torch's linear layers": ours_torch_linears}, repeats=repeats)
    ratio = timings["score all maps"].median / timings["plain forwards"].median
    torch_ratio = timings["score all maps, torch's linear layers"].median / timings["plain forwards"].median
    print(f"#### {name} ({handle.weights.split('/')[-1]}): {len(maps)} maps, {inputs} distinct perturbed inputs, "
          f"batches of {batch_size}\n")
    print(markdown_table(("candidate", "seconds, median (min–max)"),
                         [(k, v.s()) for k, v in {**timings_pass, **timings}.items()]))
    print()
    summary.append(["score all maps ÷ plain forwards", name, timings["score all maps"].s(),
                    timings["plain forwards"].s(), f"{ratio:.3f}", "<= 1.2", verdict(ratio, 1.2, at_most=True)])
    summary.append(["the same with torch's linear layers ÷ plain forwards", name,
                    timings["score all maps, torch's linear layers"].s(), timings["plain forwards"].s(),
                    f"{torch_ratio:.3f}", "", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per candidate (after 1 warm-up)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"))
    args = parser.parse_args()
    set_threads()
    picture = load_image(args.image)
    print_header("Faithfulness scoring of one image")
    summary: list[list[str]] = []
    for name in args.models:
        bench_model(name, picture, args.repeats, args.batch_size, summary)
    print("### Summary\n")
    print(report("faithfulness_speed", ("measure", "model", "ours (s)", "floor (s)", "ratio", "target", "held"),
                 summary, key=("measure", "model")))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

"""Concepts of one image (deep feature factorisation) and patch similarity, each against one plain forward of
the same model, on the real DeiT-Ti weights (NMF's iterations depend on the tokens, so random weights would
not say how long a real image takes).

1. DFF from the result's kept tokens (`passes.concepts.image_concepts`: the NMF and the head's readings of the
   concepts), the notebook's ``r.concepts(k)`` and a redraw at another block or k        target <= 1 s
2. what `vit-inspect concepts` computes: the pass without gradients, then DFF             target <= 1 s
3. DFF of a result that kept no tokens (a large model's): one forward without gradients, then DFF
4. a patch-similarity redraw, in the image and in another, from the kept tokens

Candidates are interleaved (bench.common.measure), so ratios hold on a busy machine.

    python -m bench.bench_concepts [--images assets/chelsea.png assets/coffee.png] [--k 5] [--repeats 5]
                                   [--threads 2] [--weights checkpoints/deit_tiny_patch16_224.safetensors]
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .common import REPO, measure, plain_forward, plain_model, print_header, real_weights, report, set_threads, verdict

MODEL = "deit_tiny_patch16_224"
TARGET_S = 1.0  # seconds: DFF of one DeiT-Ti image, at most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", nargs="+", default=[str(REPO / "assets" / n) for n in ("chelsea.png", "coffee.png")])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", default=str(real_weights(MODEL)))
    args = parser.parse_args()
    set_threads(args.threads)

    from vit_inspect.core.images import load_image
    from vit_inspect.core.load import load_model
    from vit_inspect.passes.concepts import image_concepts, patch_similarity
    from vit_inspect.passes.pipeline import analyze_image

    handle = load_model(MODEL, weights=args.weights, device="cpu")
    plain = plain_model(handle)
    last, middle = handle.depth - 1, handle.depth // 2
    pictures = {Path(p).name: load_image(p) for p in args.images}
    results = {name: analyze_image(handle, picture, gradients=False, relevance=False)
               for name, picture in pictures.items()}
    names = list(results)
    rows = []
    for index, (name, result) in enumerate(results.items()):
        other = results[names[(index + 1) % len(names)]]
        bare = dataclasses.replace(result, block_tokens=None)  # as a result too large to keep its tokens
        pixels = handle.preprocess.normalize(result.rgb)
        candidates = {
            "plain forward": lambda: plain_forward(plain, pixels),
            f"1. DFF from the kept tokens, k={args.k}, block {last}": lambda: image_concepts(handle, result, args.k),
            f"1. DFF from the kept tokens, k={args.k}, block {middle}":
                lambda: image_concepts(handle, result, args.k, middle),
            f"2. pass without gradients + DFF, k={args.k}, block {last}":
                lambda: image_concepts(handle, analyze_image(handle, pictures[name], gradients=False,
                                                             relevance=False), args.k),
            f"3. one forward + DFF (no kept tokens), k={args.k}, block {last}":
                lambda: image_concepts(handle, bare, args.k),
            f"4. patch similarity, this image and another, block {middle}":
                lambda: patch_similarity(handle, result, (7, 7), middle, other),
        }
        timings = measure(candidates, args.repeats)
        base = timings.pop("plain forward")
        for measure_name, timing in timings.items():
            bounded = measure_name.startswith(("1.", "2."))
            rows.append([measure_name, MODEL, name, timing.s(), f"{1e3 * base.median:.0f} ms",
                         f"{timing.median / base.median:.2f}", f"≤ {TARGET_S:g} s" if bounded else "—",
                         verdict(timing.median, TARGET_S, at_most=True) if bounded else "—"])
        iterations = {layer: image_concepts(handle, result, args.k, layer).iterations for layer in (middle, last)}
        print(f"{name}: NMF iterations {iterations} (at most 200)")
    print_header(f"Concepts and patch similarity, {MODEL} real weights ({args.threads} thread(s), {args.repeats} "
                 "interleaved repeats; medians and ranges in s)")
    print(report("concepts", ("measure", "model", "image", "ours s", "plain forward", "ratio", "target", "held"), rows,
                 key=("measure", "model", "image")))


if __name__ == "__main__":
    main()

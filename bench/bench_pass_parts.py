"""Where the per-image pass spends its time above the floor, measured in place.

Each candidate is the app's pass (`analyze_image(relevance=False)` + top-5, as bench_analysis row 1a times
it) with one part replaced by what that part returned on a first pass, so that everything else runs as it
does: the difference to the whole pass is what the part costs where it runs (its caches, its neighbours),
which differs from timing it alone. The parts:

- forward reductions: each layer's distance and prefix sums, and its entropy sums where the maps are not
  kept (`LayerStream.on_attention`, `HeadStatsStream.on_attention`); the float16 copy of a small model's
  maps is still made;
- gradient reductions (`passes.pipeline.gradient_reductions`: A ⊙ ∂y/∂A, first order, G, Chefer's row);
- the head pass (`head_pass.build_head_pass`: logit lens, token norms);
- the preview of the whole upload (`images.preview_rgb`);
- preprocessing (`passes.pipeline.model_input`: the model's resize, crop and normalisation);

and all five at once. The results of a stubbed pass are wrong (cached parts); only its time is read. One
more candidate is the whole pass with the preview made after the model's input instead of beside it
(`threads.in_background` run synchronously). ``--idle-ms`` starts every timed call after that long idle,
as the app's pass starts after an upload (see `common.measure`).
Random weights, candidates interleaved, medians; ratios are to the floor (a plain forward + input-only
backward, bench_analysis row 1a) measured in the same run.

    python -m bench.bench_pass_parts [--models deit_tiny_patch16_224] [--repeats 30] [--threads 2] [--idle-ms 30]
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Callable, Iterator

import torch

from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes import head_pass, layer_stream, pipeline, threads

from .common import (REPO, THREADS, measure, plain_forward_input_backward, plain_model, print_header, report,
                     set_threads)

PARTS = ("forward reductions", "gradient reductions", "head pass", "preview", "preprocessing")


def cached(function: Callable) -> Callable:
    """``function`` answering every call after the first with the first call's result."""
    memo: list = []

    def replay(*args, **kwargs):
        if not memo:
            memo.append(function(*args, **kwargs))
        return memo[0]
    return replay


@contextlib.contextmanager
def replaced(targets: list[tuple[object, str, object]]) -> Iterator[None]:
    """Set each (owner, name) to the value given while inside; restored on leaving."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, value in targets:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def stubs() -> dict[str, list[tuple[object, str, object]]]:
    """For each part, the replacements that make it return a first pass's values."""
    stream_on, stats_on = layer_stream.LayerStream.on_attention, head_pass.HeadStatsStream.on_attention
    sums: dict[tuple[str, int], object] = {}

    def stream_copy_only(self, layer, probs):  # the float16 copy of kept maps stays; the sums are replayed
        if ("distance", layer) not in sums:
            stream_on(self, layer, probs)
            sums[("distance", layer)] = self._distance_sums[layer]
            return
        self._distance_sums[layer] = sums[("distance", layer)]
        if self.keep_maps:
            if self._kept is None:
                self._kept = torch.empty((self.depth, *probs.shape[1:]), dtype=torch.float16, device=probs.device)
            self._kept[layer].copy_(probs[0].detach())
            self._kept_layers.add(layer)

    def stats_replayed(self, layer, probs):
        if ("entropy", layer) not in sums:
            stats_on(self, layer, probs)
            sums[("entropy", layer)], sums[("prefix", layer)] = self._entropy[layer], self._prefix[layer]
            return
        self._entropy[layer], self._prefix[layer] = sums[("entropy", layer)], sums[("prefix", layer)]

    model_input = cached(pipeline.model_input)

    def fresh_input(*args, **kwargs):  # the pass sets requires_grad on its input: a fresh tensor each time
        pixels, rgb, box = model_input(*args, **kwargs)
        return pixels.clone(), rgb, box
    return {
        "forward reductions": [(layer_stream.LayerStream, "on_attention", stream_copy_only),
                               (head_pass.HeadStatsStream, "on_attention", stats_replayed)],
        "gradient reductions": [(pipeline, "gradient_reductions", cached(pipeline.gradient_reductions))],
        "head pass": [(pipeline, "build_head_pass", cached(pipeline.build_head_pass))],
        "preview": [(pipeline, "preview_rgb", cached(pipeline.preview_rgb))],
        "preprocessing": [(pipeline, "model_input", fresh_input)],
    }


def synchronous(function: Callable, *args) -> Callable[[], object]:
    """`threads.in_background` without the thread: ``function`` runs now; its result is handed back later."""
    value = function(*args)
    return lambda: value


def bench_model(name: str, picture, repeats: int, idle_s: float = 0.0) -> None:
    handle = load_model(name, pretrained=False, device="cpu")
    model = plain_model(handle)
    pixels, _ = handle.preprocess.apply(picture)
    with torch.no_grad():
        top = int(handle.forward(pixels)[0].argmax()) if handle.has_head else 0
    parts = stubs()

    def run(*names: str) -> Callable[[], object]:
        targets = [t for n in names for t in parts[n]]

        def call():
            with replaced(targets):
                return handle.top_labels(pipeline.analyze_image(handle, picture, relevance=False).probs, 5)
        return call

    candidates = {"the floor: plain forward + input-only backward":
                  lambda: plain_forward_input_backward(model, pixels, top),
                  "the pass": run()}
    candidates.update({f"the pass without {part}": run(part) for part in PARTS})
    candidates["the pass without all five"] = run(*PARTS)
    parts["preview after the input"] = [(threads, "in_background", synchronous)]
    candidates["the pass, its preview made after the model's input"] = run("preview after the input")
    times = measure(candidates, repeats, warmup=2, idle_s=idle_s)
    floor, whole = times["the floor: plain forward + input-only backward"].median, times["the pass"].median
    print(f"### {name}\n")
    results = "pass_parts" if idle_s == 0 else f"pass_parts_idle{1e3 * idle_s:g}ms"
    print(report(results, ("model", "candidate", "median ms (min–max)", "the part costs, ms", "÷ the floor"),
                 [(name, k, t.ms(), "—" if k.startswith("the floor") or k == "the pass"
                   else f"{1e3 * (whole - t.median):.1f}" if "without" in k else "—", f"{t.median / floor:.3f}")
                  for k, t in times.items()], key=("model", "candidate")))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["deit_tiny_patch16_224"], help="timm names (random weights)")
    parser.add_argument("--repeats", type=int, default=30, help="timed repeats per candidate (after 2 warm-ups)")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"), help="the image analysed")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads")
    parser.add_argument("--idle-ms", type=float, default=0.0, help="idle before each timed call (default 0: back to back)")
    args = parser.parse_args()
    set_threads(args.threads)
    picture = load_image(args.image)
    print_header("What each part of the pass costs in place")
    print(f"Image: `{args.image}` ({picture.width}×{picture.height}); {args.threads} torch threads; median of "
          f"{args.repeats} repeats after 2 warm-ups, candidates interleaved"
          + (f", each timed call after {args.idle_ms:g} ms idle" if args.idle_ms > 0 else ", back to back") + ".\n")
    for name in args.models:
        bench_model(name, picture, args.repeats, idle_s=args.idle_ms / 1e3)


if __name__ == "__main__":
    main()

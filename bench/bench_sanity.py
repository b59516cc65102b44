"""The cascading randomisation test of every method on one image, against the floor: the plain analysis passes
it needs.

1. `sanity_check` with the cascading test only (no independent test, no random logit, no robustness) for all
   methods: 1 + depth + 1 analysis passes (the trained model, then from the last block down to the patch
   embedding), plus drawing the fresh weights, copying them in and out, and the three similarities per map
   and step ÷ the plain `analyze_pixels` passes it needs (relevance included, as the methods need), each
   on the weights of its step: only the passes are timed, the weights are set outside the timing (a
   randomised model's pass is 10-15 % slower than the trained model's)        target <= 1.3
2. the seconds that the test takes, per model

Each candidate is timed by the wall clock and by the CPU time of the process (`time.process_time`, all its
threads), which other work on a shared machine disturbs less; both are reported, as the ratio of the medians
(held against the target) and of the minima (the repeats least disturbed). A third row needs no second
candidate: inside each timed `sanity_check` the passes themselves are timed too (its `analyze_pixels` wrapped
in a timer), so the test ÷ its own passes compares two times taken under the same load; the median and the
smallest of the repeats' ratios are reported.

DeiT-Ti uses the real weights from the data folder beside the checkout when present (random otherwise),
ViT-B/16 random weights (timing does not depend on them). CPU, THREADS torch threads (``--threads``); the
machine may be shared: the two candidates are timed interleaved in one run. The summary also goes to
bench/results/sanity_speed.csv.

    python -m bench.bench_sanity [--models NAME ...] [--repeats 3] [--threads 2] [--image assets/chelsea.png]
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack

from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.passes.randomise import fresh_weights, randomised
from vit_inspect.studies import sanity as sanity_module
from vit_inspect.studies.sanity import SANITY_METHODS, SanitySettings, sanity_check, steps_of

from .common import (MODELS, REPO, SHARED, THREADS, Timing, markdown_table, print_header, report, set_threads,
                     verdict)

CASCADING_ONLY = SanitySettings(independent=False, random_logit=False, robustness=None)


def bench_model(name: str, picture, repeats: int, summary: list[list[str]]) -> None:
    weights = SHARED / "models" / f"{name}.safetensors"
    handle = load_model(name, weights=weights if weights.is_file() else None, pretrained=weights.is_file(),
                        device="cpu")
    pixels, _ = handle.preprocess.apply(picture)
    target = int(analyze_pixels(handle, pixels, relevance=False).target)
    passes = handle.depth + 2

    fresh = fresh_weights(handle, CASCADING_ONLY.seed)

    inside = [0.0, 0.0]  # wall and CPU seconds of the passes inside the running sanity_check

    def timed_pass(*args, **kwargs):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return analyze_pixels(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - start
            inside[1] += time.process_time() - start_cpu

    def ours() -> tuple[float, float]:
        inside[:] = [0.0, 0.0]
        sanity_module.analyze_pixels = timed_pass
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            sanity_check(handle, picture, SANITY_METHODS, target=target, settings=CASCADING_ONLY)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            sanity_module.analyze_pixels = analyze_pixels
        own.append((wall / inside[0], cpu / inside[1]))
        return wall, cpu

    def floor() -> tuple[float, float]:
        """The passes alone, each on its step's weights (set untimed)."""
        wall = cpu = 0.0
        with ExitStack() as stack:
            for step in steps_of(handle.depth):
                if step is not None:
                    stack.enter_context(randomised(handle, [step], fresh))
                start, start_cpu = time.perf_counter(), time.process_time()
                analyze_pixels(handle, pixels, target=target, relevance=True)
                wall += time.perf_counter() - start
                cpu += time.process_time() - start_cpu
        return wall, cpu

    own: list[tuple[float, float]] = []  # per call of ours: its wall and CPU time ÷ those of the passes inside it
    ours(), floor()  # warm-up
    del own[:]
    seconds = [(ours(), floor()) for _ in range(repeats)]  # interleaved
    print(f"#### {name} ({handle.weights.split('/')[-1]}): {len(SANITY_METHODS)} methods, {passes} passes\n")
    rows = []
    for clock, index in (("wall-clock", 0), ("CPU time of the process", 1)):
        ours_t, floor_t = Timing(tuple(a[index] for a, _ in seconds)), Timing(tuple(b[index] for _, b in seconds))
        ratio = ours_t.median / floor_t.median
        rows += [(f"cascading test, all methods ({clock})", ours_t.s()),
                 (f"{passes} plain passes ({clock})", floor_t.s())]
        fastest = min(ours_t.seconds) / min(floor_t.seconds)  # the repeats least disturbed by other work
        summary.append([f"cascading test ÷ plain passes, {clock}", name, ours_t.s(), floor_t.s(), f"{ratio:.3f}",
                        f"{fastest:.3f}", "<= 1.3", verdict(ratio, 1.3, at_most=True)])
    for clock, index in (("wall-clock", 0), ("CPU time of the process", 1)):
        ratios = [r[index] for r in own]
        summary.append([f"cascading test ÷ its own passes in the same call, {clock}", name, "", "",
                        f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}", "<= 1.3",
                        verdict(statistics.median(ratios), 1.3, at_most=True)])
    print(markdown_table(("candidate", "seconds, median (min–max)"), rows))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per candidate (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads (default {THREADS})")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"))
    args = parser.parse_args()
    set_threads(args.threads)
    picture = load_image(args.image)
    print_header("The cascading randomisation test of one image")
    summary: list[list[str]] = []
    for name in args.models:
        bench_model(name, picture, args.repeats, summary)
    print("### Summary\n")
    print(report("sanity_speed", ("measure", "model", "ours (s)", "floor (s)", "ratio of medians", "ratio of minima",
                                  "target", "held"), summary,
                 key=("measure", "model")))


if __name__ == "__main__":
    main()

"""Head ablation and per-image head importance, each against the passes it replaces, in one run.

1. ablated analysis on a new head set (`analyze_ablated`: one forward + one backward with the heads
   ablated, every map) ÷ the analysis pass (`analyze_image`)                        target <= 1.2
2. head importance (`head_importance`: 1 + L·H rows, one ablation mask per row, batches of
   --batch-size) ÷ one plain batched forward over L·H rows (fused attention, no hooks) target <= 4

Random weights (timing does not depend on them), CPU, THREADS torch threads, candidates interleaved.
Besides wall-clock time each candidate's process CPU time is measured (`time.process_time`, all
threads): on a busy machine it is far less disturbed by other jobs' load than wall time,
and the ratios are given for both.

    python -m bench.bench_heads [--models deit_tiny_patch16_224] [--repeats 5] [--batch-size 16]
"""
from __future__ import annotations

import argparse
import itertools
import time
from typing import Callable, Mapping

from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.ablation import analyze_ablated, head_importance

from .common import (
    REPO,
    Timing,
    markdown_table,
    plain_forward,
    plain_model,
    print_header,
    report,
    set_threads,
    verdict,
)

ABLATION_TARGET = 1.2  # ablated analysis ÷ analysis pass, at most
IMPORTANCE_TARGET = 4.0  # importance ÷ one batched forward over L·H rows, at most


def measure_wall_and_cpu(candidates: Mapping[str, Callable[[], object]], repeats: int,
                         warmup: int = 1) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Like `common.measure` (interleaved, after warm-up), timing wall clock and process CPU time."""
    for _ in range(warmup):
        for run in candidates.values():
            run()
    wall: dict[str, list[float]] = {name: [] for name in candidates}
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return ({n: Timing(tuple(v)) for n, v in wall.items()}, {n: Timing(tuple(v)) for n, v in cpu.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["deit_tiny_patch16_224"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per forward in head_importance")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"))
    args = parser.parse_args()
    set_threads()
    print_header("Head ablation and head importance")
    picture = load_image(args.image)
    rows = []
    for name in args.models:
        handle = load_model(name, pretrained=False, device="cpu")
        model = plain_model(handle)
        pixels, _ = handle.preprocess.apply(picture)
        heads = handle.depth * handle.num_heads
        batched = pixels.expand(heads, -1, -1, -1).contiguous()
        head_sets = itertools.cycle([[(layer, layer % handle.num_heads), ((layer + 3) % handle.depth, 0)]
                                     for layer in range(handle.depth)])  # a new head set on every call
        modes = itertools.cycle(["zero", "uniform"])
        walls, cpus = measure_wall_and_cpu({
            "analysis pass": lambda: analyze_image(handle, picture),
            "ablated analysis (new head set)": lambda: analyze_ablated(handle, picture, next(head_sets), next(modes)),
            f"plain batched forward, {heads} rows": lambda: plain_forward(model, batched),
            f"head importance, {heads + 1} rows": lambda: head_importance(handle, pixels, batch_size=args.batch_size),
        }, repeats=args.repeats)
        print(f"### {name}\n")
        print(markdown_table(("candidate", "wall ms, median (min–max)", "CPU ms, median (min–max)"),
                             [(k, walls[k].ms(), cpus[k].ms()) for k in walls]))
        print()
        for clock, times in (("wall", walls), ("CPU", cpus)):
            t = {k: v.median for k, v in times.items()}
            ablation = t["ablated analysis (new head set)"] / t["analysis pass"]
            importance = t[f"head importance, {heads + 1} rows"] / t[f"plain batched forward, {heads} rows"]
            rows.append((name, clock, "ablated analysis ÷ analysis pass", f"{ablation:.2f}", f"≤ {ABLATION_TARGET}",
                         verdict(ablation, ABLATION_TARGET, at_most=True)))
            rows.append((name, clock, f"importance ({heads} heads, batch {args.batch_size}) ÷ batched forward over "
                         f"{heads} rows", f"{importance:.2f}", f"≤ {IMPORTANCE_TARGET}",
                         verdict(importance, IMPORTANCE_TARGET, at_most=True)))
    print("### Summary\n")
    print(report("heads", ("model", "clock", "ratio", "value", "target", "held"), rows,
                 key=("model", "clock", "ratio")))


if __name__ == "__main__":
    main()

"""`model --images` (dataset mean attention distance) on the local engine and on Ray Data, same files.

Ray's overhead = Ray time ÷ local time for the same job over the same files. Both sides run the whole
job as a user does: open the job (one model load: in-process for local, in each actor for Ray), read,
decode, preprocess, forward with attention capture, running sums. The local Ray (started once, its
start-up time printed on its own row) has `--ray-cpus` CPUs; the actor reserves 1 of them and the read +
decode tasks use the rest. Local runs with THREADS torch threads. Runs interleave (local, ray, local,
ray, ...) so that a change of load on a shared machine hits both alike.

    python -m bench.bench_engines [--images FOLDER] [--count 1000] [--batch-size 16] [--repeats 1] [--ray-cpus 2]
    python -m bench.bench_engines --job evaluate --count 8 --batch-size 2 [--methods random,attention]

`--job evaluate`: the `vit-inspect evaluate` job (faithfulness curves of `--methods` per image, labels from
the folder's labels.csv) instead; `--batch-size` is then images per worker call.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from vit_inspect.core.images import find_images
from vit_inspect.jobs.distance import AttentionDistanceJob
from vit_inspect.jobs.engine import EngineOptions
from vit_inspect.jobs.evaluate import EvaluateJob, read_labels, select_files
from vit_inspect.jobs.run import run_job

from .common import SHARED, measure, print_header, report, set_threads

WEIGHTS = SHARED / "models" / "deit_tiny_patch16_224.safetensors"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", default=str(SHARED / "data" / "imagenet_samples"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per engine (no warm-up run: a user "
                                                               "pays the model load and actor start every run)")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--job", choices=("distance", "evaluate"), default="distance")
    parser.add_argument("--methods", default="random,attention", help="--job evaluate: methods scored")
    args = parser.parse_args()
    set_threads()
    if args.job == "evaluate":
        evaluate_main(args)
        return
    paths = find_images([args.images])[:args.count]
    job = AttentionDistanceJob("deit_tiny_patch16_224", weights=str(WEIGHTS.resolve()), device="cpu")
    ray_start, times, results = _time_engines(job, paths, args)
    local, ray = results["local"][-1], results["ray"][-1]
    if local.num_images != len(paths) or ray.num_images != len(paths):
        raise RuntimeError(f"analysed {local.num_images} (local) and {ray.num_images} (ray) of {len(paths)} images")
    difference = float(np.abs(local.distances - ray.distances).max())

    print_header("Folder-level job on the local engine and on Ray Data")
    print(f"`model --images` job (DeiT-Ti/16, 224 px, mean attention distance) over {len(paths)} images from "
          f"`{args.images}`, batch size {args.batch_size}, {args.repeats} timed run(s) per engine, interleaved. "
          f"Local Ray with {args.ray_cpus} CPUs (1 model actor with 1 CPU; read + decode tasks on the rest).\n")
    rows = [(engine, t.s(), f"{len(paths) / t.median:.1f}", f"{1e3 * t.median / len(paths):.1f}",
             f"{t.median / times['local'].median:.2f}") for engine, t in times.items()]
    rows.append(("local Ray start-up (once per session)", f"{ray_start:.3f}", "", "", ""))
    print(report("engines_distance", ("engine", "median s for all images (min–max)", "images/s", "ms per image",
                                      "÷ local time"), rows, key=("engine",)))
    print(f"\nLargest difference between the engines' distances: {difference:.2e} px.")


def _time_engines(job, paths: list, args: argparse.Namespace) -> tuple[float, dict, dict[str, list]]:
    """Start local Ray (timed once), then run `job` over `paths` on both engines, interleaved, no warm-up:
    (Ray start-up seconds, engine -> timing, engine -> the job results of each run)."""
    options = EngineOptions(batch_size=args.batch_size, shard_size=256)

    from vit_inspect.jobs.ray_engine import start_ray
    started = time.perf_counter()
    start_ray(num_cpus=args.ray_cpus)
    ray_start = time.perf_counter() - started

    results: dict[str, list] = {"local": [], "ray": []}
    times = measure({engine: (lambda e=engine: results[e].append(run_job(job, paths, e, options)[0]))
                     for engine in ("local", "ray")}, args.repeats, warmup=0)
    return ray_start, times, results


def evaluate_main(args: argparse.Namespace) -> None:
    """`evaluate` (faithfulness) on both engines, same files, interleaved; the tables must agree."""
    from pathlib import Path

    labels = read_labels(Path(args.images) / "labels.csv")
    paths = select_files(args.images, labels, every=max(1, len(labels) // args.count), limit=args.count)
    methods = tuple(args.methods.split(","))
    job = EvaluateJob("deit_tiny_patch16_224", str(WEIGHTS.resolve()), "cpu", None,
                      tuple(sorted((p.name, labels[p.name]) for p in paths)), methods)
    ray_start, times, results = _time_engines(job, paths, args)
    local, ray = results["local"][-1].accumulator.table(), results["ray"][-1].accumulator.table()
    difference = max(abs(local[m][c][0] - ray[m][c][0]) for m in local for c in local[m])

    print_header("`evaluate` (faithfulness) on the local engine and on Ray Data")
    print(f"`evaluate` job (DeiT-Ti/16, 224 px, methods {', '.join(methods)}: one analysis pass and the "
          f"perturbation curves per image) over {len(paths)} labelled images from `{args.images}`, "
          f"{args.batch_size} images per worker call, {args.repeats} timed run(s) per engine, interleaved. "
          f"Local Ray with {args.ray_cpus} CPUs (1 model actor with 1 CPU).\n")
    rows = [(engine, t.s(), f"{1e3 * t.median / len(paths):.0f}", f"{t.median / times['local'].median:.2f}")
            for engine, t in times.items()]
    rows.append(("local Ray start-up (once per session)", f"{ray_start:.3f}", "", ""))
    print(report("engines_evaluate", ("engine", "median s for all images (min–max)", "ms per image", "÷ local time"),
                 rows, key=("engine",)))
    print(f"\nLargest difference between the engines' mean AUCs: {difference:.2e}.")


if __name__ == "__main__":
    main()

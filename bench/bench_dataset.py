"""Mean attention distance over a folder, against plain batched inference on the same images.

3. images/s of `dataset_attention_distance` (batched, streaming) ÷ images/s of plain batched forward
   passes (fused attention, no grad) with the same batch size.              target >= 0.8

Both sides include reading, decoding and preprocessing each image (`load_image` +
`Preprocess.apply`), since `dataset_attention_distance` takes files; the decode + preprocess cost
alone is reported beside them. Random weights, CPU, THREADS torch threads.

    python -m bench.bench_dataset [--images FOLDER_OR_FILES ...] [--count 32] [--batch-size 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch

from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.jobs.distance import dataset_attention_distance

from .common import (MODELS, SHARED, markdown_table, measure, plain_forward, plain_model, print_header, report,
                     set_threads, verdict)

THROUGHPUT_TARGET = 0.8  # ours ÷ plain images per second, at least


def decode_and_preprocess(handle: ViTHandle, paths: Sequence[Path]) -> list[torch.Tensor]:
    """Each file read, decoded and preprocessed exactly as `dataset_attention_distance` does: (1, 3, H, W) each."""
    return [handle.preprocess.apply(load_image(path))[0] for path in paths]


def plain_batched_inference(handle: ViTHandle, model: torch.nn.Module, paths: Sequence[Path], batch_size: int) -> None:
    """Plain inference over the files: decode + preprocess a batch, one fused-attention forward per batch."""
    for start in range(0, len(paths), batch_size):
        plain_forward(model, torch.cat(decode_and_preprocess(handle, paths[start:start + batch_size])))


def bench_model(name: str, paths: Sequence[Path], batch_size: int, repeats: int, summary: list[list[str]]) -> None:
    handle = load_model(name, pretrained=False, device="cpu")
    model = plain_model(handle)
    count = len(paths)
    first_batch = paths[:batch_size]
    plain_batched_inference(handle, model, first_batch, batch_size)  # warm-up: one batch each
    dataset_attention_distance(handle, first_batch, batch_size=batch_size)
    results = []
    times = measure({
        "plain batched forward": lambda: plain_batched_inference(handle, model, paths, batch_size),
        "ours: dataset_attention_distance": lambda: results.append(
            dataset_attention_distance(handle, paths, batch_size=batch_size)),
        "decode + preprocess alone": lambda: decode_and_preprocess(handle, paths),
    }, repeats, warmup=0)
    done = results[-1]
    if done.num_images != count or done.skipped:
        raise RuntimeError(f"{name}: {done.num_images} of {count} images analysed, skipped: {done.skipped}")
    plain, ours = times["plain batched forward"], times["ours: dataset_attention_distance"]
    print(f"### {name}\n")
    print(markdown_table(("candidate", "median s for all images (min–max)", "images/s", "÷ plain images/s"),
                         [(k, t.s(), f"{count / t.median:.1f}", f"{plain.median / t.median:.2f}")
                          for k, t in times.items()]))
    print()
    ratio = plain.median / ours.median
    summary.append(["3. dataset distance ÷ plain batched forward (images/s)", name,
                    f"{count / ours.median:.1f} img/s", f"{count / plain.median:.1f} img/s", f"**{ratio:.2f}**",
                    f"≥ {THROUGHPUT_TARGET}", verdict(ratio, THROUGHPUT_TARGET, at_most=False)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", nargs="+", default=[str(SHARED / "data" / "imagenet_samples")],
                        help="image files or folders (the first --count images found, sorted, are used)")
    parser.add_argument("--count", type=int, default=32, help="how many images")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size of both sides")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="timm names (random weights)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the images per candidate")
    args = parser.parse_args()
    set_threads()
    paths = find_images(args.images)[:args.count]
    if len(paths) < args.count:
        parser.error(f"found {len(paths)} images in {args.images}, --count is {args.count}")
    print_header("Mean attention distance over a folder")
    print(f"{len(paths)} images from `{', '.join(args.images)}`, batch size {args.batch_size}; both sides include "
          f"reading, decoding and preprocessing. Median of {args.repeats} passes after a one-batch warm-up, "
          "candidates interleaved.\n")
    summary: list[list[str]] = []
    for name in args.models:
        bench_model(name, paths, args.batch_size, args.repeats, summary)
    print("### Summary\n")
    print(report("dataset", ("measure", "model", "ours", "baseline", "ratio", "target", "held"), summary,
                 key=("measure", "model")))


if __name__ == "__main__":
    main()

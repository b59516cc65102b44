"""The pass's one large copy to the host, the float16 queries and keys: ways to make it, and the pass with each.

On a GPU, `LayerStream.store` copies every layer's float16 Q and K, one (2, depth, heads, N, d) array (135 MB for
DINOv2-L/14 at 518), with `host_copy.to_host`: through one page-locked buffer, then into fresh host memory. For a
device array of that shape (random values), medians of ``--repeats`` after a warm-up:

- `pageable`: `.cpu()` (fresh pageable host memory each call, through the CUDA driver's staging);
- `pageable, touched`: `copy_` into host memory written once before (no page faults: the transfer alone);
- `pinned`: `copy_(non_blocking=True)` into page-locked memory allocated once, then a wait;
- `pinned, then fresh`: `host_copy.to_host`, what the pass does: the same, then a copy of it into fresh host
  memory by torch (all threads), which the result keeps (the page-locked buffer is reused by the next pass);
- `pinned, fresh`: page-locked memory allocated per call (`torch.empty(pin_memory=True)`, torch's cache of such
  memory emptied first, as for a result still held) and the copy; the result keeps page-locked memory.

Then the app's pass (`relevance=False`, no spill) as it is, interleaved with the same pass whose copies all go
through `.cpu()` (`host_copy.MIN_BYTES` above every copy: the pass before `to_host`): their medians, and the
largest difference of the latter's arrays from the pass's own. On the CPU (a dry run of this script) nothing is
page-locked and nothing waits: the same code runs, its times mean nothing.

    python -m bench.bench_host_copy [--models dinov2l_518] [--device cuda] [--repeats 5] [--json FILE]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from vit_inspect.passes import host_copy

from .common import REPO, measure, per_model_report

MB = 1e6


def wait(device: torch.device) -> None:
    """Wait for the work queued on ``device``'s current stream (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def empty_host_cache() -> None:
    """Release torch's cached page-locked host memory (a fresh allocation then asks the driver again)."""
    release = getattr(torch._C, "_host_emptyCache", None)
    if release is not None:
        release()


def pinned_fresh(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied into page-locked host memory of its own (the caller keeps it)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
    host.copy_(tensor, non_blocking=True)
    wait(tensor.device)
    return host


def copy_ways(shape: tuple[int, ...], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each way of copying a float16 device array of ``shape`` to the host."""
    source = torch.randn(shape, device=device).to(torch.float16)
    touched = torch.empty(shape, dtype=torch.float16)
    touched.fill_(0)
    pinned = torch.empty(shape, dtype=torch.float16, pin_memory=device.type == "cuda")

    def into(target: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            target.copy_(source, non_blocking=True)
            wait(device)
        return run

    def fresh_pinned() -> None:
        empty_host_cache()
        pinned_fresh(source)

    ways = {"pageable": lambda: source.cpu(), "pageable, touched": into(touched), "pinned": into(pinned),
            "pinned, then fresh": lambda: host_copy.to_host(source), "pinned, fresh": fresh_pinned}
    return {name: timing.median for name, timing in measure(ways, repeats=repeats).items()}


def largest_difference(a, b) -> float:
    """The largest |difference| between two results' attention stores and maps (inf where one lacks an array the
    other has, or its shape differs): 0 for the same values."""
    sa, sb = a.attention_store, b.attention_store
    pairs = [(sa.queries, sb.queries), (sa.keys, sb.keys), (sa.maps, sb.maps), (a.mean_distance, b.mean_distance),
             (a.patch_features, b.patch_features), (a.chefer, b.chefer), (a.gradcam, b.gradcam)]
    largest = 0.0
    for x, y in pairs:
        if x is None and y is None:
            continue
        if x is None or y is None or x.shape != y.shape:
            return float("inf")
        largest = max(largest, float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max(initial=0.0)))
    return largest


def measure_model(handle, picture, repeats: int) -> dict:
    """The copy ways for this model's Q/K array and the pass with each (see the module's docstring)."""
    from vit_inspect.passes.pipeline import analyze_image

    layout = handle.layout(handle.input_size)
    head_dim = handle.embed_dim // handle.num_heads
    shape = (2, handle.depth, handle.num_heads, layout.num_tokens, head_dim)
    out = {"shape": list(shape), "MB": int(np.prod(shape)) * 2 / MB,
           "copy_s": copy_ways(shape, repeats, handle.device)}
    held = {}

    def run(name: str, min_bytes: int) -> Callable[[], None]:
        def call() -> None:
            held.pop(name, None)
            kept, host_copy.MIN_BYTES = host_copy.MIN_BYTES, min_bytes
            try:
                held[name] = analyze_image(handle, picture, relevance=False)
            finally:
                host_copy.MIN_BYTES = kept
        return call

    passes = {"as it is": run("as it is", host_copy.MIN_BYTES), "through .cpu()": run("through .cpu()", 2 ** 62)}
    out["pass_s"] = {name: timing.median for name, timing in measure(passes, repeats=repeats).items()}
    # two passes on a GPU may differ by its run-to-run rounding; a wrong copy differs by far more
    out["difference"] = {name: largest_difference(held["as it is"], held[name]) for name in passes
                         if name != "as it is"}
    return out


def rows_of(label: str, found: dict) -> list[list[object]]:
    copies = ", ".join(f"{name} {s * 1e3:.1f} ms ({found['MB'] / 1e3 / s:.1f} GB/s)"
                       for name, s in found["copy_s"].items())
    base = found["pass_s"]["as it is"]
    passes = ", ".join(f"{name} {s * 1e3:.1f} ms" + ("" if name == "as it is" else
                                                     f" ({s / base:.2f}×, Δ {found['difference'][name]:.1e})")
                       for name, s in found["pass_s"].items())
    return [[label, f"{found['MB']:.0f} MB", copies, passes]]


HEADERS = ("model, input", "Q/K array", "its copy to the host, each way", "the app's pass with each copy")


def main() -> None:
    from vit_inspect.core.images import load_image

    from .bench_large import MODELS, _handle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["dinov2l_518"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cuda", help="cuda (cpu: a dry run, its times mean nothing)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the raw results, with this run's context, here")
    args = parser.parse_args()
    torch.manual_seed(0)
    picture = load_image(REPO / "assets" / "chelsea.png")
    per_model_report("The pass's copy of its queries and keys to the host",
                     {key: MODELS[key][3] for key in args.models},
                     lambda key: measure_model(_handle(key, args.device), picture, args.repeats),
                     rows_of, HEADERS, args.json)


if __name__ == "__main__":
    main()

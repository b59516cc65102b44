"""The pass's one large copy to the host, the float16 queries and keys: ways to make it, and the pass with each.

On a GPU, `LayerStream.store` copies every layer's float16 Q and K, one (2, depth, heads, N, d) array (135 MB for
DINOv2-L/14 at 518), with `Tensor.cpu()`: into fresh pageable memory, through the CUDA driver's staging buffers.
For a device array of that shape (random values), medians of ``--repeats`` after a warm-up:

- `pageable`: `.cpu()`, as the pass does (fresh host memory each call);
- `pageable, touched`: `copy_` into host memory written once before (no page faults: the transfer alone);
- `pinned`: `copy_(non_blocking=True)` into page-locked memory allocated once, then a wait;
- `pinned, then fresh`: the same, then a copy of it into fresh host memory by torch (all threads), which the
  result keeps (the page-locked buffer is reused by the next pass);
- `pinned, fresh`: page-locked memory allocated per call (`torch.empty(pin_memory=True)`, torch's cache of such
  memory emptied first, as for a result still held) and the copy; the result keeps page-locked memory.

Then the app's pass (`relevance=False`, no spill) as it is, interleaved with the same pass in which every
`Tensor.cpu()` of a device tensor of at least ``--min-mb`` MB goes the `pinned, then fresh` way, and the `pinned,
fresh` way: their medians, and the largest difference of their results' arrays from the pass's own. On the CPU (a
dry run of this script) nothing is page-locked and nothing waits: the same code runs, its times mean nothing.

    python -m bench.bench_host_copy [--models dinov2l_518] [--device cuda] [--repeats 5] [--json FILE]
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

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


class PinnedStaging:
    """One page-locked host buffer, grown as needed and reused: `copy` brings a device tensor to the host through
    it (a transfer at the link's speed) and then into fresh pageable memory by torch (all its threads)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None  # (bytes,) uint8, page-locked

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=tensor.is_cuda)
        staged = self.buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        staged.copy_(tensor, non_blocking=True)
        wait(tensor.device)
        return torch.empty(tensor.shape, dtype=tensor.dtype).copy_(staged)  # pageable, as `.cpu()` gives


def pinned_fresh(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied into page-locked host memory of its own (the caller keeps it)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
    host.copy_(tensor, non_blocking=True)
    wait(tensor.device)
    return host


@contextmanager
def large_copies_by(copy: Callable[[torch.Tensor], torch.Tensor], min_bytes: int,
                    device: torch.device) -> Iterator[None]:
    """Inside, `Tensor.cpu()` of a contiguous tensor on ``device``'s kind of device of at least ``min_bytes``
    bytes is ``copy(tensor)`` (on the CPU, where `.cpu()` returns the tensor itself, a dry run's copy)."""
    real = torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        if (not args and not kwargs and self.device.type == device.type and self.is_contiguous()
                and self.numel() * self.element_size() >= min_bytes):
            return copy(self)
        return real(self, *args, **kwargs)
    torch.Tensor.cpu = cpu
    try:
        yield
    finally:
        torch.Tensor.cpu = real


def copy_ways(shape: tuple[int, ...], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each way of copying a float16 device array of ``shape`` to the host."""
    source = torch.randn(shape, device=device).to(torch.float16)
    touched = torch.empty(shape, dtype=torch.float16)
    touched.fill_(0)
    pinned = torch.empty(shape, dtype=torch.float16, pin_memory=device.type == "cuda")
    staging = PinnedStaging()

    def into(target: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            target.copy_(source, non_blocking=True)
            wait(device)
        return run

    def fresh_pinned() -> None:
        empty_host_cache()
        pinned_fresh(source)

    ways = {"pageable": lambda: source.cpu(), "pageable, touched": into(touched), "pinned": into(pinned),
            "pinned, then fresh": lambda: staging.copy(source), "pinned, fresh": fresh_pinned}
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


def measure_model(handle, picture, repeats: int, min_bytes: int) -> dict:
    """The copy ways for this model's Q/K array and the pass with each (see the module's docstring)."""
    from vit_inspect.passes.pipeline import analyze_image

    layout = handle.layout(handle.input_size)
    head_dim = handle.embed_dim // handle.num_heads
    shape = (2, handle.depth, handle.num_heads, layout.num_tokens, head_dim)
    out = {"shape": list(shape), "MB": int(np.prod(shape)) * 2 / MB,
           "copy_s": copy_ways(shape, repeats, handle.device)}
    staging = PinnedStaging()
    held = {}

    def run(name: str, copy: Callable | None) -> Callable[[], None]:
        def call() -> None:
            held.pop(name, None)
            if copy is None:
                held[name] = analyze_image(handle, picture, relevance=False)
                return
            if copy is pinned_fresh:
                empty_host_cache()
            with large_copies_by(copy, min_bytes, handle.device):
                held[name] = analyze_image(handle, picture, relevance=False)
        return call

    passes = {"as it is": run("as it is", None), "pinned, then fresh": run("pinned, then fresh", staging.copy),
              "pinned, fresh": run("pinned, fresh", pinned_fresh)}
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
    parser.add_argument("--min-mb", type=float, default=4.0, help="copies of at least this size take the other way")
    parser.add_argument("--json", type=Path, help="also write the raw results, with this run's context, here")
    args = parser.parse_args()
    torch.manual_seed(0)
    picture = load_image(REPO / "assets" / "chelsea.png")
    per_model_report("The pass's copy of its queries and keys to the host",
                     {key: MODELS[key][3] for key in args.models},
                     lambda key: measure_model(_handle(key, args.device), picture, args.repeats, int(args.min_mb * MB)),
                     rows_of, HEADERS, args.json)


if __name__ == "__main__":
    main()

"""Redraws from a pass made on a GPU: what they cost on the host, as the app draws them, and what they would cost
on the device.

The app keeps a pass's result as host arrays: a ZeroGPU Space's worker holds the GPU for the pass only, so every
redraw runs on the CPU from the result's float16 queries and keys (a server with its own GPU also keeps the
app's spill folder: `bench_large`'s "app_spill"). For each model, from one app pass on the device (random
weights, chelsea.png, `relevance=False`, no spill):

- **host**: every redraw `bench_large` times (each a first, uncached call; "attention, readout query" and
  "rollout, defaults" are the first view's two attention maps), with torch's own thread count on this machine
  (the app sets none) and the first view's rollout also with ``--threads``;
- **device**: the first view's rollout rebuilt on the device from the store's queries and keys, copied back
  there first (the copy timed apart), softmax(s q kᵀ) rounded to float16 as the store's rows are, heads
  averaged, v ← v (½A + ½I) renormalised from the last layer down: what a redraw would cost if a result's
  queries and keys stayed on the GPU, and its largest difference from the host's map;
- **in the pass**: the whole rollout matrix of default options, R ← Â_l R layer by layer (N³ per layer, float32),
  from the same layers' head means already on the device: what keeping every query's default rollout (one
  (N, N) matrix) in a result would add to a pass on the GPU, and its readout row's largest difference from
  the host's map.

Times are medians of ``--repeats`` after a warm-up (device work synchronised); the host's redraws are single
first calls, as a user meets them.

    python -m bench.bench_gpu_redraws [--models vitl_384 dinov2l_518] [--device cuda] [--repeats 5] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .common import REPO, per_model_report


def median_s(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median seconds of ``repeats`` calls after one warm-up, the device synchronised after each."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    sync()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def host_redraws(handle, result) -> dict[str, float]:
    """Seconds of each of `bench_large`'s redraws from ``result``, a first (uncached) call each."""
    from .bench_large import _redraws

    result._rollouts.clear()
    seconds = {}
    for name, draw in _redraws(handle, "app", result, handle.layout(handle.input_size)).items():
        start = time.perf_counter()
        draw()
        seconds[name] = time.perf_counter() - start
    return seconds


def head_means(queries: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (N, N) float32 mean over heads of softmax(s q kᵀ) rounded to float16 (the store's rows),
    from (depth, heads, N, d) queries and keys on the device."""
    means = []
    for layer in range(queries.shape[0]):
        scores = torch.matmul(queries[layer].float(), keys[layer].float().transpose(-1, -2)) * scale[layer]
        means.append(torch.softmax(scores, dim=-1).to(torch.float16).float().mean(0))  # (N, N)
    return means


def rollout_row(means: list[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """(N,) v^T Â_{L-1} ... Â_0 with Â = (½A + ½I) renormalised per row (`analysis.rollout.row_product`), from
    the last layer down: N² per layer."""
    vector = weights
    for fused in reversed(means):
        row_sums = 0.5 * fused.sum(-1) + 0.5  # (N,)
        scaled = vector / row_sums
        vector = (0.5 * scaled) @ fused + 0.5 * scaled
    return vector


def rollout_matrix(means: list[torch.Tensor]) -> torch.Tensor:
    """(N, N) R = Â_{L-1} ... Â_0 built from the first layer up, as a pass would while its layers come."""
    eye = torch.eye(means[0].shape[0], device=means[0].device)
    product = eye
    for fused in means:
        prepared = 0.5 * fused + 0.5 * eye
        product = (prepared / prepared.sum(-1, keepdim=True)) @ product
    return product


def measure_model(handle, picture, repeats: int, threads: int) -> dict:
    """The host, device and in-the-pass figures of one model (see the module's docstring)."""
    from vit_inspect.passes.attention_store import query_vector
    from vit_inspect.passes.pipeline import analyze_image

    device = handle.device
    layout = handle.layout(handle.input_size)
    analyze_image(handle, picture, relevance=False)  # warm-up: lazy initialisation is no part of a pass
    result = analyze_image(handle, picture, relevance=False)
    store = result.attention_store
    out = {"tokens": layout.num_tokens, "store": store.mode, "torch_threads": torch.get_num_threads()}
    with torch.no_grad():
        pixels = handle.preprocess.apply(picture)[0].to(device)
        out["forward_s"] = median_s(lambda: handle.model(pixels), repeats, device)
    out["host_s"] = host_redraws(handle, result)
    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result._rollouts.clear()
        start = time.perf_counter()
        host_map = result.rollout()
        out["host_first_rollout_threads"] = threads
        out["host_first_rollout_s"] = time.perf_counter() - start
    finally:
        torch.set_num_threads(default_threads)
    if store.queries is None:  # a store of maps: nothing to rebuild
        return out
    weights = torch.from_numpy(query_vector(layout, result.readout)).to(device, torch.float32)
    scale = torch.from_numpy(store.scale).to(device, torch.float32)
    held = {}

    def to_device():
        held["q"] = torch.from_numpy(store.queries).to(device)
        held["k"] = torch.from_numpy(store.keys).to(device)

    def device_rollout():
        held["row"] = rollout_row(head_means(held["q"], held["k"], scale), weights)

    out["device_copy_s"] = median_s(to_device, repeats, device)
    out["device_rollout_s"] = median_s(device_rollout, repeats, device)
    grid = layout.to_grid(layout.patches(held["row"].cpu().numpy()))
    out["device_max_difference"] = float(np.abs(grid - host_map).max() / np.abs(host_map).max())
    with torch.no_grad():
        means = head_means(held["q"], held["k"], scale)
        out["in_pass_matrix_s"] = median_s(lambda: held.__setitem__("matrix", rollout_matrix(means)), repeats, device)
        row = weights @ held["matrix"]
    grid = layout.to_grid(layout.patches(row.cpu().numpy()))
    out["in_pass_max_difference"] = float(np.abs(grid - host_map).max() / np.abs(host_map).max())
    out["in_pass_matrix_MB"] = layout.num_tokens ** 2 * 4 / 1e6
    return out


def rows_of(label: str, found: dict) -> list[list[object]]:
    """One table row per model: forward, the host's first view and slowest redraw, the device's figures."""
    host = found["host_s"]
    slowest = max(host, key=host.get)
    first = host["attention, readout query"] + host["rollout, defaults"]
    forward = found["forward_s"]
    device = (f"{found['device_rollout_s'] * 1e3:.1f} ms + {found['device_copy_s'] * 1e3:.1f} ms copy "
              f"(Δ {found['device_max_difference']:.1e})" if "device_rollout_s" in found else "–")
    in_pass = (f"{found['in_pass_matrix_s'] * 1e3:.1f} ms, {found['in_pass_matrix_MB']:.1f} MB "
               f"(Δ {found['in_pass_max_difference']:.1e})" if "in_pass_matrix_s" in found else "–")
    return [[label, f"{forward * 1e3:.1f} ms",
             f"{first:.3f} s ({first / forward:.1f}×); rollout {found['host_first_rollout_s']:.3f} s with "
             f"{found['host_first_rollout_threads']} threads",
             f"{host[slowest]:.3f} s ({host[slowest] / forward:.1f}×, {slowest})", device, in_pass]]


HEADERS = ("model, input", "forward (GPU)", "first view's two attention maps on the host (÷ forward)",
           "slowest redraw on the host (÷ forward)", "first view's rollout on the device (+ copy of Q/K there)",
           "rollout matrix built in the pass (kept bytes)")


def main() -> None:
    from vit_inspect.core.images import load_image

    from .bench_large import MODELS, _handle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vitl_384", "dinov2l_518"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="the first view's rollout also with this many threads")
    parser.add_argument("--json", type=Path, help="also write the raw results, with this run's context, here")
    args = parser.parse_args()
    torch.manual_seed(0)
    picture = load_image(REPO / "assets" / "chelsea.png")
    print(f"torch threads: {torch.get_num_threads()} (this machine's default; {os.cpu_count()} logical cores)\n")
    per_model_report("Redraws from a pass made on the GPU: on the host, and on the device",
                     {key: MODELS[key][3] for key in args.models},
                     lambda key: measure_model(_handle(key, args.device), picture, args.repeats, args.threads),
                     rows_of, HEADERS, args.json)


if __name__ == "__main__":
    main()

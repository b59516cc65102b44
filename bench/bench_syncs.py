"""Where the app's pass waits for its device and copies to the host, listed by the line of vit_inspect that asks.

Three records of the same pass (the app's, `relevance=False`; with ``--spill`` also the pass a server with
its own GPU runs, with the app's spill folder, for models whose maps it spills), each after one warm-up pass:

- **host calls**: the calls that ask for host values (`Tensor.cpu`, `.numpy`, `.item`, `.tolist`), counted by
  the first vit_inspect frame on the stack, as tests/passes/test_transfers.py counts them (any device);
- **syncs** (CUDA): every operation that makes the host wait for the GPU, as
  `torch.cuda.set_sync_debug_mode("warn")` reports it (a copy to or from pageable host memory, `.item()`,
  `nonzero`, a stream synchronisation), by the first vit_inspect frame on the stack and that line's code;
- **profile** (CUDA): the same pass's CUDA runtime calls that wait (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize`), its `cudaMemcpyAsync` calls, and its copies by
  direction with their GPU time, from `torch.profiler`.

    python -m bench.bench_syncs [--models vitb_224 dinov2l_518] [--device cuda] [--spill] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import json
import linecache
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from .common import REPO, markdown_table, print_header, run_context, set_threads

HOST_CALLS = ("cpu", "numpy", "item", "tolist")
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
PACKAGE = "/vit_inspect/"


def vit_inspect_site(stack: traceback.StackSummary) -> str:
    """"file:line  code" of the innermost vit_inspect frame of ``stack`` (paths below the package), or "?"; with
    "[in file:line]" of the innermost frame when that is another package's (torch's, timm's), the warnings
    machinery and this module left out."""
    frames = [f for f in stack if not f.filename.endswith(("warnings.py", "bench_syncs.py"))]
    site = next((f for f in reversed(frames) if PACKAGE in f.filename), None)
    if site is None:
        return "?"
    where = f"{site.filename.rsplit(PACKAGE, 1)[1]}:{site.lineno}"
    code = (site.line or linecache.getline(site.filename, site.lineno)).strip()
    inner = frames[-1]
    within = "" if inner is site else f"  [in {'/'.join(Path(inner.filename).parts[-2:])}:{inner.lineno}]"
    return f"{where}  {code}{within}"


@contextmanager
def counting_host_calls(counted: collections.Counter) -> Iterator[None]:
    """Count ``(method, site)`` of every host call of `HOST_CALLS` made inside, restored on leaving."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_CALLS}

    def counting(name: str, real: Callable):
        def call(self, *args, **kwargs):
            counted[(name, vit_inspect_site(traceback.extract_stack()[:-1]))] += 1
            return real(self, *args, **kwargs)
        return call
    try:
        for name, real in originals.items():
            setattr(torch.Tensor, name, counting(name, real))
        yield
    finally:
        for name, real in originals.items():
            setattr(torch.Tensor, name, real)


@contextmanager
def recording_syncs(counted: collections.Counter) -> Iterator[None]:
    """Count the site of every synchronising CUDA operation made inside (`torch.cuda.set_sync_debug_mode`'s
    warnings, each taken with the stack it was raised on); other warnings are shown as usual."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                counted[vit_inspect_site(traceback.extract_stack()[:-1])] += 1
            else:
                shown(message, category, filename, lineno, file, line)
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def profiled_waits(run: Callable[[], object]) -> dict[str, dict[str, float]]:
    """name -> {"count", "gpu_ms"}: the CUDA runtime calls of `WAITS` and `cudaMemcpyAsync` that ``run`` makes
    (host-side events), and its copies ("Memcpy DtoH (Device -> Pageable)", ...) with their GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    found = {}
    for event in prof.key_averages():
        if event.key in WAITS or event.key == "cudaMemcpyAsync" or event.key.startswith("Memcpy"):
            gpu_us = getattr(event, "device_time_total", 0.0) if event.key.startswith("Memcpy") else 0.0
            found[event.key] = {"count": int(event.count), "gpu_ms": gpu_us / 1e3}
    return found


def list_pass(handle, picture, spill=None) -> dict:
    """The three records of one app pass over ``picture`` (the last two on CUDA only), after a warm-up."""
    from vit_inspect.passes.pipeline import analyze_image

    cuda = handle.device.type == "cuda"

    def run():
        return analyze_image(handle, picture, relevance=False, spill=spill)

    run()  # warm-up: lazy initialisation (cuBLAS handles, kernels loaded) is no part of a pass
    calls: collections.Counter = collections.Counter()
    with counting_host_calls(calls):
        store = run().attention_store
    out = {"store": store.mode, "spilled": store.spill is not None,
           "host_calls": [[name, site, n] for (name, site), n in sorted(calls.items(), key=lambda kv: kv[0][1])]}
    if cuda:
        syncs: collections.Counter = collections.Counter()
        with recording_syncs(syncs):
            run()
            torch.cuda.synchronize()
        out["syncs"] = [[site, n] for site, n in sorted(syncs.items())]
        out["profile"] = profiled_waits(run)
    return out


def short(site: str, width: int = 110) -> str:
    """A site cut to ``width`` characters, for a table."""
    return site if len(site) <= width else site[:width - 1] + "…"


def rows_of(label: str, listed: dict) -> list[list[object]]:
    """Table rows (model and pass, record, site, count) of one `list_pass` result."""
    rows = [[label, "sync", short(site), n] for site, n in listed.get("syncs", [])]
    by_site: dict[str, list[str]] = {}
    for name, site, n in listed["host_calls"]:
        by_site.setdefault(site, []).append(f".{name}() {n}")
    rows += [[label, "host calls", short(site), ", ".join(calls)] for site, calls in by_site.items()]
    for name, found in sorted(listed.get("profile", {}).items()):
        time = f", {found['gpu_ms']:.2f} ms GPU" if name.startswith("Memcpy") else ""
        rows.append([label, "profile", name + time, found["count"]])
    return rows


def totals(listed: dict) -> str:
    """One line: syncs, host calls, profiled waits and device-to-host copies of one pass."""
    words = [f"{sum(n for _, n in listed.get('syncs', []))} syncs" if "syncs" in listed else "syncs: CUDA only",
             f"{sum(n for *_, n in listed['host_calls'])} host calls"]
    profile = listed.get("profile", {})
    if profile:
        waits = sum(found["count"] for name, found in profile.items() if name in WAITS)
        copies = {name: found for name, found in profile.items() if name.startswith("Memcpy DtoH")}
        words += [f"{waits} waits in the CUDA runtime",
                  f"{sum(f['count'] for f in copies.values())} copies to the host "
                  f"({sum(f['gpu_ms'] for f in copies.values()):.1f} ms GPU)"]
    return ", ".join(words)


def main() -> None:
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder, worth_spilling

    from .bench_large import MODELS, _handle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vitb_224", "dinov2l_518"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--spill", action="store_true", help="also the pass with the app's spill folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the raw lists, with this run's context, here")
    args = parser.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    print_header("The pass's synchronisations and copies to the host, by site")
    picture = load_image(REPO / "assets" / "chelsea.png")
    listed, rows = {}, []
    for key in args.models:
        handle = _handle(key, args.device)
        layout = handle.layout(handle.input_size)
        passes = {"app": None}
        if args.spill and worth_spilling(layout.num_tokens, handle.embed_dim, handle.num_heads):
            passes["app, spill"] = SpillFolder(DEFAULT_SPILL_BUDGET)
        for name, spill in passes.items():
            label = f"{MODELS[key][3]}: {name}"
            listed[label] = list_pass(handle, picture, spill)
            rows += rows_of(label, listed[label])
            print(f"{label}: {totals(listed[label])}", flush=True)
    print()
    print(markdown_table(("model: pass", "record", "site (first vit_inspect frame) or event", "count"), rows))
    if args.json:
        args.json.write_text(json.dumps({"context": run_context(), "passes": listed}, indent=1))


if __name__ == "__main__":
    main()

"""The GPU checks that read one loaded model each, in one process: the pass's synchronisations
(`bench_syncs`), redraws from a GPU pass (`bench_gpu_redraws`) and the copy of its queries and keys to the host
(`bench_host_copy`). Each model is made once; a part that fails is recorded with its error and the others go on;
the JSON is rewritten after every part, so a run cut short keeps what it finished.

    python -m bench.gpu_extras --json FILE [--device cuda] [--models dinov2l_518 vitb_224 vitl_384] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

from .common import REPO, print_header, run_context

# model -> the parts run for it, in order
PARTS = {"dinov2l_518": ("syncs", "redraws", "host_copy"), "vitb_224": ("syncs",), "vitl_384": ("redraws", "host_copy")}


def run_part(part: str, handle, picture, repeats: int) -> dict:
    """One part's raw results for one model (a dict of the part's own module)."""
    if part == "syncs":
        from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder, worth_spilling

        from .bench_syncs import list_pass, totals
        layout = handle.layout(handle.input_size)
        listed = {"app": list_pass(handle, picture)}
        if worth_spilling(layout.num_tokens, handle.embed_dim, handle.num_heads):
            listed["app, spill"] = list_pass(handle, picture, SpillFolder(DEFAULT_SPILL_BUDGET))
        for name, found in listed.items():
            print(f"  {name}: {totals(found)}", flush=True)
        return listed
    if part == "redraws":
        from .bench_gpu_redraws import measure_model
        return measure_model(handle, picture, repeats, threads=2)
    from .bench_host_copy import measure_model as copy_measure
    return copy_measure(handle, picture, repeats)


def main() -> None:
    from vit_inspect.core.images import load_image

    from .bench_large import MODELS, _handle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(PARTS), choices=sorted(MODELS))
    parser.add_argument("--parts", nargs="+", default=["syncs", "redraws", "host_copy"],
                        choices=["syncs", "redraws", "host_copy"])
    parser.add_argument("--device", default="cuda", help="cuda (cpu: a dry run of the same code)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, required=True, help="the raw results, with this run's context")
    args = parser.parse_args()
    torch.manual_seed(0)
    print_header("GPU checks on one loaded model each: syncs, redraws, the copy to the host")
    picture = load_image(REPO / "assets" / "chelsea.png")
    found: dict[str, dict] = {"context": run_context(), "torch_threads": torch.get_num_threads()}
    args.json.write_text(json.dumps(found, indent=1))
    for key in args.models:
        label = MODELS[key][3]
        handle = _handle(key, args.device)
        for part in PARTS.get(key, args.parts):
            if part not in args.parts:
                continue
            start = time.perf_counter()
            print(f"{label}: {part}", flush=True)
            try:
                found.setdefault(part, {})[label] = run_part(part, handle, picture, args.repeats)
            except Exception:  # recorded; the other parts go on
                found.setdefault(part, {})[label] = {"error": traceback.format_exc(limit=-4)}
                print(found[part][label]["error"], flush=True)
            print(f"{label}: {part} took {time.perf_counter() - start:.1f} s", flush=True)
            args.json.write_text(json.dumps(found, indent=1))
        del handle
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Spilled attention maps (`vit_inspect.passes.spill`) for many-token models: the pass with and without the spill,
and every costly first rollout redraw read from the spill against rebuilt from q and k, each ÷ one plain
forward of the model, in one run.

Both redraws run on the same result (`dataclasses.replace(store, spill=None)` is the rebuilding one);
nothing is cached between calls. Writing one image's planes is timed apart, into a new file (the previous
spill dropped, its file removed) and into the file of a released spill (`SpillFolder` keeps it for the next
spill of its size, which overwrites it in place). Candidates are interleaved (bench.common.measure). Random weights.
The spill's file lives in a fresh `SpillFolder` in the system's temporary folder (its page cache is warm
after the pass wrote it, as in the app).

    python -m bench.bench_spill [--models dinov2s_518] [--repeats 3] [--threads 1]
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from .bench_large import MODELS, _handle
from .bench_rollout_redraw import options, parse_model_args
from .common import markdown_table, measure, print_header


def run(key: str, repeats: int, image: Path) -> list[list[object]]:
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.attention_store import rollout
    from vit_inspect.passes.pipeline import analyze_image
    from vit_inspect.passes.spill import PLANES, SpillFolder, worth_spilling

    torch.manual_seed(0)
    handle = _handle(key, "cpu")
    picture = load_image(image)
    folder = SpillFolder(8 * 2 ** 30)
    folders = [folder]
    try:
        result = analyze_image(handle, picture, relevance=False, spill=folder)
        store, layout = result.attention_store, result.layout
        if store.spill is None:
            raise RuntimeError(f"{key}: nothing spilled (N = {layout.num_tokens}, D = {handle.embed_dim}, "
                               f"worth spilling: {worth_spilling(layout.num_tokens, handle.embed_dim, handle.num_heads)})")
        rebuilt = dataclasses.replace(store, spill=None)
        pixels = handle.preprocess.apply(picture)[0]

        def forward():
            with torch.no_grad():
                handle.model(pixels)

        shape = store.spill.shape
        values = {name: np.full(shape[1:], 0.5, dtype) for name, dtype in PLANES}
        fresh, recycling = SpillFolder(8 * 2 ** 30), SpillFolder(8 * 2 ** 30)
        folders.extend((fresh, recycling))

        def write(into: SpillFolder) -> None:
            spill = into.reserve(shape)
            for layer in range(shape[0]):
                spill.write(layer, values)
            assert spill.finish()
            if into is fresh:
                into.drop(spill)  # its file removed; with `recycling`, released on return and its file kept

        candidates = {"forward": forward, "write, new file": lambda: write(fresh),
                      "write, reused file": lambda: write(recycling),
                      "pass": lambda: analyze_image(handle, picture, relevance=False),
                      "pass, spilled": lambda: analyze_image(handle, picture, relevance=False, spill=folder)}
        for name, option in options(handle, layout).items():
            candidates[(name, "rebuilt")] = lambda o=option: rollout(rebuilt, layout, **o)
            candidates[(name, "spilled")] = lambda o=option: rollout(store, layout, **o)
        timings = measure(candidates, repeats)
        forward_s = timings["forward"].median
        label = f"{MODELS[key][3]} (N = {layout.num_tokens}, D = {handle.embed_dim})"
        rows = [[label, "the pass (÷ forward)", timings["pass"].ms(), timings["pass, spilled"].ms(),
                 f"{timings['pass'].median / forward_s:.3f}", f"{timings['pass, spilled'].median / forward_s:.3f}",
                 f"spill file {store.spill.nbytes / 1e6:.1f} MB, kept in memory {store.nbytes() / 1e6:.1f} MB"]]
        for name in options(handle, layout):
            old, new = timings[(name, "rebuilt")], timings[(name, "spilled")]
            rows.append([label, f"first redraw: {name}", old.ms(), new.ms(), f"{old.median / forward_s:.3f}",
                         f"{new.median / forward_s:.3f}", f"{old.median / new.median:.2f}x faster"])
        new_file, reused = timings["write, new file"], timings["write, reused file"]
        rows.append([label, "writing the planes (new file; a released spill's file)", new_file.ms(), reused.ms(),
                     f"{new_file.median / forward_s:.3f}", f"{reused.median / forward_s:.3f}",
                     f"{new_file.median / reused.median:.1f}x faster reused, {store.spill.nbytes / 1e6:.0f} MB"])
        rows.append([label, "plain forward", timings["forward"].ms(), "", "", "", ""])
        return rows
    finally:
        for each in folders:
            each.close()


def main() -> None:
    args, _ = parse_model_args(__doc__, ["dinov2s_518"], 3, before_tree=False)
    print_header(f"Spilled maps against rebuilding from q and k ({args.threads} thread(s), "
                 f"{args.repeats} interleaved repeats, medians)")
    rows = [row for key in args.models for row in run(key, args.repeats, args.image)]
    print(markdown_table(("model", "what", "without spill ms", "with spill ms", "without ÷ forward",
                          "with ÷ forward", "note"), rows))


if __name__ == "__main__":
    main()

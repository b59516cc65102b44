"""How fast a feature's gallery opens from an SAE's feature index (`core.sae_index`), goal ≤ 0.3 s.

Each timed call picks the next of a seeded list of features (a gallery never repeats the last one's reads):

1. cold: `read_index` of the file (header checks, the small tensors, the crops memory-mapped), then the
   feature's entry and its PIL gallery (`plots.sae.feature_gallery`), as a notebook or CLI opening it first;
2. warm: the index already read (the app holds it): the entry and the PIL gallery;
3. warm, as a matplotlib Figure (`feature_gallery_figure`) rendered to pixels.

    python -m bench.bench_sae_gallery --index FILE [--repeats 20] [--seed 0]
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from vit_inspect.core.sae_index import read_index
from vit_inspect.plots.sae import feature_gallery, feature_gallery_figure

from .common import figure_image, measure, print_header, report, set_threads, verdict

GOAL_S = 0.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True, help="a feature index (<sae stem>.index.safetensors)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    set_threads()
    held = read_index(args.index)
    order = itertools.cycle(np.random.default_rng(args.seed).permutation(held.features).tolist())

    def cold():
        index = read_index(args.index)
        return feature_gallery(index.feature(next(order)), index.patch_size)

    def warm():
        return feature_gallery(held.feature(next(order)), held.patch_size)

    def warm_figure():
        return figure_image(feature_gallery_figure(held.feature(next(order)), held.patch_size))

    timings = measure({"cold: read the index, one gallery (PIL)": cold, "warm: one gallery (PIL)": warm,
                       "warm: one gallery (matplotlib, rendered)": warm_figure}, repeats=args.repeats)
    print_header("Opening a feature's gallery from the index")
    headers = ("index", "features", "top", "crop", "step", "median s", "max s", "goal <= 0.3 s")
    rows = [(Path(args.index).name, held.features, held.top, held.crops.shape[2], step, f"{t.median:.4f}",
             f"{max(t.seconds):.4f}", verdict(t.median, GOAL_S, at_most=True)) for step, t in timings.items()]
    print(report("sae_gallery", headers, rows, key=("index", "step")))


if __name__ == "__main__":
    main()

"""Drawing one map as the app shows it (`map_plots.map_panel`: overlay, colour bar, caption) and encoding it
as PNG, what a slider redraw waits for after its maps are computed: another version's `plots` with
that version's app encoding (its `canvas.encode_png`, or Gradio's own, PIL's default PNG level, for a
version without one) against this checkout's (`canvas.encode_png`), each ÷ one plain forward of the model.

The other version's package is loaded from ``--before-tree`` under another name, e.g.

    git archive REV vit_inspect | tar -x -C /tmp/before_tree   # REV: the version to compare with

The maps are the cached result's own (attention of every layer, rollout, Grad-CAM of every layer) of
`assets/chelsea.png`; both versions must draw the same pixels and their PNGs decode to them (checked
before timing). Every call gets a
caption it has not drawn before (a counter in its first line, as a slider's new value would be), so text
kept from earlier redraws helps only where a real redraw would reuse it (tick labels, the unit, the
second caption line). Candidates are interleaved (bench.common.measure). Random weights.

    python -m bench.bench_render --before-tree /tmp/before_tree [--models deit_ti_224 vitb_224]
                                 [--repeats 11] [--threads 1]
"""
from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .bench_analysis import gradio_default_png
from .bench_large import MODELS, _handle
from .bench_rollout_redraw import parse_model_args
from .common import markdown_table, measure, plain_forward, plain_model, print_header


def maps_of(key: str, image: Path) -> tuple[object, Image.Image, np.ndarray, list[tuple[np.ndarray, str, dict]], str]:
    """(handle, the upload, the crop, [(grid map, unit, map_panel options)], the caption's second line) of one
    analysis."""
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.pipeline import analyze_image

    torch.manual_seed(0)
    handle = _handle(key, "cpu")
    picture = load_image(image)
    result = analyze_image(handle, picture, relevance=False)
    patch = (result.layout.grid_h // 2, result.layout.grid_w // 2)
    maps = [(result.attention_map(layer, None, None), "attention weight", {}) for layer in range(handle.depth)]
    maps += [(result.attention_map(handle.depth - 1, 0, patch), "attention weight", {"marker": patch}),
             (result.rollout("mean", 0.9), "share of attention", {})]
    if result.gradcam is not None:
        maps += [(grid, "Grad-CAM (ReLU)", {"relu": True}) for grid in result.gradcam]
    second = f"class {result.target} ({float(result.probs.max()):.1%}); colour: min-max of this map"
    return handle, picture, result.rgb, maps, second


def run(key: str, before, repeats: int, image: Path) -> list[list[object]]:
    import importlib

    from vit_inspect.plots import canvas
    from vit_inspect.plots import maps as map_plots

    try:  # a tree from before the plots/ package kept every picture in one module
        before_plotting = importlib.import_module(f"{before.__name__}.plots.maps")
        before_encode = importlib.import_module(f"{before.__name__}.plots.canvas").encode_png
    except ModuleNotFoundError:
        before_plotting = importlib.import_module(f"{before.__name__}.plotting")
        before_encode = getattr(before_plotting, "encode_png", gradio_default_png)
    handle, picture, rgb, maps, second = maps_of(key, image)
    counter = itertools.count()

    def drawer(module, encode):
        cycle = itertools.cycle(maps)

        def draw() -> bytes:
            grid, unit, options = next(cycle)
            caption = f"{handle.name} (random weights) · redraw {next(counter)}\n{second}"
            return encode(module.map_panel(rgb, grid, caption, unit, **options))
        return draw

    sizes_before, sizes_after = [], []  # PNG bytes of each map's panel
    for grid, unit, options in maps:  # the same pixels, or the timing compares different pictures
        panel = map_plots.map_panel(rgb, grid, "x\ny", unit, **options)
        if not np.array_equal(panel, before_plotting.map_panel(rgb, grid, "x\ny", unit, **options)):
            raise RuntimeError(f"{key}: the two versions draw different panels")
        for encode, kept in ((before_encode, sizes_before), (canvas.encode_png, sizes_after)):
            data = encode(panel)
            if not np.array_equal(np.asarray(Image.open(io.BytesIO(data))), panel):
                raise RuntimeError(f"{key}: {encode.__module__}.{encode.__name__} does not give the panel back")
            kept.append(len(data))
    pixels, _ = handle.preprocess.apply(picture)
    model = plain_model(handle)
    times = measure({"forward": lambda: plain_forward(model, pixels),
                     "before": drawer(before_plotting, before_encode),
                     "after": drawer(map_plots, canvas.encode_png)}, repeats)
    forward = times["forward"].median
    old, new = times["before"], times["after"]
    return [[MODELS[key][3], old.ms(), new.ms(), f"{old.median / forward:.3f}", f"{new.median / forward:.3f}",
             f"{old.median / new.median:.2f}x", f"{np.median(sizes_before) / 1e3:.1f}", f"{np.median(sizes_after) / 1e3:.1f}",
             times["forward"].ms()]]


def main() -> None:
    args, before = parse_model_args(__doc__, ["deit_ti_224", "vitb_224"], 11)
    print_header(f"A map panel drawn and encoded as PNG, before and after ({args.threads} thread(s), "
                 f"{args.repeats} interleaved repeats, medians)")
    rows = [row for key in args.models for row in run(key, before, args.repeats, args.image)]
    print(markdown_table(("model", "before ms", "after ms", "before ÷ forward", "after ÷ forward", "speed-up",
                          "before PNG KB", "after PNG KB", "plain forward ms"), rows))


if __name__ == "__main__":
    main()

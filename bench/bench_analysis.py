"""Per-image analysis, redraw and per-session memory, each against plain passes of the same model
and against the naive way (one pass per method, a full recompute per slider change).

1. the per-image analysis (`analyze_image` as the app runs it: no AttnLRP/LeGrad, the app's spill folder
   (`spill.worth_spilling`), + top-5) ÷ one plain
   forward + backward, and ÷ the floor (forward + input-only backward)        target <= 1.15
1c. the same pass with AttnLRP and LeGrad in it (``relevance=True``, the CLI's) ÷ the floor
1d. AttnLRP and LeGrad added later (`relevance_maps`: one more forward) ÷ the floor
1e. with ``--before-tree``: this checkout's analysis ÷ another version's (its own `load_model` and
    `analyze_image`, the same arguments, interleaved with the rest): a change to the pass as a ratio
2. one redraw from the cached `ImageAnalysis`, rendering included (the app's `map_plots.map_panel`: overlay, colour
   bar and caption, encoded as PNG), ÷ one plain forward
                                                                      target <= 0.25 (ViT-B/16)
4. memory one analysed image holds (ViT-B/16)                                  target <= 30 MB

Models have random weights (timing does not depend on them); everything runs on the CPU with
THREADS torch threads.

    python -m bench.bench_analysis [--models NAME ...] [--repeats 5] [--threads 2] [--image assets/chelsea.png]
                                   [--before-tree DIR] [--idle-ms 30]

    git archive REV vit_inspect | tar -x -C /tmp/before_tree   # REV: the version to compare with
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import itertools
import pickle
import sys
import tracemalloc
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis import attention_map, chefer_relevance, gradcam_from_tokens, mean_attention_distance, rollout
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image, readout_query, relevance_maps
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder
from vit_inspect.plots import canvas
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots import maps as map_plots

from .bench_rollout_redraw import load_package
from .common import (MODELS, REPO, THREADS, markdown_table, measure, other_module, plain_forward,
                     plain_forward_backward, plain_forward_input_backward, plain_model, print_header, report,
                     set_threads, verdict)

ANALYSIS_TARGET = 1.15  # analysis ÷ plain forward + backward, at most
REDRAW_TARGET = 0.25  # redraw ÷ plain forward, at most, for REDRAW_TARGET_MODEL
REDRAW_TARGET_MODEL = "vit_base_patch16_224"
MEMORY_TARGET_MB = 30.0  # per analysed image, at most, for MEMORY_TARGET_MODEL
MEMORY_TARGET_MODEL = "vit_base_patch16_224"
IMAGE_FORMAT = "PNG"  # what the app's gr.Image outputs (format="png") encode a numpy overlay to
MB = 1e6
OTHER = "the other version's analyze_image + top-5 (--before-tree; not in the other ratios)"


# --------------------------------------------------------------------------- the naive way

def _naive_capture(handle: ViTHandle, picture: Image.Image) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Preprocess + one forward with attention capture: (attention (depth, heads, N, N), probs, rgb)."""
    pixels, rgb = handle.preprocess.apply(picture)
    with torch.no_grad(), capture_attention(handle) as rec:
        logits = handle.forward(pixels)  # (1, num_classes)
    return rec.attention[0].numpy(), logits[0].softmax(-1).numpy(), rgb


def _naive_gradcam(handle: ViTHandle, picture: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """Grad-CAM at every block's first LayerNorm the way saliency libraries do it: hooks on the plain
    (fused-attention) model, one forward + backward for this method alone.
    Returns ((depth, grid_h, grid_w) maps, the rgb crop)."""
    pixels, rgb = handle.preprocess.apply(picture)
    layout = handle.layout()
    saved: dict[int, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda m, args, out, i=i: saved.__setitem__(i, out))
             for i, module in enumerate(handle.norm1_modules)]
    try:
        with torch.enable_grad():
            logits = handle.forward(pixels)
            top = int(logits[0].argmax())
            activations = [saved[i] for i in range(handle.depth)]  # each (1, N, D)
            grads = torch.autograd.grad(logits[0, top], activations)
    finally:
        for hook in hooks:
            hook.remove()
    return np.stack([gradcam_from_tokens(a[0].detach().numpy(), g[0].numpy(), layout)
                     for a, g in zip(activations, grads)]), rgb


def _naive_chefer(handle: ViTHandle, picture: Image.Image) -> np.ndarray:
    """Gradient-weighted attention (Chefer et al. 2021) with its own forward + backward. (grid_h, grid_w)."""
    pixels, _ = handle.preprocess.apply(picture)
    with torch.enable_grad(), capture_attention(handle) as rec:
        logits = handle.forward(pixels)
        rec.backward(logits[0, int(logits[0].argmax())])
    return chefer_relevance(rec.attention[0].numpy(), rec.attention_grad()[0].numpy(), handle.layout(),
                            query=readout_query(handle))


def naive_analysis(handle: ViTHandle, picture: Image.Image) -> None:
    """Every method of `analyze_image`, one pass per method: raw attention (+ top-5), rollout and
    distances each with their own forward, Grad-CAM and Chefer each with their own forward + backward."""
    layout = handle.layout()
    _, probs, _ = _naive_capture(handle, picture)  # raw attention maps and top-5
    handle.top_labels(probs, 5)
    attention, _, _ = _naive_capture(handle, picture)
    rollout(attention, layout, query=readout_query(handle))
    attention, _, _ = _naive_capture(handle, picture)
    mean_attention_distance(attention, layout)
    _naive_gradcam(handle, picture)
    _naive_chefer(handle, picture)


# --------------------------------------------------------------------------- redraws

def encode_image(rgb: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 picture encoded as the app's image outputs send it (`ui.common.OutputImage`:
    `canvas.encode_png`, PNG at zlib level `canvas.PNG_LEVEL`)."""
    return canvas.encode_png(rgb)


def gradio_default_png(rgb: np.ndarray) -> bytes:
    """The same picture as Gradio's own encoder sends a numpy output (PIL's default PNG level, 6)."""
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format=IMAGE_FORMAT)
    return buffer.getvalue()


def panel(rgb: np.ndarray, grid_map: np.ndarray, caption: str, unit: str, **options) -> bytes:
    """What the app shows for one map: `map_plots.map_panel` (overlay, colour bar, caption), encoded."""
    return encode_image(map_plots.map_panel(rgb, grid_map, caption, unit, **options))


@dataclasses.dataclass(frozen=True)
class Redraw:
    """One kind of slider/option change: its states (cycled through, so no call repeats the last),
    the redraw from the cached result, and the naive full recompute from the image."""

    name: str
    states: tuple  # successive UI states
    cached: Callable[[object], bytes]  # state -> rendered bytes, from the ImageAnalysis
    naive: Callable[[object], bytes]  # state -> rendered bytes, from the image (new forward)


def redraws(handle: ViTHandle, result: ImageAnalysis, picture: Image.Image) -> list[Redraw]:
    """The redraw kinds of the app, each with a cached and a naive implementation."""
    layout = result.layout
    query = readout_query(handle)
    width = layout.input_size[1]
    patches = ((layout.grid_h // 2, layout.grid_w // 2), (0, 0), (layout.grid_h - 1, layout.grid_w - 1))
    heads: tuple[int | None, ...] = (*range(handle.num_heads), None)
    attention_states = tuple(zip(itertools.islice(itertools.cycle(range(handle.depth)), 12),
                                 itertools.islice(itertools.cycle(heads), 12),
                                 itertools.islice(itertools.cycle((None, *patches)), 12)))
    rollout_states = tuple(itertools.product(("mean", "max", "min"), (0.0, 0.5, 0.9), (0, 1)))
    layer_states = tuple(range(handle.depth))
    highlight_states = tuple(zip(range(handle.depth), itertools.cycle(heads)))

    def caption(method: str, state) -> str:  # as long as the app's: model, method, settings, class
        return (f"{handle.name} (random weights) · {method} · settings {state}\n"
                f"class {result.target} ({float(result.probs.max()):.1%}); colour: min-max of this map")

    def attention_cached(state):
        layer, head, patch = state
        return panel(result.rgb, result.attention_map(layer, head, patch), caption("attention", state),
                     "attention weight", marker=patch)

    def attention_naive(state):
        layer, head, patch = state
        attention, _, rgb = _naive_capture(handle, picture)
        grid_map = attention_map(attention, layout, layer, head, query if patch is None else patch)
        return panel(rgb, grid_map, caption("attention", state), "attention weight", marker=patch)

    def rollout_cached(state):
        fusion, discard, start = state
        return panel(result.rgb, result.rollout(fusion, discard, start_layer=start), caption("rollout", state),
                     "share of attention")

    def rollout_naive(state):
        fusion, discard, start = state
        attention, _, rgb = _naive_capture(handle, picture)
        grid_map = rollout(attention, layout, fusion, discard, start_layer=start, query=query)
        return panel(rgb, grid_map, caption("rollout", state), "share of attention")

    def gradcam_cached(layer):
        return panel(result.rgb, result.gradcam[layer], caption("Grad-CAM", layer), "Grad-CAM (ReLU)", relu=True)

    def gradcam_naive(layer):
        maps, rgb = _naive_gradcam(handle, picture)
        return panel(rgb, maps[layer], caption("Grad-CAM", layer), "Grad-CAM (ReLU)", relu=True)

    scatter = distance_plots.attention_distance_panel(result.mean_distance, image_width=width)  # once per image, as the app

    def distance_cached(state):
        return encode_image(scatter.draw(state))

    def distance_naive(state):
        attention, _, _ = _naive_capture(handle, picture)
        fig = distance_plots.attention_distance_figure(mean_attention_distance(attention, layout), highlight=state,
                                                 image_width=width)
        return canvas.figure_to_png(fig)

    kinds = [Redraw("raw attention (layer/head/query)", attention_states, attention_cached, attention_naive),
             Redraw("rollout (fusion/discard/start layer)", rollout_states, rollout_cached, rollout_naive)]
    if result.gradcam is not None:
        kinds.append(Redraw("Grad-CAM (layer)", layer_states, gradcam_cached, gradcam_naive))
    kinds.append(Redraw("distance scatter highlight -> PNG", highlight_states, distance_cached, distance_naive))
    return kinds


def cycling(states: Iterable, draw: Callable[[object], bytes]) -> Callable[[], bytes]:
    """A no-argument call that draws the next state each time, as a user moving a slider."""
    upcoming = itertools.cycle(states)
    return lambda: draw(next(upcoming))


# --------------------------------------------------------------------------- memory

def held_bytes(value: object, seen: set[int] | None = None) -> int:
    """Bytes a result keeps alive, counted deeply: every numpy buffer once, through to the array that
    owns it (a small view of a large array holds the large one), plus the Python objects around them."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        owner = value
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        total = sys.getsizeof(value) - (value.nbytes if value.base is None else 0)  # header only
        if id(owner) not in seen or owner is value:
            seen.add(id(owner))
            total += owner.nbytes if owner.base is None else max(owner.nbytes, sys.getsizeof(owner.base))
        return total
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sys.getsizeof(value) + sum(held_bytes(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return sys.getsizeof(value) + sum(held_bytes(v, seen) for v in value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in value.items())
    return sys.getsizeof(value)


def retained_bytes(analyse: Callable[[], ImageAnalysis]) -> tuple[ImageAnalysis, int]:
    """Run `analyse` under tracemalloc (numpy reports its buffers to it) and return the result with the
    bytes still allocated afterwards: what keeping the result costs the process."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = analyse()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return result, after - before


# --------------------------------------------------------------------------- one model

def other_analysis(package, name: str, picture: Image.Image | Path) -> Callable[[], object]:
    """Another version's `analyze_image` + top-5 as the app runs it (its own spill folder), on its own handle of
    ``name`` (random weights), of a decoded image or of a file (decoded in each call, as the app's upload is)."""
    models = other_module(package, "core.load", "models")
    pipeline, spill = other_module(package, "passes.pipeline", "pipeline"), other_module(package, "passes.spill", "spill")
    handle = models.load_model(name, pretrained=False, device="cpu")
    folder = spill.SpillFolder(spill.DEFAULT_SPILL_BUDGET)
    return lambda: handle.top_labels(pipeline.analyze_image(handle, picture, relevance=False, spill=folder).probs, 5)


def bench_model(name: str, picture: Image.Image, repeats: int, summary: list[list[str]], other=None,
                idle_s: float = 0.0) -> None:
    handle = load_model(name, pretrained=False, device="cpu")
    model = plain_model(handle)
    spill = SpillFolder(DEFAULT_SPILL_BUDGET)  # the app's: models whose maps are dear to rebuild write them to disk
    pixels, _ = handle.preprocess.apply(picture)
    top = int(plain_forward(model, pixels)[0].argmax())
    layout = handle.layout()
    print(f"### {name}\n")
    print(f"depth {handle.depth}, heads {handle.num_heads}, embed_dim {handle.embed_dim}, tokens {layout.num_tokens} "
          f"(grid {layout.grid_h}×{layout.grid_w}), input {layout.input_size[0]}×{layout.input_size[1]}, random weights\n")

    times = measure({
        "plain forward (fused attention, no grad)": lambda: plain_forward(model, pixels),
        "plain forward + backward `model(x)[0, top].backward()`": lambda: plain_forward_backward(model, pixels, top),
        "plain forward + input-only backward (the floor: no weight gradients)":
            lambda: plain_forward_input_backward(model, pixels, top),
        "ours: analyze_image + top-5": lambda: handle.top_labels(
            analyze_image(handle, picture, relevance=False, spill=spill).probs, 5),
        # next to ours in each round, so that both follow the same kind of work
        **({OTHER: other_analysis(other, name, picture)} if other is not None else {}),
        "ours with AttnLRP and LeGrad in the pass: analyze_image(relevance=True) + top-5": lambda: handle.top_labels(
            analyze_image(handle, picture, relevance=True).probs, 5),
        "AttnLRP and LeGrad added later: relevance_maps (one more forward)": lambda: relevance_maps(
            handle, picture, top),
        "naive: one pass per method (3 forwards + 2 forward/backward)": lambda: naive_analysis(handle, picture),
        "preprocessing alone (resize, crop, normalise)": lambda: handle.preprocess.apply(picture),
        "distance scatter background, drawn once per image by the app (not in the ratio)":
            lambda: distance_plots.attention_distance_panel(np.zeros((handle.depth, handle.num_heads)) + 50.0, 224),
    }, repeats, idle_s=idle_s)
    model.zero_grad(set_to_none=True)
    plain_fb, ours, naive = (times[k] for k in (
        "plain forward + backward `model(x)[0, top].backward()`", "ours: analyze_image + top-5",
        "naive: one pass per method (3 forwards + 2 forward/backward)"))
    print("Full per-image analysis (ours includes preprocessing of the decoded image; the plain passes "
          "start from the preprocessed tensor):\n")
    print(markdown_table(("candidate", "median ms (min–max)", "÷ plain forward + backward"),
                         [(k, t.ms(), f"{t.median / plain_fb.median:.2f}") for k, t in times.items()]))
    print()
    ratio = ours.median / plain_fb.median
    floor = times["plain forward + input-only backward (the floor: no weight gradients)"]
    floor_ratio = ours.median / floor.median
    summary.append(["1. analysis ÷ plain fwd+bwd", name, f"{1e3 * ours.median:.0f} ms",
                    f"{1e3 * plain_fb.median:.0f} ms", f"**{ratio:.2f}**", f"≤ {ANALYSIS_TARGET}",
                    verdict(ratio, ANALYSIS_TARGET, at_most=True)])
    summary.append(["1a. analysis ÷ plain fwd + input-only bwd (the floor)", name, f"{1e3 * ours.median:.0f} ms",
                    f"{1e3 * floor.median:.0f} ms", f"**{floor_ratio:.2f}**", f"≤ {ANALYSIS_TARGET}",
                    verdict(floor_ratio, ANALYSIS_TARGET, at_most=True)])
    for label, key in (("1c. analysis with AttnLRP and LeGrad in the pass ÷ the floor",
                        "ours with AttnLRP and LeGrad in the pass: analyze_image(relevance=True) + top-5"),
                       ("1d. AttnLRP and LeGrad added later ÷ the floor",
                        "AttnLRP and LeGrad added later: relevance_maps (one more forward)")):
        summary.append([label, name, f"{1e3 * times[key].median:.0f} ms", f"{1e3 * floor.median:.0f} ms",
                        f"{times[key].median / floor.median:.2f}", "—", "—"])
    if other is not None:
        summary.append(["1e. analysis ÷ the other version's (--before-tree)", name, f"{1e3 * ours.median:.0f} ms",
                        f"{1e3 * times[OTHER].median:.0f} ms", f"**{ours.median / times[OTHER].median:.2f}**", "—", "—"])
    summary.append(["1b. analysis ÷ naive (one pass per method)", name, f"{1e3 * ours.median:.0f} ms",
                    f"{1e3 * naive.median:.0f} ms", f"{ours.median / naive.median:.2f}", "—", "—"])

    result = analyze_image(handle, picture, spill=spill)
    kinds = redraws(handle, result, picture)
    candidates: dict[str, Callable[[], object]] = {"plain forward": lambda: plain_forward(model, pixels)}
    for kind in kinds:
        candidates[f"ours {kind.name}"] = cycling(kind.states, kind.cached)
        candidates[f"naive {kind.name}"] = cycling(kind.states, kind.naive)
    times = measure(candidates, repeats)
    forward = times["plain forward"]
    rows = []
    worst = 0.0
    for kind in kinds:
        cached, naive = times[f"ours {kind.name}"], times[f"naive {kind.name}"]
        worst = max(worst, cached.median / forward.median)
        rows.append((kind.name, cached.ms(), f"{cached.median / forward.median:.3f}", naive.ms(),
                     f"{cached.median / naive.median:.3f}"))
    print("Redraw after a UI change, server side, rendering included (map panel: overlay, colour bar, caption "
          f"-> {IMAGE_FORMAT} at zlib level {canvas.PNG_LEVEL}; figure -> PNG); "
          f"plain forward {forward.ms()} ms:\n")
    print(markdown_table(("redraw kind", "ours ms (min–max)", "ours ÷ plain forward", "naive recompute ms",
                          "ours ÷ naive"), rows))
    print()
    target = f"≤ {REDRAW_TARGET}" if name == REDRAW_TARGET_MODEL else "—"
    held = verdict(worst, REDRAW_TARGET, at_most=True) if name == REDRAW_TARGET_MODEL else "—"
    slowest = max(kinds, key=lambda k: times[f"ours {k.name}"].median)
    summary.append(["2. slowest redraw ÷ plain forward", name,
                    f"{1e3 * times[f'ours {slowest.name}'].median:.0f} ms ({slowest.name})",
                    f"{1e3 * forward.median:.0f} ms", f"**{worst:.3f}**", target, held])
    for kind in kinds:
        summary.append([f"2b. redraw ÷ naive: {kind.name}", name, f"{1e3 * times[f'ours {kind.name}'].median:.1f} ms",
                        f"{1e3 * times[f'naive {kind.name}'].median:.0f} ms",
                        f"{times[f'ours {kind.name}'].median / times[f'naive {kind.name}'].median:.3f}", "—", "—"])

    result, retained = retained_bytes(lambda: analyze_image(handle, picture))
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    memory_rows = [(field, f"{held_bytes(value) / MB:.3f}") for field, value in fields.items()
                   if isinstance(value, np.ndarray)]
    nbytes, deep, pickled = result.nbytes(), held_bytes(result), len(pickle.dumps(result, protocol=5))
    memory_rows += [("**ImageAnalysis.nbytes()**", f"**{nbytes / MB:.3f}**"),
                    ("deep size (every buffer once, views charged their owner)", f"{deep / MB:.3f}"),
                    ("pickled size", f"{pickled / MB:.3f}"),
                    ("retained by the process after analyze_image (tracemalloc)", f"{retained / MB:.3f}")]
    print("Memory held per session for one analysed image:\n")
    print(markdown_table(("what", "MB (10^6 bytes)"), memory_rows))
    print()
    worst_mb = max(nbytes, deep, retained) / MB
    is_target = name == MEMORY_TARGET_MODEL
    summary.append(["4. memory per analysed image (largest of the checks)", name, f"{worst_mb:.1f} MB", "—",
                    "—", f"≤ {MEMORY_TARGET_MB:.0f} MB" if is_target else "—",
                    verdict(worst_mb, MEMORY_TARGET_MB, at_most=True) if is_target else "—"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="timm names (random weights)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per candidate (after 1 warm-up)")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"), help="the image analysed")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads")
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="a folder holding another version's vit_inspect, whose analysis is timed too (1e)")
    parser.add_argument("--idle-ms", type=float, default=0.0,
                        help="idle before each timed call of rows 1-1e, as after an upload (default 0: back to back)")
    args = parser.parse_args()
    set_threads(args.threads)
    other = load_package(args.before_tree.resolve()) if args.before_tree is not None else None
    picture = load_image(args.image)
    print_header("Per-image analysis, redraw and memory")
    print(f"Image: `{args.image}` ({picture.width}×{picture.height}), decoded once before timing. "
          f"Median of {args.repeats} repeats after 1 warm-up, candidates interleaved"
          + (f", each timed call of rows 1-1e after {args.idle_ms:g} ms idle" if args.idle_ms > 0 else ", back to back")
          + ".\n")
    summary: list[list[str]] = []
    for name in args.models:
        bench_model(name, picture, args.repeats, summary, other, idle_s=args.idle_ms / 1e3)
    print("### Summary\n")
    name = "analysis" if args.idle_ms == 0 else f"analysis_idle{args.idle_ms:g}ms"
    print(report(name, ("measure", "model", "ours", "baseline", "ratio", "target", "held"), summary,
                 key=("measure", "model")))


if __name__ == "__main__":
    main()

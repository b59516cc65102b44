"""The per-image panels of the app: maps with colour bars and captions, all heads, all maps side by side.

No gradio here: `draw_panels(names, session, view)` turns a session's cached pass (`inspector.Session`) and
the controls' `View` (`view`) into images, for the page's handlers (`inspector`).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from vit_inspect.analysis import mass_mask
from vit_inspect.methods import get
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots import canvas
from vit_inspect.plots import maps as map_plots
from vit_inspect.ui.relevance import added_maps, present, relevance_words

MAP_NAMES = ("attention", "rollout", "gradcam", "chefer")  # the maps drawn over the image
FIRST_VIEW = ("first_attention", "first_rollout", "first_chefer")  # the first view's three maps, fixed settings
IMAGE_PANELS = (*FIRST_VIEW, "attention", "distance", "rollout", "gradcam", "chefer", "compare", "heads")
# The widest picture a section shows at its own size: the sections' column is 1006 pixels wide in a 1366-pixel
# window (measured in Chromium, tests/ui/browser), so a picture no wider keeps its 12-13 px text legible there.
FIGURE_PIXELS = 1000
PANEL_COLUMNS = 3  # map panels side by side in a mosaic at most: three at a 224-pixel crop fit FIGURE_PIXELS
MAIN_MAP_PIXELS = 448  # a view's main map is drawn at least this wide (the crop enlarged by a whole factor)
FIRST_VIEW_WORDS = {  # what each of the first view's maps is, and why it is there
    "first_attention": "what the class token reads in the last layer",
    "first_rollout": "attention carried through every layer",
    "first_chefer": "of the maps one pass draws, the most faithful on 200 ImageNet photos (docs: Which map to trust)",
}
UNITS = {"attention": "attention weight (probability)", "rollout": "rollout weight (fraction)",
         "gradcam": "Grad-CAM (activation × gradient)", "chefer": "relevance (logit units)",
         "heads": "attention weight (probability)"}


def unit(result: ImageAnalysis, name: str) -> str:
    """The colour bar's unit of a panel: relevance is in the units of the score the gradient maps explain
    (``result.score``: logit, or cosine for a text prompt's similarity with the image)."""
    return f"relevance ({result.score} units)" if name == "chefer" else UNITS[name]


def view_map(result: ImageAnalysis, view, name: str) -> np.ndarray | None:
    """One raw (grid_h, grid_w) map of MAP_NAMES; None for the gradient maps of a model without a head."""
    if name == "attention":
        return result.attention_map(view.layer, view.head, view.patch)
    if name == "rollout":
        if view.rollout_method == "gradient":
            return result.gradient_rollout(view.discard_ratio, start_layer=view.first_layer,
                                           end_layer=view.last_layer + 1, discard=view.discard)
        return result.rollout(view.head_fusion, view.discard_ratio, start_layer=view.first_layer,
                              end_layer=view.last_layer + 1, discard=view.discard)
    if result.gradcam is None:
        return None
    return result.gradcam[view.gradcam_layer] if name == "gradcam" else result.chefer


def main_scale(result: ImageAnalysis) -> int:
    """The whole factor a view's main map enlarges the crop by: at least MAIN_MAP_PIXELS wide (2 for a 224-pixel
    crop; 1 from 448 pixels up). A click's pixel on such a map is divided by it (`map_geometry`)."""
    return max(1, math.ceil(MAIN_MAP_PIXELS / result.layout.input_size[1]))


def map_geometry(result: ImageAnalysis) -> dict:
    """What the browser needs to turn a clicked pixel of the map into a patch: the whole factor the map
    enlarges the crop by (`main_scale`), the input's (height, width), the patch's (height, width) in
    input pixels and the grid's (rows, columns)."""
    tokens = result.layout
    return {"scale": main_scale(result), "input": list(tokens.input_size), "patch": [tokens.patch_h, tokens.patch_w],
            "grid": [tokens.grid_h, tokens.grid_w]}


def first_view(result: ImageAnalysis, view):
    """The settings of the first view's maps, whatever the other views' controls say (only the colour scale is
    shared): the last layer's attention from the readout token, mean of heads; attention rollout over every
    layer, mean fusion, nothing discarded."""
    last = result.depth - 1
    return replace(view, layer=last, head=None, patch=None, head_fusion="mean", discard_ratio=0.0, first_layer=0,
                   last_layer=last, rollout_method="attention", discard="row", swapped=False)


def colour_range(result: ImageAnalysis, view, name: str, grid_map: np.ndarray) -> tuple[tuple[float, float], str]:
    """((low, high), words) of a map's colour range under the view's scale; scales that do not apply
    to a map fall back to its own range, and the words say which range was used."""
    if view.scale == "absolute" and name in ("attention", "rollout", "heads"):
        return (0.0, 1.0), "colour 0 to 1"
    if view.scale == "shared" and name in ("attention", "heads"):
        top = max(float(result.head_maps(layer, view.patch).max()) for layer in range(result.depth))
        return (0.0, top), "colour shared over all layers and heads"
    if view.scale == "shared" and name == "gradcam":
        return (0.0, float(np.maximum(result.gradcam, 0).max())), "colour shared over all blocks"
    return canvas.map_range(grid_map, relu=name == "gradcam"), "colour: this map's own range"


def share_text(shares: dict[str, float]) -> str:
    return ("prefix tokens: " + ", ".join(f"{name} {value:.1%}" for name, value in shares.items())) if shares else ""


def caption(session, view, name: str, range_words: str) -> str:
    """What a map shows: model, map and settings, class, colour range (and the prefix share for attention)."""
    result = session.result
    lines = [f"{session.model_label} · {view.titles()[name]}"]
    if name in ("gradcam", "chefer") or (name == "rollout" and view.rollout_method == "gradient"):
        lines.append(session.target_words())
    if name == "attention":
        lines.append(share_text(result.prefix_share(view.layer, view.head, view.patch)))
    lines.append(range_words)
    return "\n".join(line for line in lines if line)


def heads_figure(session, view) -> np.ndarray:
    """Every head of the view's layer from its query, shared colour range, optional DINO threshold masks."""
    result = session.result
    maps = result.head_maps(view.layer, view.patch)  # (heads, grid_h, grid_w)
    (low, high), words = colour_range(result, view, "heads", maps)
    if view.scale == "own":
        low, high, words = float(maps.min()), float(maps.max()), "colour shared over the heads of this layer"
    titles = [f"head {h} · " + share_text(result.prefix_share(view.layer, h, view.patch)).replace("prefix tokens: ", "")
              for h in range(result.num_heads)]
    masks = None if view.threshold is None else mass_mask(maps, view.threshold)
    mask_words = "" if masks is None else f" · bright: the patches holding {view.threshold:.0%} of each head's attention"
    title = (f"{session.model_label} · layer {view.layer}, every head, from {view.query_text()}{mask_words}\n{words}")
    return map_plots.heads_panel(result.rgb, maps, titles, UNITS["heads"], title=title, vmin=low, vmax=high,
                                 masks=masks, columns=min(result.num_heads, PANEL_COLUMNS + 1))  # PIL: ≈ 30x a figure


def mosaic_columns(result: ImageAnalysis) -> int:
    """Map panels side by side in the All maps mosaic: up to PANEL_COLUMNS, as many as fit FIGURE_PIXELS at the
    crop's own size (one map, its colour bar and a gap each)."""
    panel = result.rgb.shape[1] + canvas.COLORBAR_PIXELS + canvas.MOSAIC_GAP
    return max(1, min(PANEL_COLUMNS, (FIGURE_PIXELS + canvas.MOSAIC_GAP) // panel))


def draw_panels(names: tuple[str, ...], session, view, scale: int | None = None) -> list[np.ndarray | None]:
    """The images of the named panels, in order; None where the model has nothing to show.
    Only the maps these panels need are computed, each once. A single map is drawn with the crop enlarged
    ``scale`` times (default `main_scale`: a view's main map; 1 for maps shown three side by side)."""
    result = session.result
    maps = {}
    titles = view.titles()

    def grid_map(name: str) -> np.ndarray | None:
        if name not in maps:
            maps[name] = view_map(result, view, name)
        return maps[name]

    drawn = []
    for name in names:
        if name in FIRST_VIEW:
            drawn.append(first_view_panel(session, first_view(result, view), name.removeprefix("first_")))
        elif name == "distance":
            drawn.append(session.distance.draw((view.layer, view.head)))
        elif name == "heads":
            drawn.append(heads_figure(session, view))
        elif name == "compare":
            shown = {k: grid_map(k) for k in MAP_NAMES if grid_map(k) is not None}
            ranges = {k: colour_range(result, view, k, v)[0] for k, v in shown.items()}
            target, contrast = session.target
            alone = f", {session.target_text(target)} alone" if contrast is not None else ""  # no contrast
            extra = {method + alone: v for method, v in present(result).items()}
            plugged, notes = added_maps(session)  # the registry's added methods, at their defaults
            registered = {name: get(name) for name in plugged}
            title = session.model_label + (f" · {session.target_words()}" if target is not None else "")
            words = relevance_words(session)
            title += f"\n{words}" if words else ""
            drawn.append(map_plots.maps_panel(  # PIL panels: ≈ 40x faster than a matplotlib figure
                result.rgb, {titles[k]: v for k, v in shown.items()} | extra | plugged,
                relu_names=(titles["gradcam"], *(k for k, m in registered.items() if m.relu)),
                units={titles[k]: unit(result, k) for k in shown} | {k: unit(result, "chefer") for k in extra}
                | {k: m.unit.replace("{score}", result.score) for k, m in registered.items()},
                ranges={titles[k]: r for k, r in ranges.items()} | {  # a signed map: centred on zero
                    k: (-float(np.abs(plugged[k]).max()), float(np.abs(plugged[k]).max()))
                    for k, m in registered.items() if m.signed and not m.relu and np.abs(plugged[k]).max() > 0},
                title=title, columns=mosaic_columns(result),
                notes=notes, cmaps={k: m.cmap for k, m in registered.items()}))
        elif grid_map(name) is None:
            drawn.append(None)
        else:
            (low, high), words = colour_range(result, view, name, grid_map(name))
            drawn.append(map_plots.map_panel(result.rgb, grid_map(name), caption(session, view, name, words),
                                            unit(result, name), vmin=low, vmax=high, relu=name == "gradcam",
                                            marker=view.patch if name == "attention" else None,
                                            scale=main_scale(result) if scale is None else scale))
    return drawn


def first_view_panel(session, view, name: str) -> np.ndarray | None:
    """One of the first view's maps at the crop's own size (three fit side by side), captioned with what it is
    and why it is shown; None for the gradient map of a model without a head."""
    result = session.result
    grid_map = view_map(result, view, name)
    if grid_map is None:
        return None
    (low, high), words = colour_range(result, view, name, grid_map)
    text = f"{caption(session, view, name, words)}\n{FIRST_VIEW_WORDS['first_' + name]}"
    return map_plots.map_panel(result.rgb, grid_map, text, unit(result, name), vmin=low, vmax=high)

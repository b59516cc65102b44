"""Faithfulness results -> a picture of the curves (PIL) and a ranked table (numbers in, no torch, no gradio)."""
from __future__ import annotations

import matplotlib
import numpy as np
from PIL import ImageDraw

from vit_inspect.analysis.faithfulness import CURVES, DEL_INS_FRACTIONS, LOWER_IS_BETTER, Curves, better
from vit_inspect.plots.canvas import font_of, grid_of, plot_axes, rgb_of, titled

RANDOM = "random"
WORSE = "⚠ worse than random"
CURVE_PLOT_PIXELS = (400, 260)  # (width, height) of one curve plot's axes
LEGEND_LINE_PIXELS = 14  # one method's line in a legend
DASH_PIXELS = (6, 4)  # (drawn, skipped) along the random map's curve
PANELS = (("deletion", "Deletion (lower area is better)", "removed"),
          ("insertion", "Insertion (higher area is better)", "inserted"))


def method_colours(methods: list[str]) -> dict[str, tuple[int, int, int]]:
    """Each method's line colour: matplotlib's tab10 cycle in the given order, the random map black."""
    cycle = [rgb_of(c) for c in matplotlib.colormaps["tab10"].colors]
    others = [m for m in methods if m != RANDOM]
    return {m: (0, 0, 0) if m == RANDOM else cycle[others.index(m) % len(cycle)] for m in methods}


def dashed(pen: ImageDraw.ImageDraw, points: np.ndarray, colour: tuple, width: int = 2) -> None:
    """A polyline through (n, 2) pixel points, DASH_PIXELS drawn then skipped along its length."""
    on, off = DASH_PIXELS
    position = 0.0  # length travelled, modulo one dash and gap
    for start, stop in zip(points[:-1], points[1:]):
        length = float(np.hypot(*(stop - start)))
        done = 0.0
        while done < length:
            in_dash = position < on
            step = min(length - done, (on - position) if in_dash else (on + off - position))
            if in_dash:
                a, b = start + (stop - start) * done / length, start + (stop - start) * (done + step) / length
                pen.line((*a, *b), fill=colour, width=width)
            done += step
            position = (position + step) % (on + off)


def curves_panel(curves: dict[str, Curves], title: str) -> np.ndarray:
    """Deletion and insertion curves (Petsiuk et al. 2018) of every method side by side, drawn with PIL (the
    matplotlib figure takes 280 ms, this 7 ms, `bench.bench_upload`): x = fraction of patches removed / inserted
    (DEL_INS_FRACTIONS, 0 to 1), y = probability of the explained class (0 to 1.05 x the highest point of
    the plot, at least 0.05); each method a line in its `method_colours` colour, the random map dashed
    black; under each plot a legend, "method (AUC)". Returns an (H, W, 3) uint8 picture under `title`."""
    if not curves:
        raise ValueError("no curves to draw")
    small, plot_w = font_of(10), CURVE_PLOT_PIXELS[0]
    colours = method_colours(list(curves))
    panels = []
    for field, name, verb in PANELS:
        values = {m: np.asarray(getattr(c, field), dtype=np.float64) for m, c in curves.items()}
        if any(v.shape != DEL_INS_FRACTIONS.shape or not np.isfinite(v).all() for v in values.values()):
            raise ValueError(f"each {field} curve must be {len(DEL_INS_FRACTIONS)} finite values")
        labels = {m: f"{m} ({c.auc('del' if field == 'deletion' else 'ins'):.3f})" for m, c in curves.items()}
        axes = plot_axes(max(0.05, 1.05 * max(float(v.max()) for v in values.values())),
                         [(f * (plot_w - 1), f"{f:g}") for f in np.linspace(0.0, 1.0, 6)],
                         f"fraction of patches {verb}", "probability of the explained class",
                         plot=CURVE_PLOT_PIXELS, below=LEGEND_LINE_PIXELS * (len(curves) + 1) + 6,
                         legend=30 + max(int(small.getlength(label)) for label in labels.values()))  # sample, words
        legend_y = axes.bottom + 40
        axes.pen.text((axes.left, legend_y), "method (AUC)", fill=(0, 0, 0), font=small, anchor="lm")
        for index, (method, value) in enumerate(values.items()):
            points = np.stack([axes.left + DEL_INS_FRACTIONS * (plot_w - 1), axes.row(value)], axis=-1)  # (11, 2)
            y = legend_y + LEGEND_LINE_PIXELS * (index + 1)
            sample = np.array([[axes.left, y], [axes.left + 24, y]], dtype=np.float64)
            if method == RANDOM:
                dashed(axes.pen, points, colours[method])
                dashed(axes.pen, sample, colours[method])
            else:
                axes.pen.line([tuple(p) for p in points], fill=colours[method], width=2, joint="curve")
                axes.pen.line([tuple(p) for p in sample], fill=colours[method], width=2)
            axes.pen.text((axes.left + 30, y), labels[method], fill=(0, 0, 0), font=small, anchor="lm")
        panels.append(titled(np.asarray(axes.panel), name))
    return titled(grid_of(panels, 2), title)


def worse_than_random(aucs: dict[str, float], floor: dict[str, float]) -> list[str]:
    """The curves on which a map scores worse than the random map."""
    return [c for c in CURVES if better(c, floor[c], aucs[c])]


def ranked_rows(curves: dict[str, Curves]) -> list[list[object]]:
    """[method, pos, neg, del, ins, verdict] rows, best first by mean rank over the four AUCs; a map worse
    than the random map on at least two of the four is marked, and so is each such AUC (⚠)."""
    aucs = {m: c.aucs() for m, c in curves.items()}
    ranks = {m: 0.0 for m in aucs}
    for curve in CURVES:
        order = sorted(aucs, key=lambda m: aucs[m][curve], reverse=not LOWER_IS_BETTER[curve])
        for position, method in enumerate(order):
            ranks[method] += position / len(CURVES)
    floor = aucs.get(RANDOM)
    rows = []
    for method in sorted(aucs, key=lambda m: ranks[m]):
        worse = worse_than_random(aucs[method], floor) if floor is not None and method != RANDOM else []
        cells = [f"{aucs[method][c]:.1f}" if c in ("pos", "neg") else f"{aucs[method][c]:.3f}" for c in CURVES]
        cells = [cell + (" ⚠" if c in worse else "") for cell, c in zip(cells, CURVES)]
        verdict = "the floor" if method == RANDOM else WORSE if len(worse) >= 2 else ""
        rows.append([method, *cells, verdict])
    return rows



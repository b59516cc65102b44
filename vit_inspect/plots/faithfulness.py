"""Faithfulness results -> a picture of the curves (PIL), a ranked table and one-line verdicts (numbers in,
no gradio). Methods are shown by their registered titles (`paper_name`), each line in a colour of the
Okabe-Ito palette (safe for the common colour-vision deficiencies) and a line style of its own, so no two
methods differ by colour alone."""
from __future__ import annotations

import numpy as np
from PIL import ImageDraw

from vit_inspect.analysis.faithfulness import (
    CURVES,
    DEL_INS_FRACTIONS,
    LOWER_IS_BETTER,
    Curves,
    better,
)
from vit_inspect.plots.canvas import SMALL_TEXT, font_of, grid_of, plot_axes, titled

RANDOM = "random"
CURVE_PLOT_PIXELS = (400, 260)  # (width, height) of one curve plot's axes
LEGEND_LINE_PIXELS = 16  # one method's line in a legend
LEGEND_SAMPLE_PIXELS = 32  # length of a legend's line sample
# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies;
# its black is the random map's and its yellow is too pale on white to draw a line with
OKABE_ITO = ((230, 159, 0), (86, 180, 233), (0, 158, 115), (0, 114, 178), (213, 94, 0), (204, 121, 167))
LINE_STYLES = (None, (10, 4), (2, 3), (10, 3, 2, 3))  # solid, dashed, dotted, dash-dot: (drawn, skipped, ...) pixels
RANDOM_STYLE = (6, 4)  # the random map: black, dashed
PANELS = (("deletion", "Deletion (lower area is better)", "removed"),
          ("insertion", "Insertion (higher area is better)", "inserted"))
SORTED_BY = "mean rank over pos, neg, del and ins (1 = best on all four)"


def paper_name(method: str) -> str:
    """A method as the figures and tables name it: its registered title (the paper's name and its settings), the
    random map's name for the floor, else the name as given (a method no longer registered)."""
    from vit_inspect.methods import methods
    from vit_inspect.studies.faithfulness import (
        faithfulness_methods,  # the registry (and torch) when one is named
    )

    return (faithfulness_methods() | {name: m.title for name, m in methods().items()}).get(method, method)


def method_styles(methods: list[str]) -> dict[str, tuple[tuple[int, int, int], tuple[int, ...] | None]]:
    """Each method's (line colour, dash pattern or None for solid): the Okabe-Ito colours in the given order,
    each with the next line style (solid, dashed, dotted, dash-dot), so that colour and style both tell any
    two of the first twelve apart; the random map black and dashed."""
    others = [m for m in methods if m != RANDOM]
    styles = {m: (OKABE_ITO[i % len(OKABE_ITO)], LINE_STYLES[i % len(LINE_STYLES)]) for i, m in enumerate(others)}
    return {m: ((0, 0, 0), RANDOM_STYLE) if m == RANDOM else styles[m] for m in methods}


def method_colours(methods: list[str]) -> dict[str, tuple[int, int, int]]:
    """Each method's line colour (`method_styles`)."""
    return {m: colour for m, (colour, _) in method_styles(methods).items()}


def dashed(pen: ImageDraw.ImageDraw, points: np.ndarray, colour: tuple, pattern: tuple[int, ...] = RANDOM_STYLE,
           width: int = 2) -> None:
    """A polyline through (n, 2) pixel points, drawn and skipped along its length by ``pattern`` (pixels:
    drawn, skipped, drawn, skipped, ...)."""
    period = float(sum(pattern))
    ends = np.cumsum(pattern)  # where each stretch of the pattern ends, within one period
    position = 0.0  # length travelled, modulo one period
    for start, stop in zip(points[:-1], points[1:]):
        length = float(np.hypot(*(stop - start)))
        done = 0.0
        while done < length:
            stretch = int(np.searchsorted(ends, position, side="right"))
            step = min(length - done, float(ends[stretch]) - position)
            if stretch % 2 == 0:  # a drawn stretch
                a, b = start + (stop - start) * done / length, start + (stop - start) * (done + step) / length
                pen.line((*a, *b), fill=colour, width=width)
            done += step
            position = (position + step) % period


def _line(pen: ImageDraw.ImageDraw, points: np.ndarray, colour: tuple, pattern: tuple[int, ...] | None) -> None:
    if pattern is None:
        pen.line([tuple(p) for p in points], fill=colour, width=2, joint="curve")
    else:
        dashed(pen, points, colour, pattern)


def curves_panel(curves: dict[str, Curves], title: str,
                 score: str = "probability of the explained class") -> np.ndarray:
    """Deletion and insertion curves (Petsiuk et al. 2018) of every method side by side, drawn with PIL (the
    matplotlib figure takes 280 ms, this 7 ms, `bench.bench_upload`): x = fraction of patches removed / inserted
    (DEL_INS_FRACTIONS, 0 to 1), y = ``score``, by default the probability of the explained class (0 to 1.05 x
    the highest point of the plot, at least 0.05; a text prompt's similarity may be negative, and the axis then
    starts at 1.05 x the lowest point); each method a line in its `method_styles` colour and style, the random map
    dashed black; under each plot a legend, "paper name (AUC)". Returns an (H, W, 3) uint8 picture under
    `title`."""
    if not curves:
        raise ValueError("no curves to draw")
    small, plot_w = font_of(SMALL_TEXT), CURVE_PLOT_PIXELS[0]
    styles = method_styles(list(curves))
    panels = []
    for field, name, verb in PANELS:
        values = {m: np.asarray(getattr(c, field), dtype=np.float64) for m, c in curves.items()}
        if any(v.shape != DEL_INS_FRACTIONS.shape or not np.isfinite(v).all() for v in values.values()):
            raise ValueError(f"each {field} curve must be {len(DEL_INS_FRACTIONS)} finite values")
        labels = {m: f"{paper_name(m)} ({c.auc('del' if field == 'deletion' else 'ins'):.3f})" for m, c in curves.items()}
        axes = plot_axes(max(0.05, 1.05 * max(float(v.max()) for v in values.values())),
                         [(f * (plot_w - 1), f"{f:g}") for f in np.linspace(0.0, 1.0, 6)],
                         f"fraction of patches {verb}", score,
                         lowest=min(0.0, 1.05 * min(float(v.min()) for v in values.values())),
                         plot=CURVE_PLOT_PIXELS, below=LEGEND_LINE_PIXELS * (len(curves) + 1) + 6,
                         legend=LEGEND_SAMPLE_PIXELS + 6 + max(int(small.getlength(label)) for label in labels.values()))
        legend_y = axes.bottom + 46
        axes.pen.text((axes.left, legend_y), "method (area under the curve)", fill=(0, 0, 0), font=small, anchor="lm")
        for index, (method, value) in enumerate(values.items()):
            points = np.stack([axes.left + DEL_INS_FRACTIONS * (plot_w - 1), axes.row(value)], axis=-1)  # (11, 2)
            y = legend_y + LEGEND_LINE_PIXELS * (index + 1)
            sample = np.array([[axes.left, y], [axes.left + LEGEND_SAMPLE_PIXELS, y]], dtype=np.float64)
            colour, pattern = styles[method]
            _line(axes.pen, points, colour, pattern)
            _line(axes.pen, sample, colour, pattern)
            axes.pen.text((axes.left + LEGEND_SAMPLE_PIXELS + 6, y), labels[method], fill=(0, 0, 0), font=small,
                          anchor="lm")
        panels.append(titled(np.asarray(axes.panel), name))
    return titled(grid_of(panels, 2), title)


def worse_than_random(aucs: dict[str, float], floor: dict[str, float]) -> list[str]:
    """The curves on which a map scores worse than the random map."""
    return [c for c in CURVES if better(c, floor[c], aucs[c])]


def mean_ranks(curves: dict[str, Curves]) -> dict[str, float]:
    """Each method's mean rank over the four AUCs, 1 for the best on a curve (the table's sort key)."""
    aucs = {m: c.aucs() for m, c in curves.items()}
    ranks = {m: 1.0 for m in aucs}
    for curve in CURVES:
        order = sorted(aucs, key=lambda m: aucs[m][curve], reverse=not LOWER_IS_BETTER[curve])
        for position, method in enumerate(order):
            ranks[method] += position / len(CURVES)
    return ranks


def versus_random(aucs: dict[str, float], floor: dict[str, float] | None, method: str) -> str:
    """The table's "vs random" cell: on how many of the four scores a map beats the random map ("better on 3
    of 4"), "⚠ " before it when the random map beats it on at least two; "the floor" for the random map
    itself, and "random map not scored" when there is none to compare with."""
    if method == RANDOM:
        return "the floor"
    if floor is None:
        return "random map not scored"
    beaten = sum(better(c, aucs[c], floor[c]) for c in CURVES)
    return ("⚠ " if len(worse_than_random(aucs, floor)) >= 2 else "") + f"better on {beaten} of {len(CURVES)}"


def ranked_rows(curves: dict[str, Curves]) -> list[list[object]]:
    """[paper name, mean rank, pos, neg, del, ins, vs random] rows, best first by mean rank over the four AUCs
    (`SORTED_BY`); each AUC on which the random map does better is marked (⚠), and the last cell says on how
    many of the four a map beats the random map (`versus_random`)."""
    aucs = {m: c.aucs() for m, c in curves.items()}
    ranks = mean_ranks(curves)
    floor = aucs.get(RANDOM)
    rows = []
    for method in sorted(aucs, key=lambda m: ranks[m]):
        worse = worse_than_random(aucs[method], floor) if floor is not None and method != RANDOM else []
        cells = [f"{aucs[method][c]:.1f}" if c in ("pos", "neg") else f"{aucs[method][c]:.3f}" for c in CURVES]
        cells = [cell + (" ⚠" if c in worse else "") for cell, c in zip(cells, CURVES)]
        rows.append([paper_name(method), f"{ranks[method]:.2f}", *cells, versus_random(aucs[method], floor, method)])
    return rows


def verdict(curves: dict[str, Curves], method: str) -> str:
    """One line on how faithful ``method``'s map was among the maps scored: its place by mean rank, and
    on how many of the four scores it beats the random map."""
    ranks = mean_ranks(curves)
    place = sorted(ranks, key=lambda m: ranks[m]).index(method)
    line = f"Faithfulness: {_ordinal(place + 1)} of {len(ranks)} maps scored (mean rank {ranks[method]:.2f})"
    if RANDOM in curves and method != RANDOM:
        aucs, floor = curves[method].aucs(), curves[RANDOM].aucs()
        beaten = sum(better(c, aucs[c], floor[c]) for c in CURVES)
        line += f"; better than the random map on {beaten} of {len(CURVES)} scores" + (" ⚠" if beaten <= 2 else "")
    return line + "."


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"

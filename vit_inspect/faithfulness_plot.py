"""Faithfulness results -> a matplotlib Figure and a ranked table (numbers in, no torch, no gradio)."""
from __future__ import annotations

from matplotlib.figure import Figure

from .analysis.faithfulness import CURVES, DEL_INS_FRACTIONS, LOWER_IS_BETTER, Curves, better

RANDOM = "random"
WORSE = "⚠ worse than random"


def curves_figure(curves: dict[str, Curves], title: str) -> Figure:
    """Deletion and insertion curves (Petsiuk et al. 2018) of every method side by side, the random map
    dashed; x = fraction of patches removed / inserted, y = probability of the explained class."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    fig.suptitle(title, fontsize="medium")
    for position, (field, name) in enumerate((("deletion", "Deletion (lower area is better)"),
                                              ("insertion", "Insertion (higher area is better)")), 1):
        ax = fig.add_subplot(1, 2, position)
        for method, c in curves.items():
            style = dict(color="black", linestyle="--") if method == RANDOM else {}
            area = c.auc("del" if field == "deletion" else "ins")
            ax.plot(DEL_INS_FRACTIONS, getattr(c, field), label=f"{method} ({area:.3f})", **style)
        ax.set(title=name, xlabel=f"fraction of patches {'removed' if field == 'deletion' else 'inserted'}",
               ylabel="probability of the explained class", xlim=(0, 1), ylim=(0, None))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", title="method (AUC)", title_fontsize="x-small")
    return fig


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



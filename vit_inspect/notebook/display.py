"""Jupyter display: Figures as PNG in a running kernel, and the HTML a result shows itself as."""
from __future__ import annotations

import base64
import html
import io
import sys

import numpy as np


def figures_inline() -> bool:
    """Make matplotlib Figures display as PNG in the running IPython kernel, as ``%matplotlib inline`` does.

    The library builds Figures with matplotlib's object API (no pyplot, no global state), and IPython shows
    such a Figure as text unless an ``image/png`` formatter is registered for it. This registers one when
    IPython is running and none is set; a formatter the user chose (another backend) is left alone.
    Returns whether Figures display as PNG now."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    from matplotlib.figure import Figure

    from vit_inspect.plots.canvas import figure_to_png

    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, figure_to_png)
    return True


PREVIEW_QUALITY = 88  # JPEG quality of the picture a result shows itself with: a fifth of the PNG's bytes


def preview_tag(picture: np.ndarray, alt: str) -> str:
    """An ``<img>`` holding an (H, W, 3) uint8 picture as an inline JPEG. A result's own view is a preview
    that notebooks store with their outputs (six maps: ≈ 110 kB, against ≈ 490 kB as PNG); the figures of
    `Analysis.show` stay PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, "JPEG", quality=PREVIEW_QUALITY)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/jpeg;base64,{data}" alt="{html.escape(alt)}" style="max-width:100%">'


def topk_table(rows: list[dict]) -> str:
    """An HTML table of {index, label, prob} rows: rank, class, index and probability in percent."""
    body = "".join(f"<tr><td>{rank}</td><td>{html.escape(row['label'])}</td><td>{row['index']}</td>"
                   f"<td>{100 * row['prob']:.1f} %</td></tr>" for rank, row in enumerate(rows, 1))
    return ("<table><thead><tr><th>#</th><th>class</th><th>index</th><th>probability</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")

"""The page's text stays legible at the size the page shows it: pictures no wider than the column that shows
them at their own size (`panels.FIGURE_PIXELS`). Chromium measures the rest (tests/ui/browser)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("gradio")
from vit_inspect.plots.canvas import COLORBAR_PIXELS, MOSAIC_GAP  # noqa: E402
from vit_inspect.ui.panels import FIGURE_PIXELS, PANEL_COLUMNS, mosaic_columns  # noqa: E402


@pytest.mark.parametrize("side, columns", [(32, PANEL_COLUMNS), (224, 3), (384, 2), (518, 1), (2000, 1)])
def test_the_all_maps_mosaic_fits_the_column(side, columns):
    result = SimpleNamespace(rgb=np.zeros((side, side, 3), np.uint8))
    assert mosaic_columns(result) == columns
    def width(n: int) -> int:
        return n * (side + COLORBAR_PIXELS) + (n - 1) * MOSAIC_GAP

    assert columns == 1 or width(columns) <= FIGURE_PIXELS  # as many as fit, up to PANEL_COLUMNS
    assert columns == PANEL_COLUMNS or width(columns + 1) > FIGURE_PIXELS


def test_progress_is_never_drawn_over_text():
    """An event that shows Gradio's progress bar shows it only on pictures (the image its pass runs over, the
    plot it draws) and on progress slots: Gradio draws the bar over the components it is shown on, and over a
    note, a table or the status line it hid what they said ("not scored yet" under a jumble of bar and timer)."""
    from vit_inspect.ui.demo import build_demo
    from vit_inspect.ui.style import PROGRESS_SLOT

    config = build_demo().config
    components = {c["id"]: c for c in config["components"]}
    shown = []
    for event in config["dependencies"]:
        if event["show_progress"] == "hidden" or not event["backend_fn"]:
            continue
        for target in event["show_progress_on"] or event["outputs"]:
            component = components[target]
            if component["type"] == "state" or component["props"].get("visible") is False:
                continue  # nothing drawn
            shown.append(component["props"].get("elem_id"))
            slot = PROGRESS_SLOT in (component["props"].get("elem_classes") or [])
            assert component["type"] == "image" or slot, (
                f"/{event['api_name']} shows its progress over #{component['props'].get('elem_id')}, "
                f"a {component['type']}")
    assert {"overview-progress", "faithfulness-progress", "sanity-progress", "ablate-progress",
            "importance-progress", "compare-progress", "downloads-progress", "input-image"} <= set(shown)

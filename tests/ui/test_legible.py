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

"""The page's own click arithmetic, run in Chromium: the listener that remembers where a click on a
picture landed (`clicks.CLICK_JS`), and the Heads heatmap's click -> (layer, head) (`heads.PICK_CELL_JS`)
against the server's `cell_at` on a real heatmap's box, on both sides of every cell border."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from vit_inspect.ui.clicks import CLICK_JS, CLICKABLE, HEATMAP_IDS, MAP_ID
from vit_inspect.ui.tabs.heads import (
    HeadsState,
    cell_at,
    cell_geometry,
    heatmap,
    pick_cell_js,
)


@pytest.fixture(scope="module")
def browser_page():
    from support.browser import CHROMIUM, CHROMIUM_ARGS, require_browser, sync_api
    require_browser()  # skips (or, in CI, fails) without a browser

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1200, "height": 900})
        finally:
            browser.close()


def png_data_url(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_the_listener_records_the_pictures_own_pixel_letterboxed_and_never_upscaled(browser_page):
    page = browser_page
    # as Gradio shows an image: an <img> filling its button, the picture contained (letterboxed) in it
    page.set_content(f"""
        <div id="{HEATMAP_IDS['first_order']}"><button style="padding:0;border:0">
          <img id="small" src="{png_data_url(100, 50)}" style="width:300px;height:200px;object-fit:contain;display:block">
        </button><button id="download">download</button></div>
        <div id="{MAP_ID}"><button style="padding:0;border:0">
          <img id="large" src="{png_data_url(600, 300)}" style="width:300px;height:200px;object-fit:contain;display:block">
        </button></div>
        <div id="elsewhere"><button><img src="{png_data_url(10, 10)}"></button></div>""")
    page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth)")
    page.evaluate("js => eval('(' + js + ')')()", CLICK_JS)

    def click(selector: str, x: float, y: float):
        page.evaluate("window.vitInspectClick = null")
        page.locator(selector).click(position={"x": x, "y": y})
        return page.evaluate("window.vitInspectClick")

    # (positions in whole CSS pixels: the browser's click events carry whole pixels)
    # 100 x 50 picture in a 300 x 200 box: shown at its own size, centred: its pixel (0, 0) at (100, 75)
    assert click("#small", 100 + 30, 75 + 11) == {"id": HEATMAP_IDS["first_order"], "x": 30, "y": 11}
    # 600 x 300 in 300 x 200: halved to 300 x 150, 25 pixels above and below: (41, 36) -> its pixel (82, 22)
    assert click("#large", 41, 25 + 11) == {"id": MAP_ID, "x": 82, "y": 22}
    assert click("#large", 41, 10) == {"id": MAP_ID, "x": 82, "y": -30}  # in the margin: the picks refuse it
    assert click("#download", 5, 5) is None  # a button without a picture
    assert click("#elsewhere img", 3, 3) is None  # a picture the page does not turn into controls
    assert set(CLICKABLE) == {MAP_ID, *HEATMAP_IDS.values()}


def test_the_page_picks_the_servers_cell_of_a_real_heatmap(browser_page):
    values = np.arange(12 * 3, dtype=float).reshape(12, 3)
    _, box = heatmap(values, "a heatmap\nits second line", "logits", None)
    geometry = cell_geometry(HeadsState(key=(), boxes=(("first_order", box),)), (12, 3))
    assert geometry == {"first_order": {"box": list(box), "grid": [12, 3]}}
    x0, y0, x1, y1 = box
    # both sides of every column and row border (as integer pixels, which is what a click gives), and beyond
    xs = sorted({int(np.floor(x0 + (x1 - x0) * k / 3)) + d for k in range(4) for d in (-1, 0, 1)})
    ys = sorted({int(np.floor(y0 + (y1 - y0) * k / 12)) + d for k in range(13) for d in (-1, 0, 1)})
    pixels = [(x, y) for x in xs for y in ys] + [(-3, 40), (int(x1) + 40, int(y0) + 5)]
    expected = [list(cell) + [False] if (cell := cell_at(box, (12, 3), x, y)) else [5, 1, True] for x, y in pixels]
    assert sum(e[2] is False for e in expected) > 100 and sum(e[2] is True for e in expected) > 20  # both kinds

    picked = browser_page.evaluate(
        """([pick, geometry, pixels, id]) => { const run = eval("(" + pick + ")");
            return pixels.map(([x, y]) => { window.vitInspectClick = {id, x, y}; return run(geometry, 5, 1, true); }); }""",
        [pick_cell_js("first_order"), geometry, pixels, HEATMAP_IDS["first_order"]])
    assert picked == expected

    left = browser_page.evaluate(  # a click on another picture, the other heatmap, or none: controls unchanged
        """([pick, geometry, id]) => { const run = eval("(" + pick + ")"); const cell = [Math.ceil(geometry.first_order.box[0]) + 1,
                                                                                  Math.ceil(geometry.first_order.box[1]) + 1];
            window.vitInspectClick = {id: "attention-map", x: cell[0], y: cell[1]};
            const other = [run(geometry, 5, 1, true), window.vitInspectClick !== null];
            window.vitInspectClick = {id, x: cell[0], y: cell[1]};
            const noGeometry = [run(null, 5, 1, true), window.vitInspectClick];
            window.vitInspectClick = {id, x: cell[0], y: cell[1]};
            return [...other, ...noGeometry, run(geometry, 5, 1, true), run(geometry, 5, 1, true)]; }""",
        [pick_cell_js("first_order"), geometry, HEATMAP_IDS["first_order"]])
    assert left == [[5, 1, True], True, [5, 1, True], None, [0, 0, False], [5, 1, True]]  # each click used once
    assert json.loads(json.dumps(geometry)) == geometry  # what Gradio's JSON component carries

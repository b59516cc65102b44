"""The Attention tab's browser side: the patch grid sent with each image (`map_geometry`), and the click
arithmetic the page runs (`PICK_JS`), run in Chromium and compared with the server's `TokenLayout.patch_at`
on every pixel class of a non-square grid of non-square patches."""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

from vit_inspect.core.tokens import TokenLayout
from vit_inspect.ui.clicks import CLICKABLE, MAP_ID
from vit_inspect.ui.tabs.attention import PICK_JS, map_geometry
from vit_inspect.ui.view import PATCH, READOUT

# 5 rows of 12-pixel patches and 7 columns of 16-pixel ones: an input of 60 x 112 pixels
LAYOUT = TokenLayout(num_prefix_tokens=1, has_class_token=True, num_dist_tokens=0, num_reg_tokens=0,
                     grid_h=5, grid_w=7, patch_h=12, patch_w=16)


def test_the_geometry_sent_with_an_image_is_its_input_patch_and_grid():
    geometry = map_geometry(SimpleNamespace(layout=LAYOUT))
    # the map shows the 112-pixel-wide input 4 times as large: at least 448 pixels (`panels.main_scale`)
    assert geometry == {"scale": 4, "input": [60, 112], "patch": [12, 16], "grid": [5, 7]}
    assert json.loads(json.dumps(geometry)) == geometry  # what Gradio's JSON component carries


def test_the_click_listener_listens_to_the_map():
    assert MAP_ID == "attention-map" and MAP_ID in CLICKABLE


def test_the_browser_turns_a_clicked_pixel_into_the_servers_patch():
    from support.browser import CHROMIUM, CHROMIUM_ARGS, require_browser, sync_api
    require_browser()  # skips (or, in CI, fails) without a browser

    geometry = map_geometry(SimpleNamespace(layout=LAYOUT)) | {"scale": 1}  # every input pixel, then enlarged
    ys = [0, 1, 11, 12, 13, 23, 24, 47, 48, 59]  # both sides of every kind of patch border, and the last row
    xs = [0, 15, 16, 17, 31, 32, 95, 96, 111]
    inside = [(x, y) for x, y in itertools.product(xs, ys)]
    outside = [(112, 0), (200, 30), (0, 60), (50, 90), (-1, 10), (10, -1)]  # colour bar, caption, beyond
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            picked = page.evaluate(
                """([pick, geometry, clicks]) => {
                    const run = eval("(" + pick + ")");
                    return clicks.map(([x, y]) => { window.vitInspectClick = {id: "attention-map", x, y};
                                                    return run(geometry, 0, 0, "unchanged"); });
                }""", [PICK_JS, geometry, inside + outside])
            untouched = page.evaluate(  # no click remembered (a select without one), no image yet, another picture
                """([pick, geometry]) => { const run = eval("(" + pick + ")"); window.vitInspectClick = null;
                    const none = run(geometry, 3, 4, "q"); window.vitInspectClick = {id: "attention-map", x: 1, y: 1};
                    const noImage = [run(null, 3, 4, "q"), window.vitInspectClick];
                    window.vitInspectClick = {id: "first-order-map", x: 1, y: 1};
                    return [none, ...noImage, run(geometry, 3, 4, "q"), window.vitInspectClick]; }""", [PICK_JS, geometry])
            enlarged = page.evaluate(  # the map drawn 4x: map pixel (x, y) is input pixel (x / 4, y / 4)
                """([pick, geometry, clicks]) => { const run = eval("(" + pick + ")");
                    return clicks.map(([x, y]) => { window.vitInspectClick = {id: "attention-map", x, y};
                                                    return run(geometry, 0, 0, "unchanged"); }); }""",
                [PICK_JS, geometry | {"scale": 4}, [(4 * x + 3, 4 * y + 3) for x, y in inside] + [(448, 0)]])
        finally:
            browser.close()
    assert picked[:len(inside)] == [[*LAYOUT.patch_at(y, x), PATCH] for x, y in inside]
    assert picked[len(inside):] == [[0, 0, "unchanged"]] * len(outside)
    assert untouched[:3] == [[3, 4, "q"], [3, 4, "q"], None]  # and a click is used once
    assert untouched[3:] == [[3, 4, "q"], {"id": "first-order-map", "x": 1, "y": 1}]  # left for its own picture
    assert enlarged == [[*LAYOUT.patch_at(y + 0.75, x + 0.75), PATCH] for x, y in inside] + [[0, 0, "unchanged"]]
    assert PATCH != READOUT

"""The app in a real browser (Debian's Chromium through Playwright): upload, slide, click, switch tabs.

Screenshots of each step go to artifacts/browser/ (git-ignored) for a person to look at. Without
/usr/bin/chromium the test is skipped, unless VIT_INSPECT_REQUIRE_BROWSER=1 (CI), where it fails.
"""
from __future__ import annotations

import pytest
from playwright import sync_api
from support.app import APP_MARKS, REPO
from support.browser import click_pixel, first_view, image_src, open_tab, shot

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app


def test_upload_slide_click_and_switch_tabs(server, page, tmp_path):
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    expect(page.get_by_text("12 layers × 3 heads")).to_be_visible()  # the model in use is shown
    first_view(page)  # the example, analysed on page load
    shot(page, "01_start")
    before = server.forwards

    page.locator("#input-image input[type=file]").set_input_files(str(REPO / "assets" / "coffee.png"))
    expect(page.locator("#predictions")).to_contain_text("espresso")
    shot(page, "02_predictions")
    assert server.forwards == before + 1, "a new image should cost exactly one forward pass"
    open_tab(page, "All maps")
    compare = image_src(page, "compare-maps")
    open_tab(page, "Attention distance")
    distance = image_src(page, "distance-plot")

    open_tab(page, "Attention")
    readout = image_src(page, "attention-map")
    page.locator("#layer-slider input[type=range]").press("Home")  # one keypress, one redraw: layer 0
    expect(page.locator("#layer-slider input[type=number]")).to_have_value("0")
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", readout)
    first_layer = image_src(page, "attention-map")
    shot(page, "03_attention_layer0")

    click_pixel(page.locator("#attention-map img"), x=200, y=80)  # the map is 2x: crop pixel (40, 100) -> (2, 6)
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", first_layer)
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    expect(page.locator("#patch-row input")).to_have_value("2")
    expect(page.locator("#patch-col input")).to_have_value("6")
    shot(page, "04_attention_clicked_patch")

    open_tab(page, "Rollout")
    rollout = image_src(page, "rollout-map")
    page.locator("#discard-slider input[type=range]").press("End")  # discard ratio 0.95
    expect(page.locator("#discard-slider input[type=number]")).to_have_value("0.95")
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)
    shot(page, "05_rollout_discard")

    open_tab(page, "All maps")  # redrawn with the layer, patch and discard ratio chosen since
    expect(page.locator("#compare-maps img")).not_to_have_attribute("src", compare)
    shot(page, "06_all_maps")
    open_tab(page, "Attention distance")  # the highlighted layer follows the slider
    expect(page.locator("#distance-plot img")).not_to_have_attribute("src", distance)
    shot(page, "07_attention_distance")

    assert server.forwards == before + 1, "moving sliders, clicking or switching tabs ran the model"
    expect(errors).to_have_count(0)

    bad = tmp_path / "not_an_image.jpg"
    bad.write_text("a text file with a photo's name")
    page.locator("#input-image input[type=file]").set_input_files(str(bad))
    expect(page.locator("#notice")).to_contain_text("not_an_image.jpg was not analysed: This file is not an image "
                                                    "format we can read")
    expect(page.locator("#predictions")).to_contain_text("espresso")  # the last good result, kept
    expect(errors).to_have_count(0)
    shot(page, "08_bad_upload_error")

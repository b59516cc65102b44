"""The app in a real browser (Debian's Chromium through Playwright): upload, slide, click, switch tabs.

Screenshots of each step go to artifacts/browser/ (git-ignored) for a person to look at. Without
/usr/bin/chromium the test is skipped, unless VIT_INSPECT_REQUIRE_BROWSER=1 (CI), where it fails.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "artifacts" / "browser"
CAT = re.compile("Egyptian cat|tabby|tiger cat")
TIMEOUT_MS = 60_000  # model load and first pass on a busy 2-core machine

if not CHROMIUM.is_file():
    if os.environ.get("VIT_INSPECT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"VIT_INSPECT_REQUIRE_BROWSER=1 but there is no browser at {CHROMIUM} "
                    "(apt-get install -y chromium)", pytrace=False)
    pytest.skip(f"no browser at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")
from test_app import CHELSEA, pytestmark, server  # noqa: E402,F401  (the same served app fixture, weights check and filters)


@pytest.fixture(scope="module")
def page(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 2400, "height": 1000})  # every tab in one row (narrower pages fold tabs into a menu)
        page.set_default_timeout(TIMEOUT_MS)
        sync_api.expect.set_options(timeout=TIMEOUT_MS)
        page.goto(server.url, wait_until="load")  # Gradio keeps a connection open: never "networkidle"
        page.wait_for_selector("#input-image")
        yield page
        browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def image_src(page, elem_id: str) -> str:
    image = page.locator(f"#{elem_id} img")
    sync_api.expect(image).to_be_visible()
    return image.get_attribute("src")


def click_pixel(image, x: int, y: int) -> None:
    """Click the image's own pixel (x, y), wherever the page shows it inside its box (never upscaled)."""
    box = image.bounding_box()
    natural_w, natural_h = image.evaluate("e => [e.naturalWidth, e.naturalHeight]")
    scale = min(box["width"] / natural_w, box["height"] / natural_h, 1.0)
    image.click(position={"x": (box["width"] - natural_w * scale) / 2 + (x + 0.5) * scale,
                          "y": (box["height"] - natural_h * scale) / 2 + (y + 0.5) * scale})


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def test_upload_slide_click_and_switch_tabs(server, page, tmp_path):
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    expect(page.get_by_text("12 layers × 3 heads")).to_be_visible()  # the model in use is shown
    shot(page, "01_start")

    page.locator("#input-image input[type=file]").set_input_files(str(CHELSEA))
    expect(page.locator("#predictions")).to_contain_text(CAT)
    shot(page, "02_predictions")
    assert server.forwards == 1, "a new image should cost exactly one forward pass"
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

    click_pixel(page.locator("#attention-map img"), x=100, y=40)  # crop pixel (y 40, x 100) -> patch (2, 6)
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

    assert server.forwards == 1, "moving sliders, clicking or switching tabs ran the model"
    expect(errors).to_have_count(0)

    bad = tmp_path / "not_an_image.jpg"
    bad.write_text("a text file with a photo's name")
    page.locator("#input-image input[type=file]").set_input_files(str(bad))
    expect(errors.first).to_contain_text("not an image format we can read")
    shot(page, "08_bad_upload_error")

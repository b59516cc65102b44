"""The Features view in a real browser: a small random SAE for DeiT-Ti uploaded with its feature index, the image
encoded, a patch clicked, a feature typed, a table row clicked, the feature explained, and a feature switched off.
Screenshots go to artifacts/browser/ (git-ignored)."""
from __future__ import annotations

import re

import pytest
from playwright import sync_api
from support.app import APP_MARKS, CHELSEA
from support.browser import ARTIFACTS, click_pixel, first_view, image_src, open_tab
from support.sae import random_sae

from vit_inspect.core.sae_file import save_sae
from vit_inspect.core.sae_index import index_path, save_index
from vit_inspect.jobs.sae_index import build_index

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app


def test_upload_an_sae_click_a_patch_see_the_table_and_the_map(server, page, deit, tmp_path):
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    page.set_viewport_size({"width": 1366, "height": 900})
    first_view(page)  # the example the page opens on: chelsea.png
    open_tab(page, "Features")

    page.locator("#features-encode").click()  # no SAE yet: a sentence, not a traceback
    expect(page.locator("#features-note")).to_contain_text("Load an SAE first")
    sae, path = random_sae(seed=7), tmp_path / "tiny_random_sae.safetensors"
    save_sae(sae, path)
    photos = [CHELSEA.with_name(name) for name in ("chelsea.png", "coffee.png", "astronaut.png")]
    index = build_index(deit, sae, path, photos, top=4, crop=32, labels=2)
    save_index(index, index_path(path))
    page.locator("#features-sae-file input[type=file]").set_input_files(str(path))
    expect(page.locator("#features-sae-file")).to_contain_text("tiny_random_sae")
    page.locator("#features-index-file input[type=file]").set_input_files(str(index_path(path)))
    expect(page.locator("#features-index-file")).to_contain_text("tiny_random_sae.index")
    page.locator("#features-load").click()
    status = page.locator("#features-sae-status")
    expect(status).to_contain_text("(block 6 output, 256 features, top-8, all tokens) loaded for")
    expect(status).to_contain_text("Its feature index (4 patches per feature) labels and illustrates each feature.")
    expect(status).not_to_contain_text("/tmp")

    forwards = server.forwards
    page.locator("#features-encode").click()
    expect(page.locator("#features-note")).to_contain_text("Encoded chelsea.png")
    table = page.locator("#features-table")
    expect(table).to_contain_text(re.compile(r"\d\.\d{2}"))  # an activation
    first = image_src(page, "features-map")
    assert server.forwards == forwards + 1
    before = table.inner_text()
    click_pixel(page.locator("#features-map img"), 2 * 16 * 1 + 5, 2 * 16 * 12 + 5)  # patch (12, 1), far from the peak
    expect(page.locator("#features-map img")).not_to_have_attribute("src", first)
    expect(table).not_to_have_text(before)
    assert server.forwards == forwards + 1, "a click ran the model"
    page.screenshot(path=str(ARTIFACTS / "features_01_view.png"), full_page=True)

    expect(table).to_contain_text("%")  # the index's labels: the classes where each feature fires
    image_src(page, "features-gallery")
    expect(page.locator("#features-gallery-note")).to_contain_text("most activating patches of the index")

    cell = table.locator("[data-testid='cell-1-0']")  # the second row's feature (Gradio's grid of cells)
    second = int(cell.inner_text())
    shown = image_src(page, "features-map")
    cell.click()  # a row maps its feature, from the stored codes
    expect(page.locator("#features-map img")).not_to_have_attribute("src", shown)
    expect(page.locator("#features-feature input")).to_have_value(str(second))
    expect(page.locator("#features-gallery-note")).to_contain_text(f"Feature {second}'s")
    assert server.forwards == forwards + 1, "a row ran the model"
    page.locator("#features-explain").click()  # one more pass: Grad-CAM, LeGrad and AttnLRP of the feature
    expect(page.locator("#features-explain-note")).to_contain_text(f"Why feature {second} fires here")
    image_src(page, "features-explained")
    assert server.forwards == forwards + 2
    page.screenshot(path=str(ARTIFACTS / "features_02_row_explained.png"), full_page=True)

    clicked = image_src(page, "features-map")
    page.locator("#features-feature input").fill("3")
    page.locator("#features-feature input").press("Enter")
    expect(page.locator("#features-map img")).not_to_have_attribute("src", clicked)

    page.locator("#features-apply").click()  # scale 0: the feature switched off, one more pass
    expect(page.locator("#features-edit-note")).to_contain_text("Edited pass: feature 3 × 0 at block 6")
    image_src(page, "features-edited")
    expect(page.locator("#features-top-after")).to_contain_text("#")
    assert server.forwards == forwards + 3
    expect(page.locator("#features-explained img")).to_have_count(0)  # another feature: its explanation cleared
    page.screenshot(path=str(ARTIFACTS / "features_03_edit.png"), full_page=True)
    expect(errors).to_have_count(0)

"""The Concepts and Patch similarity views in a real browser (Debian's Chromium through Playwright), on the real
DeiT-Ti: the concepts figure drawn when the view opens, then for another k; a click on the similarity map that
makes the clicked patch the query, and a second image's map. Screenshots go to artifacts/browser/ (git-ignored)."""
from __future__ import annotations

import pytest
from playwright import sync_api
from support.app import APP_MARKS, REPO
from support.browser import ARTIFACTS, click_pixel, first_view, image_src, open_tab

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app


def test_concepts_and_patch_similarity(page):
    expect = sync_api.expect
    first_view(page)  # the example the page opens on: chelsea.png
    open_tab(page, "Concepts")
    expect(page.locator("#concepts-note")).to_contain_text("5 concepts of chelsea.png")
    expect(page.locator("#concepts-note")).to_contain_text("at the output of block 5 (seed 0)")
    before = image_src(page, "concepts-figure")
    k = page.locator("#concepts-k input[type='number']")
    k.fill("3")
    k.press("Enter")
    k.blur()
    page.locator("#concepts-k input[type='range']").dispatch_event("pointerup")  # the slider let go
    expect(page.locator("#concepts-note")).to_contain_text("3 concepts of chelsea.png")
    assert image_src(page, "concepts-figure") != before
    page.screenshot(path=str(ARTIFACTS / "concepts_01_image.png"), full_page=True)

    open_tab(page, "Patch similarity")
    expect(page.locator("#similarity-note")).to_contain_text("Patch (row 7, column 7) of chelsea.png")
    click_pixel(page.locator("#similarity-map img"), 4 * 32 + 16, 5 * 32 + 16)  # patch (5, 4), the map at 2×
    expect(page.locator("#similarity-note")).to_contain_text("Patch (row 5, column 4) of chelsea.png")
    expect(page.locator("#similarity-note")).to_contain_text("similarity 1 on itself")
    expect(page.locator("#similarity-row input")).to_have_value("5")
    page.locator("#similarity-other-image input[type='file']").set_input_files(str(REPO / "assets" / "coffee.png"))
    image_src(page, "similarity-other-map")
    expect(page.locator("[data-testid='toast-body']")).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "concepts_02_similarity.png"), full_page=True)

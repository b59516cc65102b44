"""The page as a researcher meets it, in Chromium at 1366×768 and 1920×1080: the first view answers with no
control touched; every section and view is in reach (no overflow menu) and readable (maps at their own size,
the main map at least 448 pixels wide, no table cut off); after scoring faithfulness for image 1 and
uploading image 2, no view shows image 1's classes; Compare explains one class with both models.
Screenshots go to artifacts/browser/ (git-ignored) for a person to look at."""
from __future__ import annotations

import re

import pytest
from playwright import sync_api
from support.app import APP_MARKS, REPO
from support.browser import ARTIFACTS, SCORED, FIRST_VIEW, PHOTOS, SECTION_OF, first_view, illegible, open_tab

from vit_inspect.plots.canvas import COLORBAR_PIXELS
from vit_inspect.plots.faithfulness import paper_name

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app

COFFEE = REPO / "assets" / "coffee.png"
CHELSEA_CLASSES = re.compile("Egyptian cat|tabby|tiger cat|lynx|Persian cat")  # image 1's top 5
SECTIONS = ("Explain", "Heads", "How it sees", "Compare", "Features", "Downloads")
VIEWS = [*SECTION_OF, "Compare", "Features", "Downloads"]
# every picture shown at its own size (never shrunk, so its 12-13 px text stays so); its natural width
SIZES = """() => [...document.querySelectorAll('img')].filter(i => i.offsetParent && i.naturalWidth && i.closest('[id]'))
  .map(i => [i.closest('[id]').id, i.naturalWidth, Math.round(i.getBoundingClientRect().width)])
  .filter(([id]) => id && !id.startsWith('component-'))"""  # the page's own pictures, by their elem_id
TABLES = """() => [...document.querySelectorAll('table')].filter(t => t.offsetParent).map(t => {
  const box = t.closest('.table-wrap') || t.parentElement; return [t.closest('[id]').id, box.scrollWidth, box.clientWidth]; })"""


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"page_{name}.png"))


def visible_text(page) -> str:
    return page.locator("body").inner_text()


def check_readable(page, where: str) -> None:
    """Every picture at its own size (the upload box aside), and no table wider than its box; no picture's
    text under 11 px, no buttons over a picture, no header broken inside a word (`illegible`)."""
    for elem_id, natural, shown in page.evaluate(SIZES):
        if elem_id not in PHOTOS:  # the upload and its previews fit their boxes
            assert shown >= natural - 1, f"{where}: #{elem_id} is {natural} px, shown at {shown} px"
    for elem_id, wide, box in page.evaluate(TABLES):
        assert wide <= box + 1, f"{where}: table #{elem_id} is {wide} px wide in a {box} px box"
    assert illegible(page) == [], where


def test_first_view_sections_a_second_image_and_compare(server, page, tiny_weights):
    expect = sync_api.expect
    for width, height in ((1920, 1080), (1366, 768)):  # the narrower last: the rest of the walk runs there
        page.set_viewport_size({"width": width, "height": height})
        page.reload(wait_until="load")
        page.wait_for_selector("#input-image")
        first_view(page)  # no control touched: the example's top-5, its input and three maps
        expect(page.locator("#crop img")).to_be_visible()
        tops = [page.locator(f"#{elem_id} img").bounding_box()["y"] for elem_id in FIRST_VIEW]
        assert max(tops) - min(tops) < 2, "the first view's maps sit side by side"
        bottom = max(page.locator(f"#{elem_id} img").bounding_box()["y"] + 224 for elem_id in FIRST_VIEW)
        assert bottom <= height, "the first view's maps are in the first screenful"
        assert page.locator(".overflow-menu:not(.hide)").count() == 0  # no "More tabs" menu
        for name in SECTIONS:
            expect(page.get_by_role("tab", name=name, exact=True)).to_be_in_viewport()
        check_readable(page, f"first view at {width}")
        shot(page, f"{width}_01_first_view")
        for view in VIEWS:
            open_tab(page, view)
            expect(page.get_by_role("tab", name=view, exact=True)).to_have_attribute("aria-selected", "true")
            if view in ("Attention", "Rollout", "Grad-CAM"):
                main = {"Attention": "attention-map", "Rollout": "rollout-map", "Grad-CAM": "gradcam-map"}[view]
                image = page.locator(f"#{main} img")
                expect(image).to_be_visible()
                assert image.evaluate("e => e.naturalWidth") >= 448 + COLORBAR_PIXELS
                assert image.bounding_box()["width"] >= 448 + COLORBAR_PIXELS - 1, f"{view}'s map shrunk at {width}"
            check_readable(page, f"{view} at {width}")
            page.screenshot(path=str(ARTIFACTS / f"page_{width}_view_{re.sub('[^a-z]+', '_', view.lower())}.png"),
                            full_page=True)

    # Score faithfulness for image 1: the verdicts under the first view's maps, and the table by paper name.
    open_tab(page, "Overview")
    page.locator("#overview-score").click()
    for name in ("attention", "rollout", "chefer"):
        expect(page.locator(f"#verdict-{name}")).to_contain_text(re.compile(rf"Faithfulness: \d+\w\w of {SCORED} maps"))
    shot(page, "1366_02_first_view_scored")
    open_tab(page, "Faithfulness")
    table = page.locator("#faithfulness-table")
    expect(table).to_contain_text(paper_name("chefer"))
    expect(page.locator("#faithfulness-note")).to_contain_text("Egyptian cat")
    check_readable(page, "Faithfulness, scored")

    # Image 2: no view shows image 1's classes; the scores say they were cleared and what to press.
    page.locator("#input-image input[type=file]").set_input_files(str(COFFEE))
    expect(page.locator("#predictions")).to_contain_text("espresso")
    expect(page.locator("#faithfulness-note")).to_contain_text("Cleared: the image")
    for view in VIEWS:
        open_tab(page, view)
        text = visible_text(page)
        assert not CHELSEA_CLASSES.search(text), f"{view} shows image 1's classes: {CHELSEA_CLASSES.search(text)[0]}"
    open_tab(page, "Overview")
    for name in ("attention", "rollout", "chefer"):
        expect(page.locator(f"#verdict-{name}")).to_contain_text("not scored yet")
    shot(page, "1366_03_second_image")

    # Compare: both models explain one class, named; the agreement table in full at 1366 pixels.
    open_tab(page, "Compare")
    page.locator("#compare-model input").fill("test_vit")
    page.locator("#compare-weights input[type=file]").set_input_files(str(tiny_weights))
    expect(page.locator("#compare-weights")).to_contain_text("tiny_random_test_vit")
    page.locator("#compare-load").click()
    expect(page.locator("#compare-status")).to_contain_text("6 layers × 2 heads")
    page.locator("#compare-run").click()
    note = page.locator("#compare-note")
    expect(note).to_contain_text("Both models explain the same class")
    expect(note).to_contain_text("A: espresso (#967). B: espresso (#967).")
    expect(page.locator("#compare-table")).to_contain_text("Spearman ρ")
    expect(page.locator("#compare-maps-ab img")).to_be_visible()
    check_readable(page, "Compare")
    page.screenshot(path=str(ARTIFACTS / "page_1366_04_compare.png"), full_page=True)

    # A section remembers its view: a new image while Heads is open, then Explain shows Attention drawn for it.
    open_tab(page, "Attention")
    page.get_by_role("tab", name="Heads", exact=True).click()
    page.locator("#input-image input[type=file]").set_input_files(str(REPO / "assets" / "astronaut.png"))
    expect(page.locator("#predictions")).not_to_contain_text("espresso")
    page.get_by_role("tab", name="Explain", exact=True).click()
    expect(page.get_by_role("tab", name="Attention", exact=True)).to_have_attribute("aria-selected", "true")
    expect(page.locator("#attention-map img")).to_be_visible()
    expect(page.locator("[data-testid='toast-body'].error")).to_have_count(0)

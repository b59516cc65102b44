"""What a user sees when something is refused, in a real browser at 1366×768 (Debian's Chromium through
Playwright): a rejected upload (a text file named .jpg, an 8000×6000 photo) is one sentence in the page's notice
line, which stays, and every panel keeps its last result, with no "Error" badge and no toast; a tiny image is
analysed with a warning there; a good upload clears the line. After a new image the Heads section's cleared
results say what changed and what to press. Screenshots go to artifacts/browser/ (git-ignored)."""
from __future__ import annotations

import pytest
from PIL import Image
from playwright import sync_api
from support.app import APP_MARKS, REPO
from support.browser import ARTIFACTS, CAT, first_view, image_src, open_tab

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app

BADGES = "[data-testid='status-tracker'] .error"  # Gradio's "Error" over an output of an event that raised
TOASTS = "[data-testid='toast-body']"


def upload(page, path) -> None:
    page.locator("#input-image input[type=file]").set_input_files(str(path))


def test_a_rejected_upload_reads_once_in_the_page_and_leaves_every_panel(server, page, tmp_path):
    expect = sync_api.expect
    page.set_viewport_size({"width": 1366, "height": 768})
    first_view(page)  # chelsea.png, analysed on page load
    maps = {elem_id: image_src(page, elem_id) for elem_id in ("first-attention", "first-rollout", "first-chefer")}
    notice = page.locator("#notice")

    text = tmp_path / "holiday.jpg"
    text.write_text("a text file with a photo's name")
    upload(page, text)
    expect(notice).to_contain_text("holiday.jpg was not analysed: This file is not an image format we can read "
                                   "(try PNG, JPEG, WebP, GIF, TIFF, BMP or PSD). The page still shows chelsea.png "
                                   "(model's centre crop, 224×224 pixels).")
    page.screenshot(path=str(ARTIFACTS / "errors_01_rejected_upload.png"))
    assert page.get_by_text("not an image format we can read").count() == 1  # once, in one place
    expect(page.locator(BADGES)).to_have_count(0)
    expect(page.locator(TOASTS)).to_have_count(0)
    expect(page.locator("#predictions")).to_contain_text(CAT)  # the last good result, every panel of it
    for elem_id, src in maps.items():
        expect(page.locator(f"#{elem_id} img")).to_have_attribute("src", src)
    expect(page.locator("#status")).to_contain_text("device cpu")  # the status line, uncovered

    big = tmp_path / "big_photo.jpg"
    Image.new("RGB", (8000, 6000), (90, 120, 150)).save(big, quality=80)
    upload(page, big)
    expect(notice).to_contain_text("big_photo.jpg was not analysed: The image is 8000×6000 = 48,000,000 pixels; "
                                   "the limit is 40,000,000")
    expect(page.locator(BADGES)).to_have_count(0)
    for elem_id, src in maps.items():
        expect(page.locator(f"#{elem_id} img")).to_have_attribute("src", src)

    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (5, 5), (200, 40, 40)).save(tiny)
    upload(page, tiny)
    expect(notice).to_contain_text("tiny.png: This image is 5×5 pixels, under 4 of the model's 16×16-pixel patches "
                                   "on a side (64 pixels): the model sees it enlarged, as a blur")
    expect(page.locator("#first-attention img")).not_to_have_attribute("src", maps["first-attention"])  # analysed
    page.screenshot(path=str(ARTIFACTS / "errors_02_tiny_image_warning.png"))

    upload(page, REPO / "assets" / "coffee.png")  # a good upload recovers and clears the line
    expect(page.locator("#predictions")).to_contain_text("espresso")
    expect(notice).to_have_text("")
    expect(page.locator(BADGES)).to_have_count(0)
    expect(page.locator(TOASTS)).to_have_count(0)


def test_the_heads_sections_cleared_results_say_what_changed_and_what_to_press(server, page):
    expect = sync_api.expect
    page.set_viewport_size({"width": 1366, "height": 768})
    upload(page, REPO / "assets" / "chelsea.png")
    expect(page.locator("#predictions")).to_contain_text(CAT)
    open_tab(page, "Ablate & rank")
    effect, ranking = page.locator("#ablate-effect"), page.locator("#importance-note")
    expect(effect).to_contain_text("Not ablated yet")  # empty results say how to fill them
    expect(ranking).to_contain_text("Not ranked yet")
    page.locator("#ablate-heads textarea, #ablate-heads input").first.fill("3:0, 3:1")
    page.locator("#ablate-button").click()
    expect(effect).to_contain_text("ablated: heads 3:0, 3:1, mode zero")
    page.locator("#importance-button").click()
    expect(ranking).to_contain_text("Spearman")

    upload(page, REPO / "assets" / "coffee.png")  # the Heads section in view while the image changes
    expect(page.locator("#predictions")).to_contain_text("espresso")
    cleared = "Cleared: the image or what the model sees of it changed (these were for {old}"
    expect(effect).to_contain_text(cleared.format(old="chelsea.png"))
    expect(effect).to_contain_text("Press Ablate these heads to compute them for coffee.png")
    expect(ranking).to_contain_text(cleared.format(old="chelsea.png"))
    expect(ranking).to_contain_text("Press Rank every head to compute them for coffee.png")
    expect(page.locator("#ablated-gradcam img")).to_have_count(0)
    expect(page.locator("#importance-map img")).to_have_count(0)
    expect(page.locator("#first-order-map img")).to_be_visible()  # drawn again from the new pass
    expect(page.locator("#lens-note")).to_contain_text("espresso")
    effect.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "errors_03_heads_after_a_new_image.png"))
    ranking.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "errors_04_heads_ranking_after_a_new_image.png"))

    page.locator("#ablate-button").click()  # ablated again, not ranked; then the image changes out of view
    expect(effect).to_contain_text("ablated: heads 3:0, 3:1, mode zero")
    open_tab(page, "Overview")
    upload(page, REPO / "assets" / "chelsea.png")
    expect(page.locator("#predictions")).to_contain_text(CAT)
    open_tab(page, "Ablate & rank")
    expect(effect).to_contain_text(cleared.format(old="coffee.png"))
    expect(effect).to_contain_text("Press Ablate these heads to compute them for chelsea.png")
    expect(ranking).to_contain_text("Not ranked yet")  # nothing was ranked for coffee.png: nothing was cleared
    expect(page.locator(BADGES)).to_have_count(0)

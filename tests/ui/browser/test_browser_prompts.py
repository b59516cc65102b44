"""A text prompt in Chromium: the app serves a random OpenCLIP model given by its own flags (`--model
open_clip:NAME --weights FILE --zero-shot ...`); the prompt box replaces the class search, and a prompt (then a
versus prompt) redraws every gradient map, is scored in the faithfulness table and named in the downloads; a
hostile prompt gets a sentence. Screenshots go to artifacts/browser/ (git-ignored) for a person to look at."""
from __future__ import annotations

import pytest
from playwright import sync_api
from support.browser import ARTIFACTS, open_tab

pytestmark = pytest.mark.slow  # Chromium on a served app
CAT, DOG = "a photo of a cat", "a photo of a dog"


@pytest.fixture(scope="module")
def server(clip_server):
    """The page under test serves the tiny OpenCLIP model (`clip_server`)."""
    return clip_server


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"prompt_{name}.png"), full_page=True)


def source(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} img").get_attribute("src")


def submit(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} textarea, #{elem_id} input").first
    box.fill(value)
    box.press("Enter")


def test_the_prompt_box_drives_every_map_the_scores_and_the_downloads(page):
    expect = sync_api.expect
    expect(page.locator("#first-chefer img")).to_be_visible()  # the example's first view, no control touched
    expect(page.locator("#prompt")).to_be_visible()
    expect(page.locator("#class-search")).to_be_hidden()
    expect(page.locator("#predictions")).to_contain_text("coffee")  # the zero-shot list's top-5
    shot(page, "first_view")

    before = source(page, "first-chefer")
    submit(page, "prompt", CAT)
    expect(page.locator("#first-chefer img")).not_to_have_attribute("src", before)
    shot(page, "cat")
    open_tab(page, "Grad-CAM")
    expect(page.locator("#gradcam-map img")).to_be_visible()
    drawn = source(page, "gradcam-map")
    submit(page, "versus", DOG)
    expect(page.locator("#gradcam-map img")).not_to_have_attribute("src", drawn)
    shot(page, "cat_versus_dog")

    open_tab(page, "Faithfulness")
    page.locator("#faithfulness-score").click()
    expect(page.locator("#faithfulness-table")).to_contain_text(f"prompt '{CAT}' versus prompt '{DOG}'")
    expect(page.locator("#faithfulness-note")).to_contain_text("similarity")
    shot(page, "faithfulness")

    page.get_by_role("tab", name="Downloads", exact=True).click()
    page.locator("#downloads-button").click()
    expect(page.locator("#downloads-note")).to_contain_text(f"prompt '{CAT}' versus prompt '{DOG}'")

    submit(page, "prompt", "a photo of a\u200bcat")  # an invisible character: a sentence, nothing redrawn
    expect(page.locator("#notice")).to_contain_text("U+200B")
    submit(page, "prompt", "")
    expect(page.locator("#notice")).to_contain_text("The prompt is empty")
    expect(page.locator("[data-testid='toast-body']")).to_have_count(0)  # the sentence is in the page, once
    box = page.locator("#prompt textarea, #prompt input").first
    box.fill("x" * 1000)  # the box holds at most 300 characters; the server checks again
    assert len(box.input_value()) == 300
    shot(page, "refused")

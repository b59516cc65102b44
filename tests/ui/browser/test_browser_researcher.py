"""The researcher-facing fixes of issue 10 in a real browser (Debian's Chromium through Playwright), one
server and one page for all checks: class search ("1" is goldfish), colour bars and scales, every head
with threshold masks, typed patches, refused inputs that leave the panels alone, rollout options, input
geometry (a dog and a cat side by side), downloads, the Model tab's downloads and a model switch.
Screenshots go to artifacts/browser/ (git-ignored) for a person to look at."""
from __future__ import annotations

import re

import pytest
from playwright import sync_api
from support import dog_and_cat
from support.app import APP_MARKS, CHELSEA, WEIGHTS
from support.browser import ARTIFACTS, first_view, image_src, open_tab

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app

def shot(page, name: str, full: bool = False) -> None:
    page.screenshot(path=str(ARTIFACTS / f"r{name}.png"), full_page=full)


def natural_size(page, elem_id: str) -> tuple[int, int]:
    # the image may still be loading when the tab opens (naturalWidth 0 until then): wait for its load event
    return tuple(page.locator(f"#{elem_id} img").evaluate(
        "e => (e.complete && e.naturalWidth) ? [e.naturalWidth, e.naturalHeight] : new Promise(resolve => "
        "e.addEventListener('load', () => resolve([e.naturalWidth, e.naturalHeight]), {once: true}))"))


def test_researcher_workflow(server, page, tmp_path):
    expect = sync_api.expect
    expect(page.get_by_text("12 layers × 3 heads")).to_be_visible()
    first_view(page)  # the example the page opens on: chelsea.png
    expect(page.locator("#seen-region img")).to_be_visible()  # the upload, with the region the model saw
    shot(page, "01_predictions_and_seen_region", full=True)

    # Colour bars: every map is wider and taller than its crop, drawn 448 pixels wide (bar right, caption below).
    open_tab(page, "Attention")
    width, height = natural_size(page, "attention-map")
    assert width > 448 + 60 and height > 448 + 20
    # Head is disabled under "mean of heads", and enabled again.
    head = page.locator("#head-slider input[type=range]")
    expect(head).to_be_enabled()
    page.locator("#mean-heads input").check()
    expect(head).to_be_disabled()
    shot(page, "02_head_disabled_under_mean")
    page.locator("#mean-heads input").uncheck()
    expect(head).to_be_enabled()
    # Typing a patch row makes that patch the query.
    before = image_src(page, "attention-map")
    page.locator("#patch-row input").fill("3")
    page.locator("#patch-row input").press("Enter")
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", before)
    shot(page, "03_typed_patch_is_the_query")
    # One shared colour scale redraws the map with another range.
    before = image_src(page, "attention-map")
    page.locator("#scale").get_by_text("shared across layers and heads").click()
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", before)
    shot(page, "04_shared_scale")

    # Every head of the layer, then with DINO's threshold mask.
    open_tab(page, "All heads")
    grid = image_src(page, "heads-grid")
    page.locator("#threshold-on input").check()
    expect(page.locator("#heads-grid img")).not_to_have_attribute("src", grid)
    shot(page, "05_all_heads_threshold", full=True)

    # Rollout: vit-explain's whole-matrix discard and gradient rollout; a backward range is swapped.
    open_tab(page, "Rollout")
    rollout = image_src(page, "rollout-map")
    page.locator("#discard-slider input[type=range]").press("End")  # one action, then its redraw
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)
    rollout = image_src(page, "rollout-map")
    page.locator("#discard-where").get_by_text("lowest in the whole matrix (vit-explain)").click()
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)
    shot(page, "06a_whole_matrix_discard")
    rollout = image_src(page, "rollout-map")
    page.locator("#rollout-method").get_by_text("gradient rollout for the class (vit-explain)").click()
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)
    shot(page, "06_gradient_rollout")
    rollout = image_src(page, "rollout-map")
    page.locator("#first-layer input[type=number]").fill("10")
    page.locator("#first-layer input[type=number]").press("Enter")
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)  # layers 10-11
    rollout = image_src(page, "rollout-map")
    page.locator("#last-layer input[type=number]").fill("5")
    page.locator("#last-layer input[type=number]").press("Enter")
    expect(page.locator("#first-layer input[type=number]")).to_have_value("5")  # From 10, To 5: layers 5-10
    expect(page.locator("#last-layer input[type=number]")).to_have_value("10")
    expect(page.locator("#rollout-map img")).not_to_have_attribute("src", rollout)
    shot(page, "07_backward_range_swapped")
    page.locator("#first-layer input[type=number]").fill("0")
    page.locator("#first-layer input[type=number]").press("Enter")

    # The class picker: "1" is goldfish, "beagle" is #162; a search that finds nothing leaves the panels.
    open_tab(page, "Grad-CAM")
    gradcam = image_src(page, "gradcam-map")
    search = page.locator("#class-search textarea, #class-search input").first
    search.fill("1")
    search.press("Enter")
    expect(page.locator("#target input")).to_have_value(re.compile(r"^goldfish, Carassius auratus \(#1\)"))
    expect(page.locator("#gradcam-map img")).not_to_have_attribute("src", gradcam)
    shot(page, "08_class_1_is_goldfish")
    search.fill("beagle")
    search.press("Enter")
    expect(page.locator("#target input")).to_have_value(re.compile(r"^beagle \(#162\)"))
    gradcam = image_src(page, "gradcam-map")
    search.fill("no such animal")
    search.press("Enter")
    expect(page.locator("#notice")).to_contain_text("No class matches")
    expect(page.locator("#gradcam-map img")).to_have_attribute("src", gradcam)
    expect(page.locator("#target input")).to_have_value(re.compile(r"^beagle \(#162\)"))
    shot(page, "09_refused_class_leaves_panels")
    versus = page.locator("#versus textarea, #versus input").first
    versus.fill("tabby")
    versus.press("Enter")
    expect(page.locator("#gradcam-map img")).not_to_have_attribute("src", gradcam)
    expect(page.locator("#notice")).not_to_contain_text("No class matches")  # a class shown: the line cleared
    shot(page, "10_beagle_versus_tabby")

    # Downloads carry the settings; the Model tab has its own.
    open_tab(page, "Downloads")
    page.locator("#downloads-button").click()
    expect(page.locator("#download-files")).to_contain_text(re.compile(r"chelsea\s*\.json"))
    expect(page.locator("#download-files")).to_contain_text(re.compile(r"chelsea_heads\s*\.png"))
    open_tab(page, "Filters & positions")
    expect(page.locator("#filters img")).to_be_visible()
    expect(page.locator("#similarity img")).to_be_visible()
    page.locator("#model-downloads-button").click()
    expect(page.locator("#model-files")).to_contain_text(re.compile(r"deit_tiny_patch16_224_model\s*\.npz"))
    shot(page, "11_model_tab_downloads", full=True)
    sim_width = page.locator("#similarity img").bounding_box()["width"]
    assert sim_width > 600, f"the similarity figure is only {sim_width:.0f} px wide in the page"

    # The whole image: a dog and a cat side by side; "aspect kept" shows both (a dog class in the top 5).
    pair = tmp_path / "dog_and_cat.png"
    dog_and_cat(pair)
    open_tab(page, "Overview")
    page.locator("#geometry").get_by_text("whole image, aspect kept").click()
    page.locator("#input-image input[type=file]").set_input_files(str(pair))
    expect(page.locator("#predictions")).to_contain_text("German shepherd")
    expect(page.locator("#predictions")).to_contain_text(re.compile("tabby|tiger cat|Egyptian cat"))
    assert natural_size(page, "crop")[0] > 2 * natural_size(page, "crop")[1] - 32  # a wide, non-square input
    shot(page, "12_dog_and_cat_aspect_kept", full=True)

    # A failed load puts the model in use back into the picker; a good switch clears what was shown.
    page.locator("#input-image input[type=file]").set_input_files(str(CHELSEA))
    expect(page.locator("#predictions")).not_to_contain_text("German shepherd")  # the pair's top 5 has cats too
    open_tab(page, "Downloads")
    page.locator("#downloads-button").click()
    expect(page.locator("#download-files")).to_contain_text(re.compile(r"chelsea\s*\.json"))
    page.get_by_role("button", name="Change model").click()
    picker = page.locator("#model-name input")
    picker.fill("deit_small_patch16_224")
    page.locator("#load-model").click()
    expect(page.locator("#notice")).to_contain_text("are not available on this server")
    expect(picker).to_have_value("deit_tiny_patch16_224")
    shot(page, "13_failed_load_restores_picker", full=True)
    page.locator("#weights-file input[type=file]").set_input_files(str(WEIGHTS))
    page.locator("#load-model").click()
    expect(page.locator("#download-files")).not_to_contain_text(re.compile(r"chelsea\s*\.json"))
    expect(page.locator("#status")).to_contain_text("deit_tiny_patch16_224.safetensors")
    expect(page.locator("#notice")).not_to_contain_text("not available")  # a model loaded: the line cleared
    open_tab(page, "Overview")
    expect(page.get_by_text(re.compile("Loading the model|Running the model|Drawing"))).to_have_count(0)  # recomputed
    expect(page.locator("#predictions")).to_contain_text(re.compile("Egyptian cat|tabby"))
    shot(page, "14_after_model_switch", full=True)
    expect(page.locator("[data-testid='toast-body']")).to_have_count(0)  # every sentence was in the page

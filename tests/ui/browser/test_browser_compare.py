"""The Compare tab in a real browser: DeiT-Ti (real weights) against a tiny random timm ViT uploaded as a
.safetensors file (`test_vit`: 6 layers, 2 heads, 160-pixel input), so depths and grids both differ.

Screenshots go to artifacts/browser/ (git-ignored) for a person to look at.
"""
from __future__ import annotations

import re

import pytest
from playwright import sync_api
from support.app import APP_MARKS
from support.browser import ARTIFACTS, first_view, image_src, open_tab

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app


def shot(locator, name: str) -> None:
    locator.screenshot(path=str(ARTIFACTS / f"compare_{name}.png"))


def test_compare_deit_with_a_tiny_random_model(server, page, tiny_weights):
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    page.set_viewport_size({"width": 1366, "height": 768})  # every section in reach, the table in full
    expect(page.get_by_text("12 layers × 3 heads")).to_be_visible()
    first_view(page)  # the example the page opens on: chelsea.png
    open_tab(page, "Compare")

    page.locator("#compare-run").click()  # before model B is loaded: a sentence in the tab, not a traceback
    expect(page.locator("#compare-note")).to_contain_text("Load model B first")

    page.locator("#compare-model input").fill("test_vit")
    page.locator("#compare-weights input[type=file]").set_input_files(str(tiny_weights))
    expect(page.locator("#compare-weights")).to_contain_text("tiny_random_test_vit")
    page.locator("#compare-load").click()
    expect(page.locator("#compare-status")).to_contain_text("6 layers × 2 heads")
    expect(page.locator("#compare-status")).not_to_contain_text("/tmp")  # no server path

    forwards = server.forwards
    page.locator("#compare-run").click()
    note = page.locator("#compare-note")
    expect(note).to_contain_text("A's layer 11, the last (relative depth 1.00) ↔ B's layer 5, the last (relative depth 1.00)")
    # one question: both explain the class explained on the page, A's top class, named (the label sets agree)
    expect(note).to_contain_text("Both models explain the same class")
    expect(note).to_contain_text("A: Egyptian cat (#285). B: Egyptian cat (#285).")
    table = page.locator("#compare-table")
    expect(table).to_contain_text("11 ↔ 5")
    expect(table).to_contain_text("gradient-weighted attention")
    wrap = table.locator("table").evaluate("t => { const s = t.closest('.table-wrap') || t.parentElement;"
                                           " return [s.scrollWidth, s.clientWidth]; }")
    assert wrap[0] <= wrap[1], f"the agreement table is {wrap[0]} px wide in a {wrap[1]} px box"
    expect(page.locator("#compare-top-a")).to_contain_text(re.compile("Egyptian cat|tabby|tiger cat"))
    maps = image_src(page, "compare-maps-ab")
    for elem_id in ("compare-distance", "compare-heads-a", "compare-heads-b", "compare-pca-a", "compare-pca-b"):
        image_src(page, elem_id)
    assert server.forwards == forwards + 1, "the comparison should cost model A exactly one more pass"
    page.screenshot(path=str(ARTIFACTS / "compare_01_tab.png"), full_page=True)
    shot(page.locator("#compare-maps-ab"), "02_aligned_maps")
    shot(page.locator("#compare-table"), "03_agreement_table")
    shot(page.locator("#compare-distance"), "04_distance")
    shot(page.locator("#compare-heads-a"), "05_heads_a")
    shot(page.locator("#compare-pca-a"), "06_pca_a")

    page.locator("#compare-layer input[type=range]").press("Home")  # A's layer 0 -> B's layer 0
    expect(note).to_contain_text("A's layer 0 (relative depth 0.08) ↔ B's layer 0 (relative depth 0.17)")
    expect(page.locator("#compare-maps-ab img")).not_to_have_attribute("src", maps)
    page.locator("#compare-layer input[type=range]").press("ArrowRight")  # A's layer 1 (0.17) -> B's layer 0 (0.17)
    expect(note).to_contain_text("A's layer 1 (relative depth 0.17) ↔ B's layer 0 (relative depth 0.17)")
    page.locator("#compare-layer input[type=range]").press("ArrowRight")  # A's layer 2 (0.25) -> B's layer 1 (0.33)
    expect(note).to_contain_text("A's layer 2 (relative depth 0.25) ↔ B's layer 1 (relative depth 0.33)")
    shot(page.locator("#compare-maps-ab"), "07_aligned_maps_layer2")
    assert server.forwards == forwards + 1, "moving the slider ran the model"
    page.locator("#compare-classes input[value=\"each model's own top class\"]").check()  # asked for explicitly
    page.locator("#compare-run").click()
    expect(note).to_contain_text("Each model explains its own top class")
    expect(errors).to_have_count(0)

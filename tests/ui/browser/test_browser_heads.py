"""The Heads tab in a real browser (Debian's Chromium through Playwright): the logit lens table, an
ablation, head importance, and a click on a heatmap cell that selects that layer and head for the
Attention tab. Screenshots go to artifacts/browser/ (git-ignored)."""
from __future__ import annotations


import pytest
from playwright import sync_api
from support.app import APP_MARKS, CHELSEA
from support.browser import ARTIFACTS, first_view, image_src, open_tab

from vit_inspect.analysis import class_name
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.ui.common import shown_model
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.tabs.heads import cell_at, heatmap

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app


def test_heads_tab(server, page):
    expect = sync_api.expect
    first_view(page)  # the example the page opens on: chelsea.png
    open_tab(page, "Attention")
    attention = image_src(page, "attention-map")  # drawn for layer 11, head 0 by the first pass
    open_tab(page, "Ablate & rank")
    expect(page.locator("#lens-table")).to_contain_text("readout: rank of final class")
    expect(page.locator("#lens-note")).to_contain_text("Final class")
    expect(page.locator("#first-order-map img")).to_be_visible()

    page.locator("#ablate-heads textarea, #ablate-heads input").first.fill("3:0, 3:1, 3:2")
    page.locator("#ablate-button").click()
    expect(page.locator("#ablate-effect")).to_contain_text("ablated: heads 3:0, 3:1, 3:2, mode zero")
    expect(page.locator("#ablated-gradcam img")).to_be_visible()
    expect(page.locator("#ablate-top")).to_contain_text("Egyptian cat")
    page.locator("#ablate-heads textarea, #ablate-heads input").first.fill("12:0")
    page.locator("#ablate-button").click()
    expect(page.locator("#ablate-effect")).to_contain_text("does not exist")  # in the ablation's line, which says
    expect(page.locator("#ablate-effect")).to_contain_text(  # what the table and maps, kept, still show
        "the table and maps below still show ablated: heads 3:0, 3:1, 3:2, mode zero")
    expect(page.locator("#ablate-top")).to_contain_text("Egyptian cat")
    expect(page.locator("#ablated-gradcam img")).to_be_visible()
    expect(page.locator("[data-testid='toast-body']")).to_have_count(0)

    page.locator("#importance-button").click()
    expect(page.locator("#importance-note")).to_contain_text("Spearman")
    expect(page.locator("#importance-map img")).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "heads_01_ablation_and_importance.png"), full_page=True)

    # A click on the first-order heatmap: the cell under the pointer, from a figure drawn alike.
    handle = server.cache.get(CacheKey.of(server.config.model, server.config.weights, server.config.device))
    result = analyze_image(handle, CHELSEA)  # the page's pass: the same first-order values and class
    img = page.locator("#first-order-map img")
    natural = img.evaluate("e => [e.naturalWidth, e.naturalHeight]")
    shown = img.bounding_box()
    x, y = 0.35 * natural[0], 0.45 * natural[1]
    what = f"{shown_model(handle)}, class {class_name(handle.labels, result.target)}"
    local, box = heatmap(result.heads.first_order, f"{what}\nfirst-order estimate Σ A·∂y/∂A per head",
                         "estimated logit drop (logits)", None)
    assert list(local.shape[1::-1]) == natural  # the same figure layout as the page's
    layer, head = cell_at(box, (12, 3), x, y)
    img.click(position={"x": x * shown["width"] / natural[0], "y": y * shown["height"] / natural[1]})
    open_tab(page, "Attention")
    expect(page.locator("#layer-slider input[type=number]")).to_have_value(str(layer))
    expect(page.locator("#head-slider input[type=number]")).to_have_value(str(head))
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", attention)  # redrawn
    page.screenshot(path=str(ARTIFACTS / "heads_02_clicked_cell_selects_layer_head.png"), full_page=True)

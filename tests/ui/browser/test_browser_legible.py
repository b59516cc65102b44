"""Every result the page draws is legible where it is shown, in Chromium at 1366×768 and 1920×1080: each picture
at a size that keeps its smallest text at 11 pixels or more, its buttons above it, table headers broken only
between words, every table's columns in its box, and a running action's progress bar in the slot under its
button, never over the lines it will replace (`support.browser.illegible`). Screenshots go to
artifacts/browser/ (git-ignored) for a person to look at."""
from __future__ import annotations

import re

import pytest
from playwright import sync_api
from support.app import APP_MARKS
from support.browser import ARTIFACTS, SCORED, first_view, illegible, open_tab

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app, DeiT-Ti's sanity checks

RUNNING = '[data-testid="status-tracker"]:not(.hide)'  # Gradio's progress bar while an event runs


def test_results_are_legible_at_1366_and_1920(server, page):
    expect = sync_api.expect
    page.set_viewport_size({"width": 1366, "height": 768})
    page.reload(wait_until="load")
    first_view(page)
    assert illegible(page) == []

    page.locator("#overview-score").click()  # its bar under the button, not over the "not scored yet" lines
    expect(page.locator(f"#overview-progress {RUNNING}")).to_be_visible()
    assert illegible(page) == []
    assert page.locator(f"[id^='verdict-'] {RUNNING}").count() == 0
    for name in ("attention", "rollout", "chefer"):
        expect(page.locator(f"#verdict-{name}")).to_contain_text(re.compile(rf"Faithfulness: \d+\w\w of {SCORED} maps"))

    open_tab(page, "Faithfulness")
    page.locator("#sanity-run").click()
    expect(page.locator(f"#sanity-progress {RUNNING}")).to_contain_text("passes")
    assert illegible(page) == []  # nothing over the faithfulness table, the note or the sanity table
    expect(page.locator("#sanity-table")).to_contain_text("passes (ρ", timeout=300_000)
    expect(page.locator(f"#sanity-progress {RUNNING}")).to_have_count(0)

    open_tab(page, "Ablate & rank")
    page.locator("#ablate-heads input, #ablate-heads textarea").first.fill("3:1, 5:0")
    page.locator("#ablate-button").click()
    expect(page.locator("#ablate-effect")).to_contain_text("ablated: heads 3:1, 5:0")
    expect(page.locator("#lens-note")).to_contain_text("from block")
    for elem_id in ("ablated-attention", "ablated-rollout", "ablated-gradcam", "lens-plot"):
        expect(page.locator(f"#{elem_id} img")).to_be_visible()

    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        for view in ("Faithfulness", "Ablate & rank"):
            open_tab(page, view)
            expect(page.get_by_role("tab", name=view, exact=True)).to_have_attribute("aria-selected", "true")
            assert illegible(page) == [], f"{view} at {width} px"
            page.screenshot(path=str(ARTIFACTS / f"legible_{width}_{re.sub('[^a-z]+', '_', view.lower())}.png"),
                            full_page=True)
    open_tab(page, "Faithfulness")
    page.set_viewport_size({"width": 1366, "height": 768})
    page.locator("#sanity-strip").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "legible_1366_sanity.png"))

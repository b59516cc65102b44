"""Driving the app in Debian's Chromium through Playwright: where the browser is, screenshots, clicks."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright import sync_api

from support import REPO
from vit_inspect.plots.canvas import SMALL_TEXT
from vit_inspect.studies.faithfulness import faithfulness_methods
from vit_inspect.ui.style import PICTURE, PROGRESS_SLOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


ARTIFACTS = REPO / "artifacts" / "browser"
CAT = re.compile("Egyptian cat|tabby|tiger cat")
TIMEOUT_MS = 60_000  # model load and first pass on a busy 2-core machine


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def image_src(page, elem_id: str) -> str:
    image = page.locator(f"#{elem_id} img")
    sync_api.expect(image).to_have_count(1)
    image.scroll_into_view_if_needed()  # Gradio's images load lazily: one far below the fold stays 0×0 until seen
    sync_api.expect(image).to_be_visible()
    return image.get_attribute("src")


def click_pixel(image, x: int, y: int) -> None:
    """Click the image's own pixel (x, y), wherever the page shows it inside its box (never upscaled)."""
    box = image.bounding_box()
    natural_w, natural_h = image.evaluate("e => [e.naturalWidth, e.naturalHeight]")
    scale = min(box["width"] / natural_w, box["height"] / natural_h, 1.0)
    image.click(position={"x": (box["width"] - natural_w * scale) / 2 + (x + 0.5) * scale,
                          "y": (box["height"] - natural_h * scale) / 2 + (y + 0.5) * scale})


SECTION_OF = {  # each view's section: its sub-tabs are shown only once the section is open
    **dict.fromkeys(("Overview", "Attention", "Rollout", "Grad-CAM", "All maps", "Faithfulness"), "Explain"),
    **dict.fromkeys(("All heads", "Ablate & rank"), "Heads"),
    **dict.fromkeys(("Filters & positions", "Attention distance", "Concepts", "Patch similarity"), "How it sees"),
}
FIRST_VIEW = ("first-attention", "first-rollout", "first-chefer")  # the first view's maps
# The maps the Overview's Score ranks on the example: every method the faithfulness study scores (the random
# floor, the built-ins, the installed plugins) and the Attention view's own choice (head 0 of the last layer)
SCORED = len(faithfulness_methods()) + 1


def open_tab(page, name: str) -> None:
    """Open a view: its section first (a view of its own, such as Compare, is a section)."""
    if name in SECTION_OF:
        page.get_by_role("tab", name=SECTION_OF[name], exact=True).click()
    page.get_by_role("tab", name=name, exact=True).click()


def first_view(page) -> None:
    """Wait for the first view the page opens on: the example's top-5 and its three maps, no control touched."""
    for elem_id in FIRST_VIEW:
        sync_api.expect(page.locator(f"#{elem_id} img")).to_be_visible()
    sync_api.expect(page.locator("#predictions")).to_contain_text(CAT)


def require_browser() -> None:
    """Skip the calling test without /usr/bin/chromium, or fail it where VIT_INSPECT_REQUIRE_BROWSER=1 (CI)."""
    if not CHROMIUM.is_file():
        if os.environ.get("VIT_INSPECT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"VIT_INSPECT_REQUIRE_BROWSER=1 but there is no browser at {CHROMIUM} "
                        "(apt-get install -y chromium)", pytrace=False)
        pytest.skip(f"no browser at {CHROMIUM} (apt-get install -y chromium)")


# What the page shows that a reader could not read, as sentences (`illegible`): a picture shown smaller than its
# smallest text allows, a picture's buttons over the picture, a table header broken inside a word or running
# out of its cell, a table wider than its box, a progress bar over anything but a picture or a progress slot.
LEGIBILITY = """([smallest, least, photos, slot, picture]) => {
  const seen = (e) => e.offsetParent && e.getBoundingClientRect().width > 0;
  const where = (e) => { const host = e.closest('[id]'); return host ? '#' + host.id : 'the page'; };
  const overlap = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const problems = [];
  for (const img of document.querySelectorAll('img')) {
    const host = img.closest('[id]');
    if (!seen(img) || !img.naturalWidth || !host || !host.id || host.id.startsWith('component-') || photos.includes(host.id)) continue;
    const px = smallest * Math.min(1, img.getBoundingClientRect().width / img.naturalWidth);
    if (px < least) problems.push(`${where(img)}: ${img.naturalWidth} px wide, shown at ${Math.round(img.getBoundingClientRect().width)} px: its ${smallest}-px text at ${px.toFixed(1)} px`);
    const buttons = host.querySelector('.icon-button-wrapper');
    if (buttons && seen(buttons) && overlap(buttons.getBoundingClientRect(), img.getBoundingClientRect()))
      problems.push(`${where(img)}: its buttons sit over the picture`);
  }
  for (const span of document.querySelectorAll('th .header')) {
    if (!seen(span)) continue;
    const text = span.firstChild && span.firstChild.nodeType === 3 ? span.firstChild : null;
    for (const match of (text ? text.data.matchAll(/[^\\s-]+-?/g) : [])) {
      const range = document.createRange();
      range.setStart(text, match.index);
      range.setEnd(text, match.index + match[0].length);
      if (range.getClientRects().length > 1) problems.push(`${where(span)}: header "${text.data}" breaks inside "${match[0]}"`);
    }
    if (span.getBoundingClientRect().right > span.closest('th').getBoundingClientRect().right + 1)
      problems.push(`${where(span)}: header "${span.innerText}" runs out of its cell`);
  }
  for (const view of document.querySelectorAll('.virtual-table-viewport')) {
    if (seen(view) && view.scrollWidth > view.clientWidth + 1) problems.push(`${where(view)}: table ${view.scrollWidth} px wide in ${view.clientWidth} px`);
  }
  for (const tracker of document.querySelectorAll('[data-testid="status-tracker"]')) {
    if (!seen(tracker) || tracker.classList.contains('hide') || tracker.getBoundingClientRect().height < 2) continue;
    const block = tracker.closest('.block');  // a progress slot, an output picture or the upload (a photo)
    if (!(block && (block.classList.contains(slot) || block.classList.contains(picture) || block.id === photos[0])))
      problems.push(`${where(tracker)}: a progress bar over it`);
  }
  return problems;
}"""
PHOTOS = ["input-image", "crop", "seen-region"]  # photos without text: the upload and its previews fit their boxes


def illegible(page) -> list[str]:
    """What the page shows now that a reader could not read (`LEGIBILITY`); each picture's smallest text is
    `plots.canvas.SMALL_TEXT` pixels, and at least 11 pixels must reach the screen."""
    return page.evaluate(LEGIBILITY, [SMALL_TEXT, 11, PHOTOS, PROGRESS_SLOT, PICTURE])

"""Driving the app in Debian's Chromium through Playwright: where the browser is, screenshots, clicks."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright import sync_api

from support import REPO

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
    **dict.fromkeys(("Filters & positions", "Attention distance"), "How it sees"),
}
FIRST_VIEW = ("first-attention", "first-rollout", "first-relevance")  # the first view's maps


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

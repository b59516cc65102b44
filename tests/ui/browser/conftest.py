"""Fixtures of the browser tests: Chromium on the served app. Without /usr/bin/chromium every test here is
skipped, unless VIT_INSPECT_REQUIRE_BROWSER=1 (CI), where each fails."""
from __future__ import annotations

import pytest
from playwright import sync_api
from support.browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    TIMEOUT_MS,
    require_browser,
)


@pytest.fixture(scope="session", autouse=True)  # before the module's page and server
def _browser_installed():
    require_browser()


@pytest.fixture(scope="module")
def page(server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 2400, "height": 1000})  # every tab in one row (narrower pages fold tabs into a menu)
        page.set_default_timeout(TIMEOUT_MS)
        sync_api.expect.set_options(timeout=TIMEOUT_MS)
        page.goto(server.url, wait_until="load")  # Gradio keeps a connection open: never "networkidle"
        page.wait_for_selector("#input-image")
        yield page
        browser.close()

"""The app as the README serves it (`python app.py`, from this environment), driven in Chromium at 1366×768
through every section's main action on a photo of the user's: upload, each Explain view, score faithfulness, run
the sanity checks, ablate and rank heads, the model's own figures, compare with a second model, downloads.
No "Error" badge, error toast or traceback appears, in the page or in the server's log, and each result that
speaks names the current image (its file or its class), never the example the page opened on. Screenshots go to
artifacts/browser/ (git-ignored) for a person to look at."""
from __future__ import annotations

import json
import os
import re

import pytest
from playwright import sync_api
from support import REPO
from support.app import app_process, free_port
from support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, first_view, open_tab, require_browser

COFFEE = REPO / "assets" / "coffee.png"
THIS = re.compile(r"espresso \(#967\)")  # the upload's top class, as the page names a class
EXAMPLE = re.compile("Egyptian cat|tabby|tiger cat|chelsea")  # the example the page opens on
SLOW_MS = 300_000  # the sanity checks: about 25 passes of the model on a busy 2-core machine
FAILED = "[data-testid='status-tracker'] span.error, [data-testid='toast-body'].error"  # Gradio's "Error" badge, toast


@pytest.fixture(scope="module")
def served(tmp_path_factory, weights):
    """`python app.py` run by this environment's Python from the repository folder, its output in a log file."""
    require_browser()
    log = tmp_path_factory.mktemp("app") / "app.log"
    port = free_port()
    server = app_process(port, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, log)
    yield f"http://127.0.0.1:{port}/", log
    server.terminate()
    server.wait(timeout=60)


@pytest.fixture(scope="module")
def page(served):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        page.set_default_timeout(TIMEOUT_MS)
        sync_api.expect.set_options(timeout=TIMEOUT_MS)
        page.goto(served[0], wait_until="load")  # Gradio keeps a connection open: never "networkidle"
        page.wait_for_selector("#input-image")
        yield page
        browser.close()


def done(page, step: str) -> None:
    """After a step: no "Error" badge or error toast anywhere in the page, no traceback; a screenshot."""
    page.screenshot(path=str(ARTIFACTS / f"userpath_{step}.png"), full_page=True)
    failures = page.locator(FAILED).all_inner_texts()
    assert not failures, f"{step}: {failures}"
    assert "Traceback" not in page.locator("body").inner_text(), step


def answered(page, answer, step: str) -> None:
    """Wait for a long action's ``answer`` (a locator) or a failure, whichever shows first; then `done`."""
    sync_api.expect(answer.or_(page.locator(FAILED)).first).to_be_visible(timeout=SLOW_MS)
    done(page, step)


def column(page, elem_id: str, header: str) -> list[str]:
    """The cells under ``header`` of the table in ``elem_id``, row by row, as the page shows them."""
    table = page.locator(f"#{elem_id}")
    at = next(i for i, text in enumerate(table.get_by_role("columnheader").all_inner_texts()) if header in text)
    rows = [row.get_by_role("gridcell").all_inner_texts() for row in table.get_by_role("row").all()]
    return [cells[at] for cells in rows if cells]


def names_this_image(page, elem_id: str, *names: str) -> None:
    """``elem_id`` names the upload (each of ``names``, or its class) and nothing of the example."""
    text = page.locator(f"#{elem_id}")
    for name in names or (THIS,):
        sync_api.expect(text).to_contain_text(name)
    sync_api.expect(text).not_to_contain_text(EXAMPLE)


def test_every_section_on_an_upload(served, page, tiny_weights):
    expect = sync_api.expect
    first_view(page)  # the example, analysed with no control touched
    page.locator("#input-image input[type=file]").set_input_files(str(COFFEE))
    names_this_image(page, "predictions")
    done(page, "01_upload")

    for view, elem_id in (("Overview", "first-chefer"), ("Attention", "attention-map"), ("Rollout", "rollout-map"),
                          ("Grad-CAM", "gradcam-map"), ("All maps", "compare-maps")):
        open_tab(page, view)
        expect(page.locator(f"#{elem_id} img")).to_be_visible()
    done(page, "02_explain_views")

    open_tab(page, "Overview")
    page.locator("#overview-score").click()
    verdict = re.compile(r"Faithfulness: \d+\w\w of \d+ maps")
    answered(page, page.locator("#verdict-chefer").filter(has_text=verdict), "03_scored")
    for name in ("attention", "rollout"):
        expect(page.locator(f"#verdict-{name}")).to_contain_text(verdict)
    open_tab(page, "Faithfulness")
    names_this_image(page, "faithfulness-note", "coffee.png", "espresso")
    expect(page.locator("#faithfulness-curves img")).to_be_visible()
    done(page, "04_faithfulness")

    page.locator("#sanity-run").click()
    answered(page, page.locator("#sanity-table").filter(has_text="passes (ρ"), "05_sanity")
    names_this_image(page, "sanity-note", "coffee.png", "espresso")
    for metric in ("max-sensitivity", "infidelity"):  # captum's metrics, a number for every map
        cells = column(page, "sanity-table", metric)
        assert cells and all(re.fullmatch(r"\d+(\.\d+)?(e-?\d+)?", cell) for cell in cells), (metric, cells)

    open_tab(page, "All heads")
    expect(page.locator("#heads-grid img")).to_be_visible()
    open_tab(page, "Ablate & rank")
    names_this_image(page, "lens-note")
    page.locator("#ablate-heads textarea, #ablate-heads input").first.fill("3:0, 3:1")
    page.locator("#ablate-button").click()
    names_this_image(page, "ablate-effect", "ablated: heads 3:0, 3:1", THIS)
    expect(page.locator("#ablated-gradcam img")).to_be_visible()
    page.locator("#importance-button").click()
    names_this_image(page, "importance-note", "Spearman", THIS)
    done(page, "06_heads")

    open_tab(page, "Filters & positions")
    expect(page.locator("#filters img")).to_be_visible()
    page.locator("#model-downloads-button").click()
    expect(page.locator("#model-files")).to_contain_text(re.compile(r"deit_tiny_patch16_224_model\s*\.npz"))
    open_tab(page, "Attention distance")
    expect(page.locator("#distance-plot img")).to_be_visible()
    done(page, "07_how_it_sees")

    open_tab(page, "Compare")
    page.locator("#compare-model input").fill("test_vit")
    page.locator("#compare-weights input[type=file]").set_input_files(str(tiny_weights))
    page.locator("#compare-load").click()
    expect(page.locator("#compare-status")).to_contain_text("6 layers × 2 heads")
    page.locator("#compare-run").click()
    names_this_image(page, "compare-note", "A: espresso (#967)")
    expect(page.locator("#compare-maps-ab img")).to_be_visible()
    done(page, "08_compare")

    open_tab(page, "Downloads")
    page.locator("#downloads-button").click()
    names_this_image(page, "downloads-note", "coffee.png", THIS)
    record = page.locator("#download-files tr", has_text=re.compile(r"coffee\s*\.json")).locator("a")
    saved = json.loads(page.request.get(record.get_attribute("href")).body())
    assert saved["image"] == "coffee.png" and saved["topk"][0]["index"] == 967
    done(page, "09_downloads")
    assert "Traceback" not in served[1].read_text()

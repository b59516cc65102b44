"""The app's on-demand jobs in a real browser: the Faithfulness tab's Score, and the dataset-level mean
attention distance over uploaded images. Each picture is read back from the page and checked against what
it must show. Screenshots go to artifacts/browser/ (git-ignored) for a person to look at.
"""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image
from playwright import sync_api
from support import REPO
from support.app import APP_MARKS, CHELSEA
from support.browser import ARTIFACTS, first_view, image_src, open_tab

from vit_inspect.jobs.distance import dataset_attention_distance
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots.faithfulness import method_colours, paper_name
from vit_inspect.ui.common import shown_model
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.panels import FIGURE_PIXELS
from vit_inspect.studies.faithfulness import METHODS

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app

COFFEE = REPO / "assets" / "coffee.png"


def shown_pixels(page, elem_id: str) -> np.ndarray:
    """The (H, W, 3) pixels of the picture the page shows in `elem_id`, fetched as the browser did."""
    source = image_src(page, elem_id)
    if source.startswith("data:"):
        data = base64.b64decode(source.split(",", 1)[1])
    else:
        data = page.request.get(source).body()
    with Image.open(io.BytesIO(data)) as picture:
        return np.asarray(picture.convert("RGB"))


def test_faithfulness_score_and_dataset_average_show_their_pictures(server, page):
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    page.set_viewport_size({"width": 2000, "height": 1100})
    first_view(page)  # the example the page opens on: chelsea.png

    open_tab(page, "Faithfulness")
    page.get_by_role("button", name=re.compile("Score the maps")).click()
    table = page.locator("#faithfulness-table")
    expect(table).to_contain_text("the floor")  # the random map's row
    for method in METHODS:  # every standard map is scored, LeGrad and AttnLRP computed first, by its paper's name
        expect(table).to_contain_text(paper_name(method))
    curves = shown_pixels(page, "faithfulness-curves")
    others = [m for m in METHODS if m != "random"]
    for method, colour in method_colours(others).items():  # each one's colour is drawn: its line, its legend
        assert (curves == colour).all(axis=-1).sum() >= 40, method
    page.locator("#faithfulness-curves").screenshot(path=str(ARTIFACTS / "jobs_01_faithfulness.png"))

    open_tab(page, "Attention distance")
    page.locator("#dataset-files input[type=file]").set_input_files([str(CHELSEA), str(COFFEE)])
    expect(page.locator("#dataset-files")).to_contain_text("coffee")  # both uploads listed (the name in parts)
    page.get_by_role("button", name="Average over these images").click()
    expect(page.locator("#dataset-plot img")).to_be_visible()
    handle = server.cache.get(CacheKey.of(server.config.model, server.config.weights, server.config.device))
    stats = dataset_attention_distance(handle, [CHELSEA, COFFEE])
    expected = distance_plots.attention_distance_panel(stats.distances, image_width=224, selectable=False,
                                         title=f"{shown_model(handle)} · mean over 2 images").background
    np.testing.assert_array_equal(shown_pixels(page, "dataset-plot"), expected)
    page.locator("#dataset-plot").screenshot(path=str(ARTIFACTS / "jobs_02_dataset_distance.png"))
    expect(errors).to_have_count(0)


def test_sanity_checks_run_with_progress_cancel_and_a_verdict_column(server, page):
    """Run the sanity checks from the Faithfulness view: the progress bar counts passes, Cancel stops a second
    run before its next pass, and the strip, the curves, the table and the verdict column show the finished run."""
    expect = sync_api.expect
    errors = page.locator("[data-testid='toast-body'].error")
    page.set_viewport_size({"width": 2000, "height": 1100})
    page.reload(wait_until="load")
    first_view(page)
    open_tab(page, "Faithfulness")
    page.get_by_role("button", name=re.compile("Score the maps")).click()
    expect(page.locator("#faithfulness-table")).to_contain_text("not run")  # the verdict column, before the checks
    run = page.get_by_role("button", name=re.compile("Run the sanity checks"))
    run.click()
    expect(page.locator(".progress-text").first).to_contain_text("passes")  # Gradio's bar, counting passes
    page.locator("#sanity-strip").screenshot(path=str(ARTIFACTS / "jobs_03_sanity_running.png"))
    table = page.locator("#sanity-table")
    expect(table).to_contain_text("passes (ρ", timeout=300_000)
    for method in ("attention", "rollout", "gradcam", "chefer", "legrad", "attnlrp"):
        expect(table).to_contain_text(paper_name(method))
    expect(page.locator("#faithfulness-table")).to_contain_text("passes (ρ")  # beside the scores
    expect(page.locator("#sanity-note")).to_contain_text("below 0.5")
    strip, curves = shown_pixels(page, "sanity-strip"), shown_pixels(page, "sanity-curves")
    # every step's column in two bands, two plots to a row: each at its own size in the 1366-px page
    assert 900 < strip.shape[1] <= FIGURE_PIXELS and 900 < curves.shape[1] <= FIGURE_PIXELS
    colours = {tuple(c) for c in curves.reshape(-1, 3)}
    assert all(colour in colours for colour in method_colours(["attention", "rollout", "chefer"]).values())
    page.locator("#sanity-strip").screenshot(path=str(ARTIFACTS / "jobs_04_sanity_strip.png"))
    page.locator("#sanity-curves").screenshot(path=str(ARTIFACTS / "jobs_05_sanity_curves.png"))

    run.click()  # again, then Cancel once the bar moves
    expect(page.locator(".progress-text").first).to_contain_text("passes")
    page.locator("#sanity-cancel").click()
    expect(page.locator("#sanity-note")).to_contain_text("cancelled after", timeout=120_000)
    expect(page.locator("#sanity-note")).to_contain_text("Nothing was changed")
    expect(table).to_contain_text("passes (ρ")  # the finished run's results stay
    expect(errors).to_have_count(0)

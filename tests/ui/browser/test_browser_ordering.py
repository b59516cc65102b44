"""A patch or a head chosen in a real browser is chosen at once, before the server answers, so a redraw the
page sends meanwhile draws that choice rather than the previous one:

- typing a row ticks "clicked patch" in the browser (the server's type_patch is held until it has);
- clicking the map sets row, column and "clicked patch" in the browser (the server's pick_patch is held
  while a slider redraw is sent, and that redraw draws the clicked patch);
- clicking a Heads heatmap cell sets layer and head in the browser (the server's pick is held while a
  colour scale change redraws the attention map, and that redraw draws the clicked layer and head).

And the page records the tab it shows, so a new image's figures are drawn for the tab in view only."""
from __future__ import annotations

import functools
import io
import threading

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image
from playwright import sync_api
from support.app import APP_MARKS, CHELSEA, Server, pixels
from support.browser import click_pixel, first_view, image_src, open_tab

from vit_inspect.analysis import class_name
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.ui import inspector as inspector_module
from vit_inspect.ui.common import shown_model
from vit_inspect.ui.inspector import FIRST_PANELS, Inspector
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.panels import draw_panels
from vit_inspect.ui.tabs.heads import HeadsTab, cell_at, heatmap
from vit_inspect.ui.view import PATCH, READOUT

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: Chromium on the served app

COFFEE = CHELSEA.with_name("coffee.png")
HELD = {"type_patch": threading.Event(), "pick_patch": threading.Event(),  # set: that handler may answer
        "pick_head": threading.Event()}
INSPECTOR = ("type_patch", "pick_patch")  # Inspector's handlers; pick_head is HeadsTab.pick's handler


def held(name: str, answer):
    @functools.wraps(answer)  # Gradio reads the signature (the click's SelectData, the request)
    def wait_then_answer(*args, **kwargs):
        assert HELD[name].wait(120), f"the test never let {name} answer"
        return answer(*args, **kwargs)
    return wait_then_answer


@pytest.fixture(scope="module")
def server():
    answers = {name: getattr(Inspector, name) for name in INSPECTOR}
    pick_head = HeadsTab.pick
    for name in INSPECTOR:  # before the demo is built: its events hold the bound methods
        setattr(Inspector, name, held(name, answers[name]))
    HeadsTab.pick = lambda tab, which: held("pick_head", pick_head(tab, which))
    try:
        served = Server()
    finally:
        for name, answer in answers.items():
            setattr(Inspector, name, answer)
        HeadsTab.pick = pick_head
    yield served
    for event in HELD.values():
        event.set()
    served.demo.close()


def shown_pixels(page, elem_id: str) -> np.ndarray:
    """The picture the page shows in ``elem_id``'s image, as fetched by the page itself."""
    data = page.evaluate("async src => Array.from(new Uint8Array(await (await fetch(src)).arrayBuffer()))",
                         image_src(page, elem_id))
    with Image.open(io.BytesIO(bytes(data))) as picture:
        return np.asarray(picture.convert("RGB"))


def test_a_typed_patch_is_the_query_before_the_server_answers(server, page):
    expect = sync_api.expect
    first_view(page)
    open_tab(page, "Attention")
    readout = image_src(page, "attention-map")
    page.locator("#patch-row input").fill("3")
    page.locator("#patch-row input").press("Enter")
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    assert not HELD["type_patch"].is_set()  # ticked in the browser: the server has not answered
    expect(page.locator("#attention-map img")).to_have_attribute("src", readout)
    HELD["type_patch"].set()
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", readout)  # the typed patch's map


def test_a_clicked_patch_is_the_query_of_a_redraw_sent_before_the_server_answers(server, page):
    # what the map must show after the click and "mean of heads": drawn for another session through the API
    client = Client(server.url, verbose=False)
    client.predict(handle_file(str(CHELSEA)), api_name="/analyze")
    clicked = pixels(client.predict(query=PATCH, row=2, col=6, mean_heads=True, api_name="/attention"))
    readout = pixels(client.predict(query=READOUT, mean_heads=True, api_name="/attention"))
    assert not np.array_equal(clicked, readout)

    expect = sync_api.expect
    page.reload(wait_until="load")  # a new session: the readout token again (the module shares one page)
    first_view(page)
    open_tab(page, "Attention")
    before = image_src(page, "attention-map")
    click_pixel(page.locator("#attention-map img"), 200, 80)  # the map is 2x: crop (x 100, y 40), patch (2, 6)
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    expect(page.locator("#patch-row input")).to_have_value("2")
    expect(page.locator("#patch-col input")).to_have_value("6")
    assert not HELD["pick_patch"].is_set()  # set in the browser: the server's pick_patch has not answered
    expect(page.locator("#attention-map img")).to_have_attribute("src", before)

    page.locator("#mean-heads input").check()  # a redraw sent while pick_patch is still held
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", before)
    assert np.array_equal(shown_pixels(page, "attention-map"), clicked)  # the clicked patch, mean of heads
    HELD["pick_patch"].set()


def test_a_clicked_heads_cell_is_the_layer_and_head_of_a_redraw_sent_before_the_server_answers(server, page):
    # the cell under crop pixel (35 %, 45 %) of the first-order heatmap, from a figure drawn alike
    handle = server.cache.get(CacheKey.of(server.config.model, server.config.weights, server.config.device))
    result = analyze_image(handle, CHELSEA)  # the page's pass: the same first-order values and class
    what = f"{shown_model(handle)}, class {class_name(handle.labels, result.target)}"
    local, box = heatmap(result.heads.first_order, f"{what}\nfirst-order estimate Σ A·∂y/∂A per head",
                         "estimated logit drop (logits)", None)
    x, y = int(0.35 * local.shape[1]), int(0.45 * local.shape[0])
    layer, head = cell_at(box, (12, 3), x, y)
    assert (layer, head) != (11, 0)  # not the sliders' starting values
    # what the map must show after the click and a colour scale change: drawn for another session
    shared = "shared across layers and heads"
    client = Client(server.url, verbose=False)
    client.predict(handle_file(str(CHELSEA)), api_name="/analyze")
    clicked = pixels(client.predict(layer=layer, head=head, scale=shared, api_name="/attention"))
    assert not np.array_equal(clicked, pixels(client.predict(layer=11, head=0, scale=shared, api_name="/attention")))
    clicked_own = pixels(client.predict(layer=layer, head=head, api_name="/attention"))  # each map its own range

    expect = sync_api.expect
    page.reload(wait_until="load")  # a new session with the default controls (the module shares one page)
    page.wait_for_selector("#input-image")
    first_view(page)
    open_tab(page, "Attention")
    expect(page.locator(f"#query input[value='{READOUT}']")).to_be_checked()
    before = image_src(page, "attention-map")
    open_tab(page, "Ablate & rank")
    heatmap_img = page.locator("#first-order-map img")
    expect(heatmap_img).to_be_visible()
    assert heatmap_img.evaluate("e => [e.naturalWidth, e.naturalHeight]") == list(local.shape[1::-1])
    click_pixel(heatmap_img, x, y)
    open_tab(page, "Attention")  # the view's opening redraws its map: a redraw sent while the pick is held
    expect(page.locator("#layer-slider input[type=number]")).to_have_value(str(layer))
    expect(page.locator("#head-slider input[type=number]")).to_have_value(str(head))
    assert not HELD["pick_head"].is_set()  # set in the browser: the server's pick has not answered
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", before)
    assert np.array_equal(shown_pixels(page, "attention-map"), clicked_own)  # the clicked layer and head
    drawn = image_src(page, "attention-map")

    page.locator("#scale").get_by_text(shared).click()  # another redraw sent while the pick is still held
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", drawn)
    assert np.array_equal(shown_pixels(page, "attention-map"), clicked)  # the clicked layer and head
    HELD["pick_head"].set()


def test_a_new_images_figure_is_drawn_for_the_tab_in_view(server, page, monkeypatch):
    """An upload made while "All maps" is open: the answer clears the figure and the event that follows it
    draws it there, without the tab being opened again; the figures of tabs not in view are not drawn."""
    drawn = []
    draw = draw_panels
    monkeypatch.setattr(inspector_module, "draw_panels", lambda names, *args: drawn.extend(names) or draw(names, *args))
    page.reload(wait_until="load")  # a new session (the module shares one page)
    page.wait_for_selector("#input-image")
    first_view(page)
    open_tab(page, "All maps")
    sync_api.expect(page.locator("#compare-maps img")).to_be_visible()
    before = image_src(page, "compare-maps")
    drawn.clear()
    page.locator("#input-image input[type=file]").set_input_files(str(COFFEE))
    sync_api.expect(page.locator("#predictions")).to_contain_text("espresso")
    sync_api.expect(page.locator("#compare-maps img")).not_to_have_attribute("src", before)
    assert drawn.count("compare") == 1 and "distance" not in drawn and "heads" not in drawn
    assert set(drawn) == {*FIRST_PANELS, "compare"}  # nothing out of view

"""A patch chosen in a real browser is the query at once, before the server answers, so a redraw the page
sends meanwhile draws that patch rather than the class token's attention:

- typing a row ticks "clicked patch" in the browser (the server's type_patch is held until it has);
- clicking the map sets row, column and "clicked patch" in the browser (the server's pick_patch is held
  while a slider redraw is sent, and that redraw draws the clicked patch)."""
from __future__ import annotations

import functools
import io
import threading

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from test_browser import click_pixel, image_src, open_tab, page, sync_api  # noqa: F401  (shared fixtures)
from test_app import CHELSEA, Server, pixels, pytestmark  # noqa: F401  (weights check and filters)

import app

HELD = {"type_patch": threading.Event(), "pick_patch": threading.Event()}  # set: that handler may answer


@pytest.fixture(scope="module")
def server():
    answers = {name: getattr(app.Inspector, name) for name in HELD}

    def holding(name):
        @functools.wraps(answers[name])  # Gradio reads the signature (the click's SelectData, the request)
        def held(self, *args, **kwargs):
            assert HELD[name].wait(120), f"the test never let {name} answer"
            return answers[name](self, *args, **kwargs)
        return held

    for name in HELD:  # before the demo is built: its events hold the bound methods
        setattr(app.Inspector, name, holding(name))
    try:
        served = Server()
    finally:
        for name, answer in answers.items():
            setattr(app.Inspector, name, answer)
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
    page.locator("#input-image input[type=file]").set_input_files(str(CHELSEA))
    expect(page.locator("#predictions")).to_contain_text("cat")
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
    clicked = pixels(client.predict(query=app.PATCH, row=2, col=6, mean_heads=True, api_name="/attention"))
    readout = pixels(client.predict(query=app.READOUT, mean_heads=True, api_name="/attention"))
    assert not np.array_equal(clicked, readout)

    expect = sync_api.expect
    page.locator("#input-image input[type=file]").set_input_files(str(CHELSEA))
    expect(page.locator("#predictions")).to_contain_text("cat")
    open_tab(page, "Attention")
    before = image_src(page, "attention-map")
    click_pixel(page.locator("#attention-map img"), 100, 40)  # crop pixel (x 100, y 40): patch (row 2, col 6)
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    expect(page.locator("#patch-row input")).to_have_value("2")
    expect(page.locator("#patch-col input")).to_have_value("6")
    assert not HELD["pick_patch"].is_set()  # set in the browser: the server's pick_patch has not answered
    expect(page.locator("#attention-map img")).to_have_attribute("src", before)

    page.locator("#mean-heads input").check()  # a redraw sent while pick_patch is still held
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", before)
    assert np.array_equal(shown_pixels(page, "attention-map"), clicked)  # the clicked patch, mean of heads
    HELD["pick_patch"].set()

"""Typing a patch in a real browser ticks "clicked patch" at once, before the server answers, so a
redraw the page sends meanwhile (one a slider moved just before, deferred until its previous draw
ends) draws the typed patch rather than the class token's attention. The server's type_patch is
held until the browser has ticked it."""
from __future__ import annotations

import threading

import pytest

from test_browser import image_src, open_tab, page, sync_api  # noqa: F401  (shared fixtures)
from test_app import CHELSEA, Server, pytestmark  # noqa: F401  (weights check and filters)

import app

HELD = threading.Event()  # set: type_patch may answer


@pytest.fixture(scope="module")
def server():
    answer = app.Inspector.type_patch

    def held(self, *args, **kwargs):
        assert HELD.wait(120), "the test never let type_patch answer"
        return answer(self, *args, **kwargs)

    app.Inspector.type_patch = held  # before the demo is built: its events hold the bound method
    try:
        served = Server()
    finally:
        app.Inspector.type_patch = answer
    yield served
    HELD.set()
    served.demo.close()


def test_a_typed_patch_is_the_query_before_the_server_answers(server, page):
    expect = sync_api.expect
    page.locator("#input-image input[type=file]").set_input_files(str(CHELSEA))
    expect(page.locator("#predictions")).to_contain_text("cat")
    open_tab(page, "Attention")
    readout = image_src(page, "attention-map")
    page.locator("#patch-row input").fill("3")
    page.locator("#patch-row input").press("Enter")
    expect(page.locator("#query input[value='clicked patch']")).to_be_checked()
    assert not HELD.is_set()  # ticked in the browser: the server has not answered
    expect(page.locator("#attention-map img")).to_have_attribute("src", readout)
    HELD.set()
    expect(page.locator("#attention-map img")).not_to_have_attribute("src", readout)  # the typed patch's map

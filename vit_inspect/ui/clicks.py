"""Where on a picture a click landed, known in the browser before the server answers.

A click on an image reaches the server as Gradio's select event, and the server turns its pixel into a
patch (the attention map) or a layer and head (a Heads heatmap cell). A redraw sent by the page while
that answer is on its way reads the controls as they were, so it would draw the previous choice. The
page therefore makes the same choice itself at once:

- `CLICK_JS`, installed once per page (`install`), remembers the pixel a click lands on in one of the
  `CLICKABLE` pictures, computed exactly as Gradio's image select event computes it (the picture
  letterboxed in its button and never scaled up), in the capture phase, before the select event fires;
- each picture's own select listener (js only, no server function) reads that pixel with
  `CLICKED_PIXEL` and sets its controls from geometry the server sent with the picture.

Only the page's own controls change there; the server still computes the same choice from the same
pixel and clamps whatever any client sends.
"""
from __future__ import annotations

import json

import gradio as gr

MAP_ID = "attention-map"  # elem_id of the attention map
HEATMAP_IDS = {"importance": "importance-map", "first_order": "first-order-map"}  # Heads tab heatmaps
CLICKABLE = (MAP_ID, *HEATMAP_IDS.values())  # the pictures whose clicks the page turns into controls

CLICK_JS = """() => {
  if (window.vitInspectClicks) return;
  window.vitInspectClicks = true;
  const ids = %(ids)s;
  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    for (const id of ids) {
      const button = target ? target.closest("#" + id + " button") : null;
      const img = button ? button.querySelector("img") : null;
      if (!img || !img.naturalWidth || !img.naturalHeight) continue;
      const box = img.getBoundingClientRect();
      const ratio = Math.min(box.width / img.naturalWidth, box.height / img.naturalHeight, 1);
      const left = (box.width - img.naturalWidth * ratio) / 2, top = (box.height - img.naturalHeight * ratio) / 2;
      window.vitInspectClick = {id: id, x: Math.round((event.clientX - box.left - left) / ratio),
                                y: Math.round((event.clientY - box.top - top) / ratio)};
      return;
    }
  }, true);
}""" % {"ids": json.dumps(list(CLICKABLE))}


def clicked_pixel(elem_id: str) -> str:
    """JS statements that set `click` to the pixel remembered for picture `elem_id` and forget it (a click is
    used once), or leave `click` null when the last click was not on that picture (or there was none)."""
    return (f"let click = window.vitInspectClick;\n"
            f"  if (click && click.id === {json.dumps(elem_id)}) window.vitInspectClick = null; else click = null;")


def install(demo: gr.Blocks) -> None:
    """The page's click listener, installed once per page load (a js-only listener: no server function)."""
    gr.on([demo.load], None, js=CLICK_JS, queue=False)

"""The page's own style rules, so that its text stays readable where Gradio's defaults would cover or cut it:

- an output picture's buttons (download, fullscreen) sit in a row above it, never over its colour bar's labels
  or its title (Gradio floats them over the picture's top right corner);
- a table header wraps between words only (Gradio breaks it anywhere: "aft/er/blo/ck"), and Gradio sizes
  each column to at least its longest word, which it measures with the same rule;
- a progress slot (`common.progress_slot`) takes no room until an action shows its progress bar there: the
  bar is shown on slots and pictures only, never drawn over text.

They are added to the page's head when it loads (`install`), as the click listener is (`ui.clicks`): the
launcher, `app.demo` and the tests launch the same Blocks, and Gradio takes a style sheet only at launch.
"""
from __future__ import annotations

import json

import gradio as gr

PICTURE = "picture"  # the class of every output picture (`common.MAP_OUT`)
PROGRESS_SLOT = "progress-slot"  # the class of an empty line that shows an action's progress
PAGE_CSS = f"""
.{PICTURE} .image-container > .icon-button-wrapper.top-panel {{
  position: static; width: fit-content; margin: 0 0 4px auto;
}}
.table-wrap th.header-cell .header {{ word-break: normal; overflow-wrap: normal; }}
.{PROGRESS_SLOT} {{ min-height: 0; }}
.{PROGRESS_SLOT}:has([data-testid="status-tracker"]:not(.hide)) {{ min-height: 64px; }}
"""
STYLE_JS = """() => {
  if (document.getElementById("vit-inspect-style")) return;
  const style = document.createElement("style");
  style.id = "vit-inspect-style";
  style.textContent = %s;
  document.head.appendChild(style);
}""" % json.dumps(PAGE_CSS)


def install(demo: gr.Blocks) -> None:
    """The page's style rules, added once per page load (a js-only listener: no server function)."""
    gr.on([demo.load], None, js=STYLE_JS, queue=False)

"""The Attention tab: one layer's attention from a query token, the query being the token the head reads
or a patch chosen by a click on the map or by typing its row and column.

The browser knows the chosen patch before the server answers. A redraw reads the query controls when the
page sends it, so a slider moved while a click or a typed patch is on its way to the server would
otherwise draw the previous query, and, begun later, keep the panel (`ordering.DrawOrder`). So:

- typing a row or column ticks "clicked patch" in the browser at once;
- a click is turned into a patch in the browser too (`clicks.CLICK_JS` records the pixel exactly as
  Gradio's select event computes it; `PICK_JS` divides it by the patch size of the input shown,
  `map_geometry`), and row, column and "clicked patch" are set at once. The server's `pick_patch`
  computes the same patch from the same pixel (`TokenLayout.patch_at`) and draws it.

Only the browser's own controls change there: no server call, and nothing a client sends is trusted more
than before (the server clamps row and column as for any client, `View.from_controls`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.clicks import MAP_ID, clicked_pixel
from vit_inspect.ui.common import DRAW_CONCURRENCY, MAP_OUT, RAW, OutputImage
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.panels import map_geometry  # noqa: F401  (the patch grid each map is sent with)
from vit_inspect.ui.view import PATCH, READOUT

# On the map's select event: the remembered pixel, divided by the whole factor the map enlarges the crop by,
# -> (row, col, "clicked patch") with the patch grid of the input shown; a click beside the crop (colour bar, caption) or before any image leaves the controls as
# they are. Floor division and clamping as `TokenLayout.patch_at`.
PICK_JS = """(geometry, row, col, query) => {
  %(clicked)s
  if (!click || !geometry || !geometry.input) return [row, col, query];
  const [height, width] = geometry.input, [patchH, patchW] = geometry.patch, [gridH, gridW] = geometry.grid;
  const x = click.x / geometry.scale, y = click.y / geometry.scale;
  if (!(x >= 0 && x < width && y >= 0 && y < height)) return [row, col, query];
  return [Math.min(Math.floor(y / patchH), gridH - 1), Math.min(Math.floor(x / patchW), gridW - 1), %(patch)s];
}""" % {"patch": json.dumps(PATCH), "clicked": clicked_pixel(MAP_ID)}


@dataclass(frozen=True)
class AttentionView:
    """The Attention tab's components (``geometry`` is hidden: the patch grid of the input shown, for the browser)."""

    tab: gr.Tab
    panel: gr.Image
    layer: gr.Slider
    head: gr.Slider
    mean_heads: gr.Checkbox
    query: gr.Radio
    row: gr.Number
    col: gr.Number
    geometry: gr.JSON

    @property
    def redraw_on(self) -> list:
        """The changes the map redraws on (besides the page's colour scale)."""
        return [self.layer.input, self.head.input, self.mean_heads.input, self.query.input]


def layout(settings: PageSettings) -> AttentionView:
    """The tab, its map and its controls, inside the Explain section's ``gr.Tabs``."""
    with gr.Tab("Attention", elem_id="attention-tab") as tab:
        gr.Markdown("One layer's attention from a query token. **Click the map** (or type a row and column) to "
                    "query from that patch. Layer, head and query also drive **All maps**, **All heads**, the "
                    "ablated maps under **Heads**, the red dot under **Attention distance** and one extra map "
                    "under **Faithfulness**; each of them prints the values it used.")
        with gr.Row():
            with gr.Column(scale=3, min_width=580):
                panel = OutputImage(elem_id=MAP_ID, **MAP_OUT)
            with gr.Column(scale=2, min_width=260):
                layer = gr.Slider(0, 11, value=11, step=1, label="Layer (0-based)", elem_id="layer-slider")
                head = gr.Slider(0, 2, value=0, step=1, label="Head (0-based)", elem_id="head-slider")
                mean_heads = gr.Checkbox(False, label="Mean of heads (instead of one head)", elem_id="mean-heads")
                query = gr.Radio([READOUT, PATCH], value=READOUT, label="Query token", elem_id="query",
                                 info="Whose attention: the token the classifier reads, or a "
                                      "patch (click the map, or type its row and column).")
                with gr.Row():
                    row = gr.Number(0, label="Patch row", precision=0, minimum=0, maximum=13, elem_id="patch-row")
                    col = gr.Number(0, label="Patch column", precision=0, minimum=0, maximum=13, elem_id="patch-col")
        geometry = gr.JSON(None, visible=False, elem_id="attention-geometry")
    return AttentionView(tab, panel, layer, head, mean_heads, query, row, col, geometry)


def wire(view: AttentionView, ctx: TabContext) -> None:
    """The tab's own events: a click or a typed patch sets the query in the browser at once and draws it on the
    server (the page's `Inspector` ``app``: ``pick_patch``, ``type_patch``); "mean of heads" greys out the head
    slider; the map is redrawn from the session's pass when a control, the colour scale or the tab changes."""
    app, session, controls = ctx.app, ctx.session, ctx.controls
    ctx.redraw("attention", [*view.redraw_on, ctx.scale.input, view.tab.select])
    gr.on([view.panel.select], None, inputs=[view.geometry, view.row, view.col, view.query],
          outputs=[view.row, view.col, view.query], js=PICK_JS, queue=False)
    gr.on([view.panel.select], app.pick_patch, inputs=[session], inputs_kwargs=controls,
          outputs=[view.row, view.col, view.query, view.panel], api_name="pick_patch", show_progress="hidden",
          concurrency_limit=DRAW_CONCURRENCY, **RAW)
    gr.on([view.row.input, view.col.input], None, outputs=[view.query], js=f"() => {json.dumps(PATCH)}", queue=False)
    gr.on([view.row.input, view.col.input], app.type_patch, inputs=[session], inputs_kwargs=controls,
          outputs=[view.query, view.panel], api_name="type_patch", show_progress="hidden",
          trigger_mode="always_last", concurrency_limit=DRAW_CONCURRENCY, **RAW)
    gr.on([view.mean_heads.change], lambda mean: gr.update(interactive=not mean), inputs=[view.mean_heads],
          outputs=[view.head], api_name="head_enabled", show_progress="hidden")

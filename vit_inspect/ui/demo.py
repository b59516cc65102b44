"""The app's page: `build_demo(config)` lays out the header, the input column and each tab, then wires the
page's own events (the image pass, model loading, redraws) and each tab's."""
from __future__ import annotations

import json

import gradio as gr

from vit_inspect.ui import clicks, inputs
from vit_inspect.ui.common import DRAW_CONCURRENCY, MODEL_PASS, RAW, upload_folders, upload_source
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import CLASS_PANELS, FIRST_TAB, LATER_PANELS, Inspector
from vit_inspect.ui.model_cache import ModelCache
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.tabs import (all_heads, all_maps, attention, compare, distance, downloads, faithfulness, gradcam,
                                 heads, model, predictions, rollout)
from vit_inspect.ui.view import SCALES, View

INTRO = ("# vit_inspect\nLook inside a Vision Transformer: what it predicts, where it attends and how it sees. "
         "Upload an image or pick an example; every slider and click redraws instantly from one pass of the "
         "model. Every map has a colour bar with its unit; **Colour scale** chooses each map's own range or one "
         "shared range.")
CACHE_SECONDS = (3600, 7200)  # Gradio deletes its temporary files every hour once they are 2 hours old


def build_demo(config: AppConfig = AppConfig(), cache: ModelCache | None = None) -> gr.Blocks:
    """The app's Blocks. Loads nothing: the first page load or request loads the model through the cache."""
    app = Inspector(config, cache if cache is not None else ModelCache(config.cache_size))
    models = inputs.CURATED_MODELS
    if config.model not in models:
        models = (app.default_label, *models)
    with gr.Blocks(title="vit_inspect", delete_cache=CACHE_SECONDS) as demo:
        key = gr.State(app.default_key)  # the model every event of this session uses
        session = gr.State(None, time_to_live=config.session_ttl_s)  # the image's passes (inspector.Session)
        gr.Markdown(INTRO)
        status = gr.Markdown("⏳ Loading the model…", elem_id="status")
        with gr.Row():
            given = inputs.layout(models, app.default_label)
            with gr.Column(scale=2):
                scale = gr.Radio(list(SCALES), value="each map its own range", label="Colour scale", elem_id="scale",
                                 info="Shared: one range over every layer and head (attention) or block "
                                      "(Grad-CAM). Absolute: attention and rollout weights on 0 to 1.")
                shown_tab = gr.Textbox(FIRST_TAB, visible=False, elem_id="shown-tab")  # the tab the page shows
                with gr.Tabs() as tabs:
                    predictions_view = predictions.layout()
                    attention_view = attention.layout()
                    all_heads_view = all_heads.layout()
                    heads_view = heads.layout(len(inputs.EXAMPLES), config.session_ttl_s)
                    rollout_view = rollout.layout()
                    gradcam_view = gradcam.layout()
                    all_maps_view = all_maps.layout()
                    faithfulness_view = faithfulness.layout()
                    distance_view = distance.layout()
                    model_view = model.layout()
                    downloads_view = downloads.layout()
                    compare_view = compare.layout(models, config.session_ttl_s)

        # Events are registered in the order below, and the page runs the listeners of one trigger in that order.
        compare.wire(compare_view, compare.CompareTab(app, upload_source), given.image, key)

        panel = {"attention": attention_view.panel, "distance": distance_view.panel, "rollout": rollout_view.panel,
                 "gradcam": gradcam_view.panel, "relevance": gradcam_view.relevance, "compare": all_maps_view.panel,
                 "heads": all_heads_view.panel}
        controls = dict(layer=attention_view.layer, head=attention_view.head, mean_heads=attention_view.mean_heads,
                        query=attention_view.query, row=attention_view.row, col=attention_view.col,
                        head_fusion=rollout_view.head_fusion, discard_ratio=rollout_view.discard_ratio,
                        first_layer=rollout_view.first_layer, last_layer=rollout_view.last_layer,
                        gradcam_layer=gradcam_view.layer, scale=scale, rollout_method=rollout_view.method,
                        discard=rollout_view.discard, threshold_on=all_heads_view.threshold_on,
                        threshold=all_heads_view.threshold)
        geometry = [attention_view.layer, attention_view.head, rollout_view.first_layer, rollout_view.last_layer,
                    gradcam_view.layer, attention_view.row, attention_view.col]  # fitted to each model
        model_outputs = [model_view.pca, model_view.similarity, model_view.similarity_other]
        cleared = [distance_view.dataset_plot, distance_view.dataset_note, downloads_view.files, model_view.files]

        clicks.install(demo)  # the page knows where a click on a map or heatmap landed before the server answers
        gr.on([demo.load], app.startup, outputs=[status, given.model_box, *geometry], api_name="startup")
        gr.on([given.load_button.click, given.model_name.select], app.load_model,
              inputs=[given.model_name, given.weights],
              outputs=[key, status, given.model_box, *geometry, *model_outputs, *cleared], api_name="load_model",
              **RAW).failure(app.picker_name, inputs=[key], outputs=[given.model_name], api_name="restore_model_name")
        analyzed = gr.on(
            [given.image.change, key.change, given.geometry_mode.input, given.shorter_side.submit], app.analyze,
            inputs=[given.image, key, given.geometry_mode, given.shorter_side],
            inputs_kwargs=controls | dict(relevance=all_maps_view.relevance_toggle),
            outputs=[session, predictions_view.predictions, predictions_view.crop, gradcam_view.target,
                     *[panel[n] for n in IMAGE_PANELS], predictions_view.seen, attention_view.geometry],
            api_name="analyze", **RAW, **MODEL_PASS)
        for tab in tabs.children:  # the page records which tab it shows, in the page (no server call)
            gr.on([tab.select], None, outputs=[shown_tab], js=f"() => {json.dumps(tab.label)}", queue=False)
        for name, tab in LATER_PANELS.items():  # the figures of a new image, once its maps are shown, if in view
            analyzed.success(app.redraw_if_shown(name, tab), inputs=[session, shown_tab], inputs_kwargs=controls,
                             outputs=panel[name], api_name=f"{name}_of_new_image", show_progress="hidden",
                             concurrency_limit=DRAW_CONCURRENCY, **RAW)
        # Each panel redraws from the session's pass when a control it shows changes (maps with a colour range
        # also on the colour scale); panels showing other tabs' controls redraw when their tab opens.
        redraws = {"attention": [*attention_view.redraw_on, scale.input],
                   "rollout": [*rollout_view.redraw_on, scale.input],
                   "gradcam": [*gradcam_view.redraw_on, scale.input],
                   "heads": [*all_heads_view.redraw_on, scale.input],
                   "distance": distance_view.redraw_on,
                   "compare": all_maps_view.redraw_on}
        for name, triggers in redraws.items():
            gr.on(triggers, app.redraw(name), inputs=[session], inputs_kwargs=controls, outputs=panel[name],
                  api_name=name, trigger_mode="always_last", show_progress="hidden",
                  concurrency_limit=DRAW_CONCURRENCY, **RAW)

        attention.wire(attention_view, app, session, controls)
        retargeted, searched = gradcam.wire(gradcam_view, app, session, controls,
                                            class_outputs=[session, gradcam_view.target,
                                                           *[panel[n] for n in CLASS_PANELS]])
        all_maps.wire(all_maps_view, app, session, controls)
        faithfulness.wire(faithfulness_view, faithfulness.FaithfulnessTab(app.handle, app.with_relevance), session,
                          controls)
        heads.wire(heads_view, heads.HeadsTab(app, inputs.EXAMPLE_PATHS, upload_folders, View.from_controls),
                   session, controls, refreshed=[analyzed, retargeted, searched],
                   follow=[(name, app.redraw_if_shown(name, LATER_PANELS.get(name)), panel[name])
                           for name in ("attention", "distance")],
                   shown_tab=shown_tab)
        distance.wire(distance_view, distance.DistanceTab(app), key)
        model.wire(model_view, model.ModelTab(app.handle, app.cache.max_size), key)
        downloads.wire(downloads_view, app, session, controls)
    return demo

"""The app's page: `build_demo(config)` lays out the tabs and wires their events."""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from vit_inspect.ui import clicks
from vit_inspect.ui.common import OutputImage, upload_folders, upload_source
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import CLASS_PANELS, FIRST_TAB, GEOMETRIES, LATER_PANELS, MAX_DATASET_IMAGES, Inspector
from vit_inspect.ui.model_cache import ModelCache
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.relevance import TOGGLE_LABEL
from vit_inspect.ui.tabs import attention, compare, faithfulness, heads, model
from vit_inspect.ui.tabs.model import ModelTab
from vit_inspect.ui.view import DISCARDS, HEAD_FUSIONS, ROLLOUTS, SCALES, View

ASSETS = Path(__file__).resolve().parents[2] / "assets"  # the example photos, beside the package
CURATED_MODELS = (
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_small_distilled_patch16_224",
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "vit_small_patch16_224.dino",
    "vit_small_patch14_reg4_dinov2.lvd142m",
)

EXAMPLES = (  # (file in assets/, caption with the credit and licence from assets/README.md)
    ("chelsea.png", "Chelsea the cat · Stéfan van der Walt · CC0"),
    ("coffee.png", "Coffee · Rachel Michetti · CC0"),
    ("astronaut.png", "Eileen Collins · NASA · public domain"),
    ("rocket.jpg", "Falcon 9 launch · SpaceX · public domain"),
    ("china.jpg", "China · danielbuechele (Flickr) · CC BY 2.0"),
    ("flower.jpg", "Flower · vultilion (Flickr) · CC BY 2.0"),
)


DRAW_CONCURRENCY = 4  # redraws run in parallel; model passes run one at a time (hooks are per model)
CACHE_SECONDS = (3600, 7200)  # Gradio deletes its temporary files every hour once they are 2 hours old


def build_demo(config: AppConfig = AppConfig(), cache: ModelCache | None = None) -> gr.Blocks:
    """The app's Blocks. Loads nothing: the first page load or request loads the model through the cache."""
    app = Inspector(config, cache if cache is not None else ModelCache(config.cache_size))
    models = CURATED_MODELS if config.model in CURATED_MODELS else (app.default_label, *CURATED_MODELS)
    map_out = dict(interactive=False, format="png", buttons=["download", "fullscreen"])
    figure_out = dict(interactive=False, format="png", show_label=False, buttons=["download", "fullscreen"])
    panel: dict[str, gr.Image] = {}
    with gr.Blocks(title="vit_inspect", delete_cache=CACHE_SECONDS) as demo:
        key = gr.State(app.default_key)
        session = gr.State(None, time_to_live=config.session_ttl_s)
        gr.Markdown("# vit_inspect\nLook inside a Vision Transformer: what it predicts, where it attends and "
                    "how it sees. Upload an image or pick an example; every slider and click redraws instantly "
                    "from one pass of the model. Every map has a colour bar with its unit; **Colour scale** "
                    "chooses each map's own range or one shared range.")
        status = gr.Markdown("⏳ Loading the model…", elem_id="status")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                image = gr.Image(label="Image (upload, drop, paste or webcam)", type="filepath", height=320,
                                 sources=["upload", "clipboard", "webcam"], elem_id="input-image")
                geometry_mode = gr.Radio(list(GEOMETRIES), value="model's centre crop", label="What the model sees",
                                         elem_id="geometry", info="The model's own centre crop, the whole image "
                                         "squashed to its input size, or the whole image with its aspect ratio "
                                         "kept (a non-square patch grid; position embeddings interpolated).")
                shorter_side = gr.Number(224, label="Shorter side for 'aspect kept' (pixels)", precision=0,
                                         minimum=16, maximum=1024, elem_id="shorter-side")
                gr.Examples([[str(ASSETS / name)] for name, _ in EXAMPLES], inputs=image, label="Examples",
                            examples_per_page=len(EXAMPLES))
                gr.Markdown("Examples, left to right: " + "; ".join(c for _, c in EXAMPLES) + ".")
                with gr.Accordion("Change model", open=False) as model_box:
                    model_name = gr.Dropdown(list(models), value=app.default_label, label="Model",
                                             allow_custom_value=True, elem_id="model-name",
                                             info="Or type any timm ViT name, or a Hugging Face id such as "
                                                  "google/vit-base-patch16-224.")
                    weights = gr.File(label="Own weights (.safetensors, for a timm name; leave empty otherwise)",
                                      file_types=[".safetensors"], type="filepath", elem_id="weights-file")
                    load_button = gr.Button("Load model", variant="primary", elem_id="load-model")
            with gr.Column(scale=2):
                scale = gr.Radio(list(SCALES), value="each map its own range", label="Colour scale", elem_id="scale",
                                 info="Shared: one range over every layer and head (attention) or block "
                                      "(Grad-CAM). Absolute: attention and rollout weights on 0 to 1.")
                shown_tab = gr.Textbox(FIRST_TAB, visible=False, elem_id="shown-tab")  # the tab the page shows
                with gr.Tabs() as tabs:
                    with gr.Tab("Predictions"):
                        with gr.Row():
                            predictions = gr.Label(num_top_classes=5, label="Top-5 classes", elem_id="predictions")
                            crop = OutputImage(label="What the model sees (its input)", elem_id="crop", **map_out)
                        seen = OutputImage(label="Your upload: the outlined region is what the model saw",
                                        elem_id="seen-region", height=340, **map_out)
                    attention_view = attention.layout()
                    panel["attention"] = attention_view.panel
                    layer, head, mean_heads, query, row, col = (attention_view.layer, attention_view.head, attention_view.mean_heads,
                                                                attention_view.query, attention_view.row, attention_view.col)
                    with gr.Tab("All heads") as heads_tab:
                        gr.Markdown("Every head of the layer chosen under **Attention**, from the same query, on "
                                    "one colour scale (DINO, Caron et al. 2021, Fig. 3). Each title gives the share "
                                    "of the head's attention that goes to the prefix tokens, which the maps leave out.")
                        with gr.Row():
                            threshold_on = gr.Checkbox(False, label="Threshold mask", elem_id="threshold-on",
                                                       info="Keep bright only the smallest set of patches holding "
                                                            "the chosen share of each head's attention.")
                            threshold = gr.Slider(10, 100, value=60, step=5, label="Attention mass kept (%)",
                                                  elem_id="threshold")
                        panel["heads"] = OutputImage(label="All heads", elem_id="heads-grid", **figure_out)
                    heads_view = heads.layout(len(EXAMPLES), config.session_ttl_s)
                    with gr.Tab("Rollout"):
                        with gr.Row():
                            panel["rollout"] = OutputImage(label="Rollout", elem_id="rollout-map", **map_out)
                            with gr.Column():
                                rollout_method = gr.Radio(list(ROLLOUTS), value=list(ROLLOUTS)[0], label="Method",
                                                          elem_id="rollout-method",
                                                          info="Gradient rollout weighs each layer's attention by "
                                                               "its gradient for the class (Grad-CAM tab's class).")
                                head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion",
                                                       info="Attention rollout only; gradient rollout averages.")
                                discard_ratio = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio",
                                                          info="Fraction of the lowest attention dropped before "
                                                               "rolling out.", elem_id="discard-slider")
                                discard = gr.Radio(list(DISCARDS), value=list(DISCARDS)[0], label="Discard where",
                                                   elem_id="discard-where")
                                first_layer = gr.Slider(0, 11, value=0, step=1, label="From layer",
                                                        elem_id="first-layer")
                                last_layer = gr.Slider(0, 11, value=11, step=1, label="To layer (included)",
                                                       elem_id="last-layer")
                    with gr.Tab("Grad-CAM"):
                        with gr.Row():
                            class_search = gr.Textbox(label="Find a class: name or index, then Enter",
                                                      placeholder="e.g. 1 (goldfish) or beagle", elem_id="class-search",
                                                      max_lines=1, scale=2)
                            target = gr.Dropdown([], label="Class to explain", scale=2, elem_id="target",
                                                 info="The top 5 first, then what the search found.")
                            versus = gr.Textbox(label="Versus class (optional): name or index, then Enter",
                                                placeholder="e.g. tabby", elem_id="versus", max_lines=1, scale=2,
                                                info="Gradients of logit A − logit B: why A and not B?")
                            gradcam_layer = gr.Slider(0, 11, value=11, step=1, label="Grad-CAM block", scale=1)
                        with gr.Row():
                            panel["gradcam"] = OutputImage(label="Grad-CAM", elem_id="gradcam-map", **map_out)
                            panel["relevance"] = OutputImage(label="Gradient-weighted attention (Chefer et al. 2021)",
                                                          elem_id="relevance-map", **map_out)
                    with gr.Tab("All maps") as compare_tab:
                        gr.Markdown("Every map on the same input, each with the options set in its own tab: "
                                    "layer, head and query under **Attention**, method and layers under **Rollout**, "
                                    "class and block under **Grad-CAM**.")
                        relevance_toggle = gr.Checkbox(False, label=TOGGLE_LABEL, elem_id="relevance-toggle",
                                                       info="LeGrad and AttnLRP for this image and class, and for "
                                                            "later passes while ticked. Off, a pass is one forward "
                                                            "and one backward.")
                        panel["compare"] = OutputImage(label="All maps", elem_id="compare-maps", **figure_out)
                    faithfulness_view = faithfulness.layout()
                    with gr.Tab("Attention distance") as distance_tab:
                        gr.Markdown("Mean attention distance per head (ViT paper, Fig. 7 right): how far, in pixels, "
                                    "each head looks. The red dot is the layer and head chosen under **Attention**.")
                        with gr.Row():
                            panel["distance"] = OutputImage(label="This image", elem_id="distance-plot", **figure_out)
                            dataset_plot = OutputImage(label="Averaged over your images", elem_id="dataset-plot",
                                                    **figure_out)
                        with gr.Row():
                            dataset_files = gr.File(label=f"Images to average (up to {MAX_DATASET_IMAGES})",
                                                    file_count="multiple", file_types=["image"], type="filepath",
                                                    height=120, scale=3, elem_id="dataset-files")
                            dataset_button = gr.Button("Average over these images", scale=1)
                        dataset_note = gr.Markdown()
                    model_view = model.layout()
                    with gr.Tab("Downloads"):
                        gr.Markdown("The current image's figures as PNG, its numbers as JSON (the command line's "
                                    "record plus every setting: model, weights, input geometry, layer, head, query, "
                                    "rollout options, class) and NumPy `.npz` (attention, Grad-CAM, relevance, mean "
                                    "distance, the maps as shown, and the same settings as `settings_json`).")
                        download_button = gr.Button("Prepare downloads", variant="primary", elem_id="downloads-button")
                        download_files = gr.File(label="Files", file_count="multiple", interactive=False,
                                                 elem_id="download-files")
                    compare_view = compare.layout(models, config.session_ttl_s)

        compare.wire(compare_view, compare.CompareTab(app, upload_source), image, key)

        controls = dict(layer=layer, head=head, mean_heads=mean_heads, query=query, row=row, col=col,
                        head_fusion=head_fusion, discard_ratio=discard_ratio, first_layer=first_layer,
                        last_layer=last_layer, gradcam_layer=gradcam_layer, scale=scale, rollout_method=rollout_method,
                        discard=discard, threshold_on=threshold_on, threshold=threshold)
        geometry = [layer, head, first_layer, last_layer, gradcam_layer, row, col]
        model_outputs = [model_view.pca, model_view.similarity, model_view.similarity_other]
        cleared = [dataset_plot, dataset_note, download_files, model_view.files]  # shown for the previous model
        model_pass = dict(concurrency_id="model_pass", concurrency_limit=1)
        class_outputs = [session, target, *[panel[n] for n in CLASS_PANELS]]
        # Handlers get the client's raw values and check them themselves (vit_inspect.ui.untrusted), so
        # that a NaN, a string or a forged file reference gets a sentence rather than Gradio's bare "Error".
        raw = dict(preprocess=False)

        clicks.install(demo)  # the page knows where a click on a map or heatmap landed before the server answers
        gr.on([demo.load], app.startup, outputs=[status, model_box, *geometry], api_name="startup")
        gr.on([load_button.click, model_name.select], app.load_model, inputs=[model_name, weights],
              outputs=[key, status, model_box, *geometry, *model_outputs, *cleared], api_name="load_model", **raw,
              ).failure(app.picker_name, inputs=[key], outputs=[model_name], api_name="restore_model_name")
        analyzed = gr.on([image.change, key.change, geometry_mode.input, shorter_side.submit], app.analyze,
              inputs=[image, key, geometry_mode, shorter_side], inputs_kwargs=controls | dict(relevance=relevance_toggle),
              outputs=[session, predictions, crop, target, *[panel[n] for n in IMAGE_PANELS], seen, attention_view.geometry],
              api_name="analyze", **raw, **model_pass)
        for tab in tabs.children:  # the page records which tab it shows, in the page (no server call)
            gr.on([tab.select], None, outputs=[shown_tab], js=f"() => {json.dumps(tab.label)}", queue=False)
        for name, tab in LATER_PANELS.items():  # the figures of a new image, once its maps are shown, if in view
            analyzed.success(app.redraw_if_shown(name, tab), inputs=[session, shown_tab], inputs_kwargs=controls,
                             outputs=panel[name], api_name=f"{name}_of_new_image", show_progress="hidden",
                             concurrency_limit=DRAW_CONCURRENCY, **raw)
        # Each panel redraws when a control it shows changes; panels showing other tabs' controls redraw
        # when their tab opens.
        scale_change = [scale.input]
        redraws = {"attention": [layer.input, head.input, mean_heads.input, query.input, *scale_change],
                   "rollout": [head_fusion.input, discard_ratio.input, first_layer.input, last_layer.input,
                               rollout_method.input, discard.input, *scale_change],
                   "gradcam": [gradcam_layer.input, *scale_change],
                   "heads": [heads_tab.select, threshold_on.input, threshold.release, *scale_change],
                   "distance": [distance_tab.select],
                   "compare": [compare_tab.select]}
        for name, triggers in redraws.items():
            gr.on(triggers, app.redraw(name), inputs=[session], inputs_kwargs=controls, outputs=panel[name],
                  api_name=name, trigger_mode="always_last", show_progress="hidden",
                  concurrency_limit=DRAW_CONCURRENCY, **raw)
        attention.wire(attention_view, app, session, controls)
        retargeted = gr.on([target.input, versus.submit], app.set_target, inputs=[session, target, versus], inputs_kwargs=controls,
              outputs=class_outputs, api_name="set_target", **raw, **model_pass)
        searched = gr.on([class_search.submit], app.search_class, inputs=[session, class_search, versus],
              inputs_kwargs=controls, outputs=class_outputs, api_name="search_class", **raw, **model_pass)
        gr.on([relevance_toggle.input], app.set_relevance, inputs=[session, relevance_toggle], inputs_kwargs=controls,
              outputs=[session, panel["compare"]], api_name="relevance", **raw, **model_pass)
        faithfulness.wire(faithfulness_view, faithfulness.FaithfulnessTab(app.handle, app.with_relevance), session, controls)
        heads.wire(heads_view, heads.HeadsTab(app, tuple(ASSETS / name for name, _ in EXAMPLES), upload_folders,
                                              View.from_controls),
                   session, controls, [analyzed, retargeted, searched],
                   follow=[(name, app.redraw_if_shown(name, LATER_PANELS.get(name)), panel[name])
                           for name in ("attention", "distance")],
                   shown_tab=shown_tab)
        gr.on([dataset_button.click], app.dataset_distance, inputs=[dataset_files, key],
              outputs=[dataset_plot, dataset_note], api_name="dataset_distance", **raw, **model_pass)
        model.wire(model_view, ModelTab(app.handle, app.cache.max_size), key)
        gr.on([download_button.click], app.downloads, inputs=[session], inputs_kwargs=controls,
              outputs=[download_files], api_name="downloads", **raw)
    return demo

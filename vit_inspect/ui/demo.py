"""The app's page: `build_demo(config)` lays out the header, the input column and the sections (`sections`),
then wires the page's own events (the image pass, model loading, class switching, redraws, the stale-result
check) and each tab's."""
from __future__ import annotations

import gradio as gr

from vit_inspect.ui import clicks, inputs, sections, style
from vit_inspect.ui.common import DRAW_CONCURRENCY, MODEL_PASS, RAW, says_refusals
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.inspector import CLASS_PANELS, FIRST_TAB, LATER_PANELS, Inspector
from vit_inspect.ui.model_cache import ModelCache
from vit_inspect.ui.panels import FIRST_VIEW, IMAGE_PANELS
from vit_inspect.ui.stale import refresh, refresh_io

INTRO = ("# vit_inspect\nLook inside a Vision Transformer: what it predicts, where it attends and how it sees. "
         "The page opens on an example; upload your own image or pick another, and every slider and click "
         "redraws from one pass of the model. Every map has a colour bar with its unit and a caption with its "
         "settings.")
CACHE_SECONDS = (3600, 7200)  # Gradio deletes its temporary files every hour once they are 2 hours old


def build_demo(config: AppConfig = AppConfig(), cache: ModelCache | None = None) -> gr.Blocks:
    """The app's Blocks. Loads nothing: the first page load or request loads the model through the cache."""
    app = Inspector(config, cache if cache is not None else ModelCache(config.cache_size))
    models = inputs.CURATED_MODELS
    if config.model not in models:
        models = (app.default_label, *models)
    with gr.Blocks(title="vit_inspect", delete_cache=CACHE_SECONDS, fill_width=True) as demo:
        key = gr.State(app.default_key)  # the model every event of this browser session uses
        session = gr.State(None, time_to_live=config.session_ttl_s)  # the image's passes (inspector.Session)
        gr.Markdown(INTRO)
        status = gr.Markdown("⏳ Loading the model…", elem_id="status")
        notice = gr.Markdown("", elem_id="notice")  # why the last page-wide action was refused; stays until the next
        with gr.Row():
            given = inputs.layout(models, app.default_label, config.first_image)
            with gr.Column(scale=4, min_width=640):
                shown_tab = gr.Textbox(FIRST_TAB, visible=False, elem_id="shown-tab")  # the sub-tab in view
                page = sections.layout(PageSettings(models, len(inputs.EXAMPLES), config.session_ttl_s))

        # Events are registered in the order below, and the page runs the listeners of one trigger in that order.
        panel = dict(zip(FIRST_VIEW, page.overview.maps)) | {
            "attention": page.attention.panel, "distance": page.distance.panel, "rollout": page.rollout.panel,
            "gradcam": page.gradcam.panel, "chefer": page.gradcam.chefer, "compare": page.all_maps.panel,
            "heads": page.all_heads.panel}
        controls = dict(layer=page.attention.layer, head=page.attention.head, mean_heads=page.attention.mean_heads,
                        query=page.attention.query, row=page.attention.row, col=page.attention.col,
                        head_fusion=page.rollout.head_fusion, discard_ratio=page.rollout.discard_ratio,
                        first_layer=page.rollout.first_layer, last_layer=page.rollout.last_layer,
                        gradcam_layer=page.gradcam.layer, scale=given.scale, rollout_method=page.rollout.method,
                        discard=page.rollout.discard, threshold_on=page.all_heads.threshold_on,
                        threshold=page.all_heads.threshold)
        geometry = [page.attention.layer, page.attention.head, page.rollout.first_layer, page.rollout.last_layer,
                    page.gradcam.layer, page.attention.row, page.attention.col]  # fitted to each model

        clicks.install(demo)  # the page knows where a click on a map or heatmap landed before the server answers
        style.install(demo)  # buttons above pictures, headers wrapped between words, progress never over text
        # A model pass over the image shows its progress on the image (never over the status line's text); the
        # page's first model load says so in the status line itself.
        working = dict(show_progress_on=[given.image])
        gr.on([demo.load], app.startup, outputs=[status, given.model_box, *geometry], api_name="startup",
              show_progress="hidden")
        gr.on([given.model_box.expand, page.compare.tab.select], inputs.choices_handler(models, (app.default_label,)),
              outputs=[given.model_name, page.compare.name_b], api_name="model_choices",
              show_progress="hidden")  # when a picker comes into view, not while the first view loads
        # A refused action's sentence goes to the notice line, every panel left as it was (`says_refusals`).
        def put_back(name, weights, current, *special, **kwargs):  # a refused model: the picker names the one in use
            return {given.model_name: app.picker_name(current)}

        loaded = gr.on([given.load_button.click, given.model_name.select],
                       says_refusals(app.load_model, notice, appended=("", gr.skip()), also=put_back),
                       inputs=[given.model_name, given.weights, key],
                       outputs=[key, status, given.model_box, *geometry, notice, given.model_name],
                       api_name="load_model", **working, **RAW)
        analyzed_outputs = [session, given.predictions, page.overview.crop, given.target,
                            *[panel[n] for n in IMAGE_PANELS], page.overview.seen, page.attention.geometry, status,
                            page.attention.query, notice]
        analyze = says_refusals(app.analyze, notice)
        analyzed = gr.on(
            [given.image.change, key.change, given.geometry_mode.input, given.shorter_side.submit], analyze,
            inputs=[given.image, key, given.geometry_mode, given.shorter_side],
            inputs_kwargs=controls | dict(relevance=page.all_maps.relevance_toggle, current=session,
                                          prompt=given.prompt, versus_prompt=given.versus),
            outputs=analyzed_outputs, api_name="analyze", **working, **RAW, **MODEL_PASS)
        if config.first_image:  # the page opens on its first view: the image's pass beside loading the model
            gr.on([demo.load], says_refusals(app.analyze_first, notice),
                  inputs=[given.image, key, given.geometry_mode, given.shorter_side],
                  inputs_kwargs=controls | dict(relevance=page.all_maps.relevance_toggle, current=session,
                                                prompt=given.prompt, versus_prompt=given.versus),
                  outputs=analyzed_outputs, api_name="analyze_first_image", **working, **RAW, **MODEL_PASS)
        sections.record_shown(page, shown_tab)
        analyzed.success(app.redraw_shown(LATER_PANELS), inputs=[session, shown_tab], inputs_kwargs=controls,
                         outputs=[panel[n] for n in LATER_PANELS], api_name="panels_of_new_image",
                         show_progress="hidden", concurrency_limit=DRAW_CONCURRENCY, **RAW)  # those in view
        explain = {name: tab for name, tab in LATER_PANELS.items() if tab in page.labels(page.explain)}
        gr.on([page.explain.select], app.redraw_shown(explain), inputs=[session, shown_tab], inputs_kwargs=controls,
              outputs=[panel[n] for n in explain], js=sections.shown_js(page, page.explain, position=1),
              api_name="explain_opened", show_progress="hidden", concurrency_limit=DRAW_CONCURRENCY, **RAW)
        retargeted, searched, prompted = inputs.wire_classes(given, app, session, controls, class_outputs=[
            session, given.target, *[panel[n] for n in CLASS_PANELS]], notice=notice)
        inputs.wire_mode(given, [demo.load, key.change], key)  # a prompt box for a model with a text tower

        # Each view's own events, in page order (`sections.SECTIONS`): its redraws from the session's pass,
        # its buttons, and its results put under the stale-result check below.
        ctx = TabContext(app=app, session=session, key=key, controls=controls, image=given.image, scale=given.scale,
                         notice=notice, shown_tab=shown_tab, page=page, panels=panel,
                         events=dict(image=analyzed, model=loaded, **{"class": retargeted}, search=searched,
                                     prompt=prompted))
        for name, module in sections.modules().items():
            module.wire(page.views[name], ctx)

        # One check against stale results (`ui.stale`) after every change of model, image, class or model B; the
        # downloads, which depend on every setting, also when a tab opens or the colour scale changes.
        tracked = tuple(ctx.tracked)
        for name, event in ctx.events.items():
            checked = check(event.success, tracked, session, key, shown_tab, controls, f"stale_check_{name}")
            for fn, fn_inputs, fn_outputs, api_name in ctx.after_checks:
                checked.success(fn, inputs=fn_inputs, outputs=fn_outputs, api_name=f"{api_name}_{name}",
                                show_progress="hidden", **RAW)  # raw client values, checked by the handler
        # A result whose event began before a new image (or model, class) was in place is checked again once it
        # is written: whichever of the two finishes last, the check after it sees both.
        check(lambda **kw: gr.on([item.made_from.change for item in tracked], trigger_mode="always_last", **kw),
              tracked, session, key, shown_tab, controls, "stale_check_result")
        by_settings = tuple(item for item in tracked if item.level == "options")
        every_tab = list({id(tab): tab for section, tabs in page.groups() for tab in (section, *tabs)}.values())
        check(lambda **kw: gr.on([tab.select for tab in every_tab] + [given.scale.input], **kw),
              by_settings, session, key, shown_tab, controls, "stale_check_settings")
    return demo


def check(register, tracked: tuple, session, key, shown_tab, controls: dict, api_name: str):
    """`stale.refresh` of the ``tracked`` results, registered by ``register`` (an event's ``.success``, or
    `gr.on` with its triggers) under ``api_name``; returns the registered event."""
    extra_inputs, outputs = refresh_io(tracked)
    return register(fn=refresh(tracked), inputs=[session, key, shown_tab, *extra_inputs], inputs_kwargs=controls,
             outputs=outputs, api_name=api_name, show_progress="hidden", **RAW)

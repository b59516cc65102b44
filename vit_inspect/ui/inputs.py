"""The page's input column, beside every section: the image and how it becomes the model's input, the model's
top-5, the class every gradient map explains, the colour scale, the example photos, and the model picker. A
control here acts on every section, and every caption prints its value. Its events are the page's own
(`build_demo`): the image pass, class switching (`wire_classes`) and model loading.

For a model with a text tower (OpenCLIP, `--model open_clip:NAME`) a prompt box replaces the class search
(`input_mode`): every gradient map explains the prompt's cosine similarity with the image, the versus box
takes a prompt, and the class list is the zero-shot list, ranked by the model.

The curated models are listed honestly: one whose weights are neither on this machine nor reachable on the
hub is marked "needs the hub" before it is picked (`model_choices`)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.core import hub
from vit_inspect.core.load import weights_at_hand
from vit_inspect.core.open_clip_models import is_open_clip_name
from vit_inspect.core.prompts import MAX_PROMPT_CHARS
from vit_inspect.ui.common import MODEL_PASS, RAW, says_refusals
from vit_inspect.ui.config import ASSETS
from vit_inspect.ui.inspector import GEOMETRIES
from vit_inspect.ui.view import SCALES

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
NEEDS_HUB = "needs the hub"  # how a curated model that cannot load here is marked
PROMPT_LABEL = "Prompt to explain, then Enter"
PROMPT_INFO = ("Every gradient map, the faithfulness scores and the downloads explain the cosine similarity of "
               f"the image and this text (at most {MAX_PROMPT_CHARS} characters).")
VERSUS = {  # the versus box: (label, placeholder, info) for a classifier and for a model that reads prompts
    "class": ("Versus class (optional): name or index, then Enter", "e.g. tabby",
              "Gradients of logit A − logit B: why A and not B?"),
    "prompt": ("Versus prompt (optional), then Enter", "e.g. a photo of a dog",
               "Explains the prompt's similarity minus this one's: why A and not B?"),
}
TARGET_LABEL = {"class": "Class to explain", "prompt": "Zero-shot label to explain (or type a prompt below)"}
TARGET_INFO = {"class": "Every gradient map, the faithfulness scores, the heads' ablation and Compare explain this "
                        "class: the top 5 first, then what the search found.",
               "prompt": "Every gradient map, the faithfulness scores and Compare explain this label's similarity "
                         "with the image (its text averaged over the templates); a prompt typed below replaces it."}
TOP5_LABEL = {"class": "Top-5 classes", "prompt": "Top-5 zero-shot labels"}

EXAMPLES = (  # (file in assets/, caption with the credit and licence from assets/README.md)
    ("chelsea.png", "Chelsea the cat · Stéfan van der Walt · CC0"),
    ("coffee.png", "Coffee · Rachel Michetti · CC0"),
    ("astronaut.png", "Eileen Collins · NASA · public domain"),
    ("rocket.jpg", "Falcon 9 launch · SpaceX · public domain"),
    ("china.jpg", "China · danielbuechele (Flickr) · CC BY 2.0"),
    ("flower.jpg", "Flower · vultilion (Flickr) · CC BY 2.0"),
)
EXAMPLE_PATHS = tuple(ASSETS / name for name, _ in EXAMPLES)


def model_choices(models: tuple[str, ...], loaded: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(label, name) choices of a model picker: a name whose weights are neither on this machine
    (`load.weights_at_hand`) nor reachable on the hub (switched off, or not answering: `hub.hub_reachable`)
    labelled "name · needs the hub"; the ``loaded`` names (the operator's own) as they are."""
    online = not hub.offline_by_setting() and hub.hub_reachable()
    return [(name if online or name in loaded or weights_at_hand(name) else f"{name} · {NEEDS_HUB}", name)
            for name in models]


def choices_handler(models: tuple[str, ...], loaded: tuple[str, ...]):
    """The page-load handler that lists `model_choices` in both model pickers (the page's and Compare's B)."""
    def handler():
        choices = model_choices(models, loaded)
        return gr.update(choices=choices), gr.update(choices=choices)
    return handler


@dataclass(frozen=True)
class InputView:
    """The input column's components."""

    image: gr.Image
    predictions: gr.Label
    class_search: gr.Textbox
    prompt: gr.Textbox  # a model with a text tower: the prompt every gradient map explains
    target: gr.Dropdown
    versus: gr.Textbox
    geometry_mode: gr.Radio
    shorter_side: gr.Number
    scale: gr.Radio
    model_box: gr.Accordion
    model_name: gr.Dropdown
    weights: gr.File
    load_button: gr.Button


def layout(models: tuple[str, ...], model: str, first_image: str | None = None) -> InputView:
    """The column, inside the page's ``gr.Row``; ``models`` are the names the picker offers, ``model`` the one
    it shows first, ``first_image`` the image the page opens with (None: none)."""
    with gr.Column(scale=1, min_width=280, elem_id="input-column"):
        image = gr.Image(first_image, label="Image (upload, drop, paste or webcam)", type="filepath", height=240,
                         sources=["upload", "clipboard", "webcam"], elem_id="input-image")
        predictions = gr.Label(num_top_classes=5, label="Top-5 classes", show_heading=False, elem_id="predictions")
        with gr.Group():
            target = gr.Dropdown([], label=TARGET_LABEL["class"], elem_id="target", info=TARGET_INFO["class"])
            class_search = gr.Textbox(label="Find a class: name or index, then Enter", placeholder="e.g. 1 (goldfish) "
                                      "or beagle", elem_id="class-search", max_lines=1)
            prompt = gr.Textbox("", label=PROMPT_LABEL, placeholder="e.g. a photo of a cat", elem_id="prompt",
                                max_lines=1, max_length=MAX_PROMPT_CHARS, visible=False, info=PROMPT_INFO)
            versus = gr.Textbox("", label=VERSUS["class"][0], placeholder=VERSUS["class"][1], elem_id="versus",
                                max_lines=1, max_length=MAX_PROMPT_CHARS, info=VERSUS["class"][2])
        geometry_mode = gr.Radio(list(GEOMETRIES), value="model's centre crop", label="What the model sees",
                                 elem_id="geometry", info="The model's own centre crop, the whole image "
                                 "squashed to its input size, or the whole image with its aspect ratio "
                                 "kept (a non-square patch grid; position embeddings interpolated).")
        shorter_side = gr.Number(224, label="Shorter side for 'aspect kept' (pixels)", precision=0,
                                 minimum=16, maximum=1024, elem_id="shorter-side")
        gr.Examples([[str(path)] for path in EXAMPLE_PATHS], inputs=image, label="Examples",
                    examples_per_page=len(EXAMPLES))
        gr.Markdown("Examples, left to right: " + "; ".join(c for _, c in EXAMPLES) + ".")
        scale = gr.Radio(list(SCALES), value="each map its own range", label="Colour scale", elem_id="scale",
                         info="Shared: one range over every layer and head (attention) or block "
                              "(Grad-CAM). Absolute: attention and rollout weights on 0 to 1.")
        with gr.Accordion("Change model", open=False) as model_box:
            model_name = gr.Dropdown(list(models), value=model, label="Model", allow_custom_value=True,
                                     elem_id="model-name", info="Or type any timm ViT name, or a Hugging Face id "
                                                                f"such as google/vit-base-patch16-224. '{NEEDS_HUB}': "
                                                                "its weights are not on this server and the hub "
                                                                "does not answer.")
            weights = gr.File(label="Own weights (.safetensors, for a timm name; leave empty otherwise)",
                              file_types=[".safetensors"], type="filepath", elem_id="weights-file")
            load_button = gr.Button("Load model", variant="primary", elem_id="load-model")
    return InputView(image, predictions, class_search, prompt, target, versus, geometry_mode, shorter_side, scale,
                     model_box, model_name, weights, load_button)


def wire_classes(view: InputView, app, session: gr.State, controls: dict, class_outputs: list,
                 notice: gr.Markdown) -> tuple:
    """The class picker's events: a class picked in the list, a versus class typed, or a class searched, each
    switching the session to that class (the page's `Inspector` ``app``) and redrawing ``class_outputs`` (the
    session, the class list, then the panels that depend on the class). A refused choice is a sentence in the
    page's ``notice`` line, every panel left as it was. Returns the three events, for what follows them. Each
    shows its progress on the image its pass runs over, never over the class list's text."""
    working = dict(show_progress_on=[view.image])
    outputs = [*class_outputs, notice]
    retargeted = gr.on([view.target.input, view.versus.submit], says_refusals(app.set_target, notice, appended=""),
                       inputs=[session, view.target, view.versus], inputs_kwargs=controls, outputs=outputs,
                       api_name="set_target", **working, **RAW, **MODEL_PASS)
    searched = gr.on([view.class_search.submit], says_refusals(app.search_class, notice, appended=""),
                     inputs=[session, view.class_search, view.versus], inputs_kwargs=controls, outputs=outputs,
                     api_name="search_class", **working, **RAW, **MODEL_PASS)
    prompted = gr.on([view.prompt.submit], says_refusals(app.set_prompt, notice, appended=""),
                     inputs=[session, view.prompt, view.versus], inputs_kwargs=controls, outputs=outputs,
                     api_name="set_prompt", **working, **RAW, **MODEL_PASS)
    return retargeted, searched, prompted


def input_mode(key) -> tuple:
    """Updates of (class search, prompt box, versus box, class list, top-5) for the model of cache ``key``: a
    model with a text tower (an OpenCLIP name) gets the prompt box and a versus prompt, and its class list and
    top-5 are its zero-shot labels; any other model the class search. Decided from the name, before loading."""
    kind = "prompt" if is_open_clip_name(getattr(key, "name", "")) else "class"
    label, placeholder, info = VERSUS[kind]
    return (gr.update(visible=kind == "class"), gr.update(visible=kind == "prompt"),
            gr.update(label=label, placeholder=placeholder, info=info, value=""),
            gr.update(label=TARGET_LABEL[kind], info=TARGET_INFO[kind]), gr.update(label=TOP5_LABEL[kind]))


def wire_mode(view: InputView, triggers: list, key: gr.State) -> None:
    """`input_mode` on ``triggers`` (page load and every model change)."""
    gr.on(triggers, input_mode, inputs=[key], outputs=[view.class_search, view.prompt, view.versus, view.target,
                                                       view.predictions], api_name="input_mode",
          show_progress="hidden")

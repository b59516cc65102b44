"""The page's input column: the image, how it becomes the model's input, the example photos, and the model
picker. Its events are the page's own (`build_demo`): the image pass and the model loading."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from vit_inspect.ui.inspector import GEOMETRIES

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
EXAMPLE_PATHS = tuple(ASSETS / name for name, _ in EXAMPLES)


@dataclass(frozen=True)
class InputView:
    """The input column's components."""

    image: gr.Image
    geometry_mode: gr.Radio
    shorter_side: gr.Number
    model_box: gr.Accordion
    model_name: gr.Dropdown
    weights: gr.File
    load_button: gr.Button


def layout(models: tuple[str, ...], model: str) -> InputView:
    """The column, inside the page's ``gr.Row``; ``models`` are the names the picker offers, ``model`` the one
    it shows first."""
    with gr.Column(scale=1, min_width=320):
        image = gr.Image(label="Image (upload, drop, paste or webcam)", type="filepath", height=320,
                         sources=["upload", "clipboard", "webcam"], elem_id="input-image")
        geometry_mode = gr.Radio(list(GEOMETRIES), value="model's centre crop", label="What the model sees",
                                 elem_id="geometry", info="The model's own centre crop, the whole image "
                                 "squashed to its input size, or the whole image with its aspect ratio "
                                 "kept (a non-square patch grid; position embeddings interpolated).")
        shorter_side = gr.Number(224, label="Shorter side for 'aspect kept' (pixels)", precision=0,
                                 minimum=16, maximum=1024, elem_id="shorter-side")
        gr.Examples([[str(path)] for path in EXAMPLE_PATHS], inputs=image, label="Examples",
                    examples_per_page=len(EXAMPLES))
        gr.Markdown("Examples, left to right: " + "; ".join(c for _, c in EXAMPLES) + ".")
        with gr.Accordion("Change model", open=False) as model_box:
            model_name = gr.Dropdown(list(models), value=model, label="Model", allow_custom_value=True,
                                     elem_id="model-name", info="Or type any timm ViT name, or a Hugging Face id "
                                                                "such as google/vit-base-patch16-224.")
            weights = gr.File(label="Own weights (.safetensors, for a timm name; leave empty otherwise)",
                              file_types=[".safetensors"], type="filepath", elem_id="weights-file")
            load_button = gr.Button("Load model", variant="primary", elem_id="load-model")
    return InputView(image, geometry_mode, shorter_side, model_box, model_name, weights, load_button)

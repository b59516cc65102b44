"""The Predictions tab: the model's top-5 classes, the input it saw, and the region of the upload that input is.

It has no events of its own: the image pass (`Inspector.analyze`) fills it."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import MAP_OUT, OutputImage


@dataclass(frozen=True)
class PredictionsView:
    """The Predictions tab's components."""

    tab: gr.Tab
    predictions: gr.Label
    crop: gr.Image
    seen: gr.Image


def layout() -> PredictionsView:
    """The tab and its outputs, inside the page's ``gr.Tabs``."""
    with gr.Tab("Predictions") as tab:
        with gr.Row():
            predictions = gr.Label(num_top_classes=5, label="Top-5 classes", elem_id="predictions")
            crop = OutputImage(label="What the model sees (its input)", elem_id="crop", **MAP_OUT)
        seen = OutputImage(label="Your upload: the outlined region is what the model saw",
                           elem_id="seen-region", height=340, **MAP_OUT)
    return PredictionsView(tab, predictions, crop, seen)

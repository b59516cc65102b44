"""vit_inspect's Gradio app: `python app.py` serves it on http://127.0.0.1:7860."""
from __future__ import annotations

import argparse

import gradio as gr
import numpy as np
import torch

from vit_inspect.capture import capture_attention
from vit_inspect.errors import VitInspectError
from vit_inspect.images import load_image
from vit_inspect.models import DEFAULT_MODEL, load_model


def build_demo(model_name: str = DEFAULT_MODEL, weights: str | None = None, device: str | None = None) -> gr.Blocks:
    handle = load_model(model_name, weights=weights, device=device)

    def predict(image):
        if image is None:
            raise gr.Error("Please upload an image.")
        try:
            x, _ = handle.preprocess.apply(load_image(image))
        except VitInspectError as exc:
            raise gr.Error(str(exc)) from None
        with torch.no_grad(), capture_attention(handle):
            probs = handle.forward(x).softmax(-1)[0].cpu().numpy()
        return {t["label"]: t["prob"] for t in handle.top_labels(np.asarray(probs), 5)}

    with gr.Blocks(title="vit_inspect") as demo:
        gr.Markdown(f"# vit_inspect\nModel: `{handle.name}` on `{handle.device}`")
        image = gr.Image(type="pil", label="Image")
        labels = gr.Label(num_top_classes=5, label="Top-5")
        image.change(predict, image, labels, api_name="predict")
    return demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--weights")
    parser.add_argument("--device")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true")
    args = parser.parse_args()
    build_demo(args.model, args.weights, args.device).launch(server_name=args.host, server_port=args.port,
                                                             share=args.share)


if __name__ == "__main__":
    main()

"""A prompt's maps agree with the peers' own code: pytorch-grad-cam given a similarity target, and LeGrad's own
package (legrad-torch, `LeWrapper.compute_legrad_clip`) on the same random ViT-B-16, image tensor and prompt."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from support import REPO
from support.clip import TINY_CLIP, clip_handle, make_clip, save_clip

from vit_inspect.cli.main import main
from vit_inspect.core.images import load_image
from vit_inspect.passes.pipeline import analyze_image

open_clip = pytest.importorskip("open_clip")
CHELSEA = REPO / "assets" / "chelsea.png"
PROMPT = "a photo of a cat"


def test_grad_cam_equals_pytorch_grad_cam_with_a_similarity_target():
    pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.image import scale_cam_image

    handle, reference = clip_handle(seed=7), make_clip(seed=7)
    result = analyze_image(handle, CHELSEA, target=PROMPT)
    pixels, _ = handle.preprocess.apply(load_image(CHELSEA))
    with torch.no_grad():
        text = reference.encode_text(open_clip.get_tokenizer(TINY_CLIP)([PROMPT]), normalize=True)[0]
    grid = result.layout.grid_h, result.layout.grid_w

    def tokens_to_grid(tokens: torch.Tensor) -> torch.Tensor:  # (B, 1 + P, D) -> (B, D, gh, gw), class token out
        return tokens[:, 1:].reshape(tokens.shape[0], *grid, -1).permute(0, 3, 1, 2)

    tower = _ImageTower(reference)
    with GradCAM(model=tower, target_layers=[reference.visual.transformer.resblocks[-1].ln_1],
                 reshape_transform=tokens_to_grid) as cam:
        theirs = cam(input_tensor=pixels, targets=[SimilarityToConceptTarget(text)])  # (1, H, W), ReLU'd, min-max
    # their display steps on our raw map: ReLU, min-max and resize per layer, then min-max of the layers' mean
    ours = scale_cam_image(scale_cam_image(np.maximum(result.gradcam[-1], 0)[None], target_size=(32, 32)))
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


class SimilarityToConceptTarget:
    """pytorch-grad-cam's similarity target, as its tutorial "Pixel Attribution for embeddings" defines it."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features

    def __call__(self, model_output: torch.Tensor) -> torch.Tensor:
        return torch.nn.CosineSimilarity(dim=0)(model_output, self.features)


class _ImageTower(torch.nn.Module):
    """OpenCLIP's image embedding as a plain module, as pytorch-grad-cam's CLIP examples wrap it."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixels)


@pytest.mark.slow  # a random ViT-B-16 (150 M parameters, a 600 MB weights file) through the command line
def test_the_cli_legrad_map_agrees_with_legrad_torch(tmp_path, capsys):
    legrad = pytest.importorskip("legrad")
    weights = save_clip(make_clip("ViT-B-16", seed=0), tmp_path / "vit_b_16.safetensors")
    code = main(["analyze", str(CHELSEA), "--model", "open_clip:ViT-B-16", "--weights", str(weights),
                 "--prompt", PROMPT, "--zero-shot", "cat,dog", "--device", "cpu"])
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["target"] == {"prompt": PROMPT} and record["score"] == "cosine"
    assert all(record[k] is not None for k in ("rollout", "gradcam", "chefer", "legrad", "attnlrp"))
    ours = np.asarray(record["legrad"])

    model = make_clip("ViT-B-16", seed=0)
    wrapper = legrad.LeWrapper(model)  # its default: the last 2 blocks (layer_index=-2)
    # legrad-torch 1.1 runs the transformer sequence-first (LND), as OpenCLIP < 2.24 did; it replaces the blocks
    # it explains with sequence-first code, and the blocks before them must read LND too, or each token attends
    # to itself alone (OpenCLIP 3.3's attention is batch-first): the wrapper alone gives another image embedding.
    for block in wrapper.visual.transformer.resblocks[:wrapper.starting_depth]:
        block.attn.batch_first = False
    wrapper.patch_size = 1  # its map on the patch grid: F.interpolate(scale_factor=1) is the identity
    handle = clip_handle("ViT-B-16", model=make_clip("ViT-B-16", seed=0), labels=("cat", "dog"))
    pixels, _ = handle.preprocess.apply(load_image(CHELSEA))
    with torch.no_grad():
        text = model.encode_text(open_clip.get_tokenizer("ViT-B-16")([PROMPT]), normalize=True)
    theirs = wrapper.compute_legrad_clip(text, pixels)[0, 0].detach().numpy()  # (14, 14), min-max scaled
    assert theirs.shape == ours.shape == (14, 14)
    rho = spearmanr(ours.ravel(), theirs.ravel()).statistic
    assert rho >= 0.99, rho
    scaled = (ours - ours.min()) / (ours.max() - ours.min())
    np.testing.assert_allclose(scaled, theirs, atol=1e-3)

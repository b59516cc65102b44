"""Our sanity checks against Quantus 0.6.0 (`MPRT`, `RandomLogit`), the reference implementation of
Adebayo et al.'s model-parameter randomisation test and Sixt et al.'s random-logit test, on shared photos
with the real DeiT-Ti.

Where the two compute the same thing, the numbers agree to float64 rounding:

- **RandomLogit**: Quantus draws the other class with ``np.random.seed(seed); randint(0, C - 1)`` and skips
  the explained class; given that class (`SanitySettings.random_class`), our study's Spearman between the
  two maps equals Quantus's, for every method tried.
- **MPRT, per layer Quantus randomises**: on each of Quantus's randomised models (its own generator), the
  Spearman that Quantus reports between the trained map and the map of that model equals our `spearman` of
  the maps our one-pass code computes on that model.

Quantus gets our maps on the pixel grid (each patch's value on its 16 x 16 pixels, as its API wants an
attribution per pixel); Spearman does not change under that (each value repeated equally often: the average
ranks are an affine function of the patch ranks), so it is compared with ours on the 14 x 14 grid. Both run
with ``abs=False, normalise=False`` (Quantus's defaults take absolute values and divide by the maximum; ranks
ignore the division but not the absolute value, which would change signed maps such as Grad-CAM).

What differs by design, and so is not compared number for number:

1. **What is randomised.** Quantus re-initialises every module that has ``reset_parameters`` (75 on DeiT-Ti:
   each block's two LayerNorms and four Linears, the patch projection, the final norm and the **head**),
   from the head down. Adebayo et al. keep the explained logit meaningful only in the sense that the same
   unit is explained; once Quantus has reset the head, "the class" is a random unit. We keep the head and
   the final norm, and randomise whole blocks, last to first, then the patch embedding **with** the position
   embedding and the class token, which Quantus never touches (they are parameters of the model itself, not
   of a module with ``reset_parameters``).
2. **How.** Quantus calls PyTorch's ``reset_parameters`` (Kaiming-uniform Linear weights, uniform biases)
   under ``torch.manual_seed(seed + 1)`` before each module; we run the model's own initialiser (timm's
   ``init_weights``: normal σ .02 weights, zero biases) once under our seed.
3. **SSIM.** Quantus's MPRT hands its similarity function the maps flattened to one row per image, so its
   SSIM is skimage's on a 1-D signal of 50,176 pixels with the joint data range of the raw maps; ours is 2-D
   on the normalised 14 x 14 maps (`analysis.ssim`). Only Spearman is compared.

So the per-step curves are not the same experiment; the last test checks that both reach the same verdict
where it matters: a map of the input alone stays at Spearman 1 under Quantus's randomisation too, and
Grad-CAM falls below our pass threshold under both protocols.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import DEIT_WEIGHTS, IMAGENET

from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.studies.sanity import PASS_THRESHOLD, SanitySettings, method_maps, sanity_check

quantus = pytest.importorskip("quantus", reason="the Quantus cross-check needs quantus==0.6.0 (requirements-dev.txt)")
pytestmark = pytest.mark.slow

PHOTOS = ("n01440764_tench.JPEG", "n02123045_tabby.JPEG", "n03063599_coffee_mug.JPEG")
SEED = 42  # Quantus's default


@pytest.fixture(scope="module")
def deit_handle():
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    from vit_inspect.core.load import load_model

    return load_model("deit_tiny_patch16_224", weights=DEIT_WEIGHTS, device="cpu")


def edges(analysis):
    """A map of the input alone (mean absolute vertical grey-level step per patch)."""
    layout = analysis.layout
    grey = analysis.rgb.astype(np.float64).mean(-1)
    step = np.abs(np.diff(grey, axis=0, append=grey[-1:]))
    return step.reshape(layout.grid_h, layout.patch_h, layout.grid_w, layout.patch_w).mean(axis=(1, 3))


def _grid_maps(model, pixels: torch.Tensor, target: int, method: str) -> np.ndarray:
    """Our map of `method` for `target` on `model` (any weights), by the one-pass code."""
    handle = handle_from_timm(model, name="deit_tiny_patch16_224", device="cpu")
    analysis = analyze_pixels(handle, pixels, target=target, relevance=False)
    return method_maps(analysis, (method,) if method != "edges" else (), {"edges": edges} if method == "edges"
                       else None)[0][method]


def _explain(method: str):
    """Quantus's explain_func: our grid map spread over each patch's pixels, (B, 1, H, W)."""
    def explain(model, inputs, targets, **kwargs):
        rows = []
        for x, y in zip(np.asarray(inputs), np.asarray(targets)):
            grid = _grid_maps(model, torch.from_numpy(np.asarray(x, np.float32))[None], int(y), method)
            rows.append(np.kron(grid, np.ones((16, 16)))[None])
        return np.stack(rows).astype(np.float32)
    return explain


def _inputs(handle):
    pixels = [handle.preprocess.apply(Image.open(IMAGENET / name).convert("RGB"))[0] for name in PHOTOS]
    x = torch.cat(pixels)
    with torch.no_grad():
        y = handle.forward(x).argmax(-1).numpy()
    return x, y


def quantus_class(target: int, num_classes: int = 1000, seed: int = SEED) -> int:
    """The class Quantus's RandomLogit explains instead of `target` (one image per batch)."""
    np.random.seed(seed)
    drawn = int(np.random.randint(0, num_classes - 1, 1)[0])
    return drawn + int(drawn >= target)


@pytest.mark.parametrize("method", ["gradcam", "chefer", "attention"])
def test_random_logit_spearman_equals_quantus(deit_handle, method):
    x, y = _inputs(deit_handle)
    metric = quantus.RandomLogit(similarity_func=quantus.similarity_func.correlation_spearman, num_classes=1000,
                                 seed=SEED, abs=False, normalise=False, disable_warnings=True)
    a_batch = _explain(method)(deit_handle.model, x.numpy(), y)
    scores = [metric(model=deit_handle.model, x_batch=x[i:i + 1].numpy(), y_batch=y[i:i + 1],
                     a_batch=a_batch[i:i + 1], explain_func=_explain(method), device="cpu", batch_size=1)[0]
              for i in range(len(PHOTOS))]
    for i, name in enumerate(PHOTOS):
        ours = sanity_check(deit_handle, IMAGENET / name, (method,), target=int(y[i]),
                            settings=SanitySettings(random_class=quantus_class(int(y[i])), independent=False,
                                                    robustness=None))
        assert ours.random_logit[method].spearman == pytest.approx(scores[i], abs=1e-9), name


def test_mprt_spearman_per_quantus_layer_equals_ours(deit_handle):
    from quantus.helpers.model.pytorch_model import PyTorchModel

    x, y = _inputs(deit_handle)
    x, y = x[:1], y[:1]
    metric = quantus.MPRT(similarity_func=quantus.similarity_func.correlation_spearman, layer_order="top_down",
                          seed=SEED, abs=False, normalise=False, disable_warnings=True)
    a_batch = _explain("gradcam")(deit_handle.model, x.numpy(), y)
    scores = metric(model=deit_handle.model, x_batch=x.numpy(), y_batch=y, a_batch=a_batch,
                    explain_func=_explain("gradcam"), device="cpu", batch_size=1)
    layers = [name for name in scores if name != "original"]
    assert len(layers) == 75 and layers[:3] == ["head", "norm", "blocks.11.mlp.fc2"]
    assert layers[-1] == "patch_embed.proj"
    trained = _grid_maps(deit_handle.model, x, int(y[0]), "gradcam")
    generator = PyTorchModel(deit_handle.model, channel_first=True).get_random_layer_generator("top_down", SEED)
    for index, (name, model) in enumerate(generator):
        if index % 8 and name != "patch_embed.proj":  # every 8th layer and the last: 11 of 75 passes
            continue
        ours = spearman(trained, _grid_maps(model, x, int(y[0]), "gradcam"))
        assert ours == pytest.approx(scores[name][0], abs=1e-9), name


def test_both_protocols_reach_the_same_verdict(deit_handle):
    x, y = _inputs(deit_handle)
    x, y = x[:1], y[:1]
    last = {}
    for method in ("gradcam", "edges"):
        metric = quantus.MPRT(similarity_func=quantus.similarity_func.correlation_spearman, layer_order="top_down",
                              seed=SEED, abs=False, normalise=False, skip_layers=True, disable_warnings=True)
        a_batch = _explain(method)(deit_handle.model, x.numpy(), y)
        scores = metric(model=deit_handle.model, x_batch=x.numpy(), y_batch=y, a_batch=a_batch,
                        explain_func=_explain(method), device="cpu", batch_size=1)
        last[method] = scores["patch_embed.proj"][0]  # every module random
    ours = sanity_check(deit_handle, IMAGENET / PHOTOS[0], ("gradcam",), target=int(y[0]), extra={"edges": edges},
                        settings=SanitySettings(independent=False, random_logit=False, robustness=None))
    assert last["edges"] == pytest.approx(1.0) and ours.cascading["edges"][-1].spearman == pytest.approx(1.0)
    assert abs(last["gradcam"]) < PASS_THRESHOLD and ours.passes_randomisation()["gradcam"] is True

"""Facts from the ViT paper's Fig. 7 on the real DeiT-Ti weights (../shared)."""
from __future__ import annotations

import numpy as np
import pytest
from support import IMAGENET

from vit_inspect.jobs.distance import dataset_attention_distance
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.model_report import model_report


@pytest.fixture(scope="module")
def dataset_distance(deit):
    files = sorted(IMAGENET.glob("*.JPEG"))[::50]  # 20 photos spread over the classes
    if len(files) < 16:
        pytest.skip("ImageNet samples not found")
    return dataset_attention_distance(deit, files, batch_size=10)


def test_attention_distance_grows_with_depth(dataset_distance):
    distances = dataset_distance.distances  # (12, 3) pixels
    assert dataset_distance.num_images == 20
    first, last = distances[:3].mean(), distances[-3:].mean()
    assert last > first + 30, (first, last)
    assert distances[0].max() > 60  # some layer-0 heads already look far (the paper's Fig. 7 right)
    assert distances[-1].min() > 100  # the last layer is nearly global: uniform over 14x14 gives ~116 px
    assert distances.max() < 130


def test_position_embeddings_are_local(deit):
    similarity = model_report(deit).pos_similarity  # (14, 14, 14, 14)
    rows, cols = np.meshgrid(np.arange(14), np.arange(14), indexing="ij")
    neighbour, far = [], []
    for r in range(14):
        for c in range(14):
            distance = np.hypot(rows - r, cols - c)
            neighbour.append(similarity[r, c][distance == 1].mean())
            far.append(similarity[r, c][distance >= 8].mean())
    assert np.mean(neighbour) > np.mean(far) + 0.3
    assert np.mean(np.array(neighbour) > np.array(far)) > 0.95


def test_filter_pca_has_structure(deit):
    ratios = model_report(deit).filter_pca.explained_variance_ratio
    assert ratios.shape == (28,) and np.all(np.diff(ratios) <= 1e-9)
    assert ratios[:28].sum() > 0.4  # 28 of 768 directions hold much of the variance: filters are not random


def test_cat_maps_on_chelsea(deit):
    from support import PHOTOS

    result = analyze_image(deit, PHOTOS / "chelsea.png")
    assert deit.label(result.target).split(",")[0] in {"Egyptian cat", "tabby", "tiger cat"}
    assert result.gradcam.shape == (12, 14, 14) and result.chefer.shape == (14, 14)
    # attention (2.8 MB) + per-layer gradient-fused attention, every block's patch tokens (0.9 MB), features, preview
    assert result.nbytes() < 6_000_000


def test_deit_tiny_keeps_its_own_maps(deit):
    """At 224 px DeiT-Ti's float16 maps (2,794,248 bytes) are under the 4 MiB bound: the store holds the model's
    own probabilities, each rounded once to float16, and the Q/K store (448 px) rebuilds the same numbers."""
    import torch
    from support import PHOTOS

    from vit_inspect.core.images import load_image
    from vit_inspect.passes.capture import capture_attention

    picture = load_image(PHOTOS / "chelsea.png")
    store = analyze_image(deit, picture, relevance=False).attention_store
    assert store.mode == "maps" and store.maps.nbytes == 2_794_248 and store.max_error == 0.0
    pixels, _ = deit.preprocess.apply(picture)
    with torch.no_grad(), capture_attention(deit) as rec:
        deit.forward(pixels)
    np.testing.assert_array_equal(store.maps, rec.attention[0].numpy().astype(np.float16))
    large = analyze_image(deit, picture, input_size=(448, 448), relevance=False).attention_store
    assert large.mode == "qk16" and large.nbytes() < 0.3 * 12 * 3 * 785 ** 2 * 2  # N = 785: Q/K, not the maps


def test_half_precision_autocast_agrees_with_float32(deit):
    """Stated tolerance for `autocast=True` (bfloat16 on CPU, float16 on CUDA): same top class,
    probabilities within 0.02, attention within 0.05, distances within 1 px, maps correlated r >= 0.995."""
    from support import PHOTOS

    full = analyze_image(deit, PHOTOS / "chelsea.png")
    half = analyze_image(deit, PHOTOS / "chelsea.png", autocast=True)
    assert half.target == full.target
    assert np.abs(half.probs - full.probs).max() < 0.02
    assert np.abs(half.attention_stack().astype(np.float32) - full.attention_stack().astype(np.float32)).max() < 0.05
    assert np.abs(half.mean_distance - full.mean_distance).max() < 1.0
    for a, b in ((full.rollout(), half.rollout()), (full.chefer, half.chefer), (full.gradcam[-1], half.gradcam[-1])):
        assert np.corrcoef(a.ravel(), b.ravel())[0, 1] >= 0.995

"""The registered map "dff_concept": the heatmap of the image's concept with the largest class logit, from the
pass's tokens or from other pixels' own forward, and scored by the faithfulness study like every map."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from support import tiny_handle

from vit_inspect.analysis.concepts import deep_feature_factorization
from vit_inspect.methods import MethodContext, compute_map, get
from vit_inspect.passes.block_tokens import input_block_tokens
from vit_inspect.passes.concepts import concept_logits, image_concepts
from vit_inspect.passes.options import STUDY_OPTIONS
from vit_inspect.passes.pipeline import analyze_image, analyze_pixels
from vit_inspect.passes.sae import block_output
from vit_inspect.studies.faithfulness import evaluate_image, image_permutation, model_scorer, score_maps


def _rgb(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def test_the_map_is_the_concept_the_head_reads_with_the_largest_logit():
    handle = tiny_handle("cls", seed=1)
    result = analyze_pixels(handle, handle.preprocess.normalize(_rgb(0)), target=4, relevance=False)
    method = get("dff_concept")
    assert (method.reads, method.forwards, method.backwards, method.faithfulness) == ("own passes", 1, 0, True)
    ours = compute_map(method, MethodContext(result, handle))
    concepts = image_concepts(handle, result)
    assert concepts.k == 5 and concepts.layer == handle.depth - 1
    np.testing.assert_array_equal(ours, concepts.heatmaps[0])
    assert concepts.class_logits()[0] == concepts.class_logits().max()


def test_other_pixels_are_factorised_from_their_own_tokens():
    """Built from the analysis functions directly: the other input's block tokens (a hook), their DFF, and the
    component whose embedding the head reads with the largest logit for the pass's class."""
    handle = tiny_handle("cls", seed=2)
    result = analyze_pixels(handle, handle.preprocess.normalize(_rgb(1)), target=7, relevance=False)
    other = handle.preprocess.normalize(_rgb(2))
    seen = []
    with torch.no_grad(), block_output(handle, 1, seen.append):
        handle.forward(other)
    tokens = result.layout.patches(seen[0][0], axis=0).float().numpy()  # (P, D)
    parts = deep_feature_factorization(tokens, 5, seed=0)
    best = int(np.argmax(concept_logits(handle, parts.concepts, result.layout)[:, 7]))
    ours = compute_map(get("dff_concept"), MethodContext(result, handle, other))
    np.testing.assert_allclose(ours, result.layout.to_grid(parts.heatmaps[best]), rtol=1e-6)
    assert not np.allclose(ours, compute_map(get("dff_concept"), MethodContext(result, handle)))


def test_the_faithfulness_study_scores_the_concept_map():
    handle = tiny_handle("cls", seed=3)
    picture = Image.fromarray(_rgb(3))
    scored = evaluate_image(handle, picture, label=2, methods=("dff_concept", "gradcam"), batch_size=8)
    assert scored.failures == {} and set(scored.curves) == {"dff_concept", "gradcam"}
    analysis = analyze_image(handle, picture, None, STUDY_OPTIONS)
    pixels, _ = handle.preprocess.apply(picture)
    concept = image_concepts(handle, analysis, tokens=input_block_tokens(handle, pixels, 1, analysis.layout))
    rng = image_permutation(analysis.rgb, analysis.layout.num_patches, 0)
    expected = score_maps(model_scorer(handle), pixels, analysis.layout, {"map": concept.heatmaps[0]}, 2,
                          scored.target, rng.permutation(analysis.layout.num_patches), batch_size=8)["map"]
    for curve in ("pos", "neg", "del", "ins"):
        assert scored.curves["dff_concept"].auc(curve) == expected.auc(curve), curve
    clean = float(model_scorer(handle)(pixels)[0, scored.target])
    assert abs(scored.curves["dff_concept"].deletion[0] - clean) < 1e-6  # nothing removed yet: the clean probability

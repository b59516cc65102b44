"""Faithfulness on a prompt's similarity: every curve records the cosine, by hand and on a tiny OpenCLIP model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import PHOTOS
from support.clip import clip_handle

from vit_inspect.analysis.faithfulness import (DEL_INS_FRACTIONS, POS_NEG_FRACTIONS, curves_from_scores,
                                               patch_counts, plan_perturbations)
from vit_inspect.core.images import load_image
from vit_inspect.core.open_clip_models import prompt_view
from vit_inspect.studies.faithfulness import evaluate_image, prompt_scorer

pytest.importorskip("open_clip")


def test_curves_of_a_score_by_hand():
    # two patches, patch 0 the more relevant; the score is 0.5 for patch 0 shown plus 0.25 for patch 1 shown
    plan = plan_perturbations({"m": np.array([[3.0, 1.0]])}, np.array([0, 1]))
    scores = plan.keep.astype(float) @ np.array([0.5, 0.25])
    curves = curves_from_scores(plan, scores)["m"]
    after_removing = {0: 0.75, 1: 0.25, 2: 0.0}  # the most relevant first
    after_inserting = {0: 0.0, 1: 0.5, 2: 0.75}
    np.testing.assert_allclose(curves.deletion, [after_removing[c] for c in patch_counts(DEL_INS_FRACTIONS, 2)])
    np.testing.assert_allclose(curves.insertion, [after_inserting[c] for c in patch_counts(DEL_INS_FRACTIONS, 2)])
    np.testing.assert_allclose(curves.pos, [after_removing[c] for c in patch_counts(POS_NEG_FRACTIONS, 2)])
    np.testing.assert_allclose(curves.neg, [{0: 0.75, 1: 0.5, 2: 0.0}[c] for c in patch_counts(POS_NEG_FRACTIONS, 2)])
    x, y = DEL_INS_FRACTIONS, curves.deletion
    assert curves.auc("del") == pytest.approx(float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2)))
    assert curves.auc("pos") == pytest.approx(100 * float(np.sum(0.1 * (curves.pos[1:] + curves.pos[:-1]) / 2)))


def test_a_prompt_is_scored_on_its_similarity():
    handle = clip_handle(seed=8)
    result = evaluate_image(handle, PHOTOS / "chelsea.png", label=0, methods=("random", "gradcam", "legrad"),
                            target="a photo of a cat", contrast="a photo of a dog")
    view, target, contrast, _, _ = prompt_view(handle, "a photo of a cat", "a photo of a dog")
    pixels, _ = handle.preprocess.apply(load_image(PHOTOS / "chelsea.png"))
    with torch.no_grad():
        cosine = view.clip.head.cosine(view.forward(pixels))[0]
    clean = float(cosine[target] - cosine[contrast])
    assert float(prompt_scorer(view, target, contrast)(pixels)[0]) == pytest.approx(clean, abs=1e-6)
    for curves in result.curves.values():  # the clean image opens pos, neg, del and closes ins
        for value in (curves.pos[0], curves.neg[0], curves.deletion[0], curves.insertion[-1]):
            assert value == pytest.approx(clean, abs=1e-5)
    assert set(result.curves) == {"random", "gradcam", "legrad"}

"""A prompt is a target of the one pass: every method explains the image-text cosine similarity, checked by hand
on tiny random OpenCLIP models (the CLIP tokenizer ships in the wheel; the SigLIP one gets text embeddings)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import REPO, zero_biases
from support.clip import TINY_CLIP, TINY_SIGLIP, clip_handle, make_clip, siglip_embeddings

from vit_inspect.analysis import gradcam_from_tokens
from vit_inspect.core.errors import InputError
from vit_inspect.core.images import load_image
from vit_inspect.core.open_clip_models import prompt_view
from vit_inspect.core.prompts import Prompt
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import add_relevance, analyze_image
from vit_inspect.passes.relevance import LRPRules, relevance_rules

open_clip = pytest.importorskip("open_clip")
CHELSEA = REPO / "assets" / "chelsea.png"
CAT, DOG = "a photo of a cat", "a photo of a dog"


def _cosines_and_tokens(model, handle, prompts):
    """cos(f, t) per prompt of OpenCLIP's own untouched model for chelsea, and the last block's first-norm tokens."""
    pixels, _ = handle.preprocess.apply(load_image(CHELSEA))
    seen = {}
    hook = model.visual.transformer.resblocks[-1].ln_1.register_forward_hook(lambda m, a, out: seen.update(x=out))
    try:
        image = torch.nn.functional.normalize(model.encode_image(pixels), dim=-1)  # (1, E)
    finally:
        hook.remove()
    with torch.no_grad():
        text = model.encode_text(open_clip.get_tokenizer(TINY_CLIP)(list(prompts)), normalize=True)  # (P, E)
    return (image @ text.T)[0], seen["x"]


def test_grad_cam_of_a_prompt_is_the_gradient_of_the_cosine_by_hand():
    handle, reference = clip_handle(seed=4), make_clip(seed=4)
    result = analyze_image(handle, CHELSEA, target=CAT, contrast=DOG)
    assert (result.prompt.text, result.versus.text, result.score) == (CAT, DOG, "cosine")
    assert (result.target, result.contrast) == (3, 4) and result.probs.shape == (3,)
    assert result.probs.sum() == pytest.approx(1.0, abs=1e-6)
    cosines, tokens = _cosines_and_tokens(reference, handle, (CAT, DOG))
    explained = cosines[0] - cosines[1]
    grads, = torch.autograd.grad(explained, tokens)
    expected = gradcam_from_tokens(tokens[0].detach().numpy(), grads[0].numpy(), result.layout)
    np.testing.assert_allclose(result.gradcam[-1], expected, rtol=1e-4, atol=1e-7)
    for name in ("gradcam", "chefer", "legrad", "attnlrp", "mean_distance"):
        assert np.all(np.isfinite(getattr(result, name)))


def test_versus_is_the_difference_and_the_logit_is_s_times_the_cosine():
    handle = clip_handle(seed=5)
    both = analyze_image(handle, CHELSEA, target=CAT, contrast=DOG)
    cat, dog = (analyze_image(handle, CHELSEA, target=p) for p in (CAT, DOG))
    np.testing.assert_allclose(both.gradcam, cat.gradcam - dog.gradcam, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(both.legrad, cat.legrad)  # LeGrad and AttnLRP explain the prompt itself, as for classes
    logit = analyze_image(handle, CHELSEA, target=CAT, score="logit")
    scale = handle.model.logit_scale.exp().item()
    for name in ("gradcam", "legrad", "attnlrp"):  # linear in the explained score
        np.testing.assert_allclose(getattr(logit, name), scale * getattr(cat, name), rtol=1e-3, atol=1e-8)
    assert logit.score == "logit"
    later = add_relevance(handle, analyze_image(handle, CHELSEA, target=CAT, relevance=False), CHELSEA)
    np.testing.assert_allclose(later.legrad, cat.legrad, rtol=1e-5)
    np.testing.assert_allclose(later.attnlrp, cat.attnlrp, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("rules", [LRPRules(), LRPRules(conv_gamma=0.0, linear_gamma=0.0)])
def test_attnlrp_conserves_the_similarity_on_a_tiny_clip(rules):
    """Without biases the similarity's relevance lands on the pixels, the class embedding and the position
    embeddings: their sum is cos(f, t), the normalisation held constant (`unit_norm_rule`)."""
    handle, _, _, _, _ = prompt_view(clip_handle(seed=6), CAT)
    visual = handle.model.visual
    zero_biases(visual)
    pixels = torch.randn(1, 3, 32, 32, requires_grad=True)
    with capture_attention(handle), relevance_rules(handle, rules) as lrp:
        cosine = handle.clip.head.cosine(handle.forward(pixels)[0, 3])
        with lrp.lrp_mode():
            inputs = [pixels, visual.class_embedding, visual.positional_embedding]
            grads = torch.autograd.grad(cosine, inputs)
    parts = [float((t.detach() * g).sum()) for t, g in zip(inputs, grads)]
    cosine = float(cosine.detach())
    assert sum(parts) == pytest.approx(cosine, rel=1e-4)
    assert abs(parts[0]) > 1e-4 and abs(parts[0] - cosine) > 1e-4


def test_the_siglip_image_path_with_a_given_text_embedding():
    """SigLIP's tokenizer comes from the hub, which tests cannot reach: the image path is tested with precomputed
    text embeddings (random unit vectors standing in for the text tower's output), given as `Prompt(text,
    embedding)`. The tower is shaped as SigLIP's (a timm trunk, no class token, attention pooling); Grad-CAM is
    the hand gradient of cos(f, t_cat) - cos(f, t_dog) from OpenCLIP's own `encode_image`."""
    model, reference = make_clip(TINY_SIGLIP), make_clip(TINY_SIGLIP)
    embeddings = siglip_embeddings(model, 5)
    handle = clip_handle(TINY_SIGLIP, labels=[Prompt(n, e.numpy()) for n, e in zip("abc", embeddings)], model=model)
    result = analyze_image(handle, CHELSEA, target=Prompt("a cat", embeddings[3].numpy()),
                           contrast=Prompt("a dog", embeddings[4].numpy()))
    assert (result.layout.num_prefix_tokens, result.layout.grid_h, result.layout.grid_w) == (0, 14, 14)
    assert result.score == "cosine" and result.heads.lens  # the lens reproduces the similarity
    pixels, _ = handle.preprocess.apply(load_image(CHELSEA))
    seen = {}
    hook = reference.visual.trunk.blocks[-1].norm1.register_forward_hook(lambda m, a, out: seen.update(x=out))
    try:
        image = torch.nn.functional.normalize(reference.encode_image(pixels), dim=-1)[0]  # (E,)
    finally:
        hook.remove()
    grads, = torch.autograd.grad(image @ embeddings[3] - image @ embeddings[4], seen["x"])
    expected = gradcam_from_tokens(seen["x"][0].detach().numpy(), grads[0].numpy(), result.layout)
    np.testing.assert_allclose(result.gradcam[-1], expected, rtol=1e-4, atol=1e-9)
    for name in ("chefer", "legrad", "attnlrp"):
        values = getattr(result, name)
        assert values is not None and np.all(np.isfinite(values)) and np.any(values != 0), name
    with pytest.raises(Exception, match="Hugging Face hub"):  # no tokenizer offline: a sentence, not a download
        analyze_image(handle, CHELSEA, target="a cat")


@pytest.mark.parametrize("prompt, says", [("x" * 102_400, "102,400 characters"), ("a cat\x1b[2J", "U+001B"),
                                          ("a\x00cat", "U+0000"), ("", "empty"), ("a " * 80, "tokens")])
def test_a_hostile_prompt_or_versus_gets_a_sentence_before_the_pass(prompt, says):
    handle = clip_handle(seed=6)
    for target, contrast, what in ((prompt, None, "prompt"), (CAT, prompt, "versus prompt")):
        with pytest.raises(InputError) as caught:
            analyze_image(handle, CHELSEA, target=target, contrast=contrast)
        assert says in caught.value.public and len(caught.value.public) < 200
        assert says == "tokens" or caught.value.public.startswith(f"The {what} ")

"""The KL fine-tune of a trained SAE: its first step against the loss computed here by another route, the KL it
lowers on its images, its seed, the model it leaves untouched, and its refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from support import tiny_handle, write_folder

from vit_inspect.analysis.sae import decode, encode
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import find_images
from vit_inspect.jobs.sae_finetune import FineTuneOptions, fine_tune_kl
from vit_inspect.jobs.sae_folder import train_from_folder
from vit_inspect.jobs.sae_train import TrainOptions


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    write_folder(folder, count=12)
    handle = tiny_handle("cls")
    files = find_images([folder])
    sae = train_from_folder(handle, files, 0, TrainOptions(features=16, k=2, epochs=2, batch_tokens=32, seed=2))
    return handle, sae, files


def _pixels(handle, files):
    return torch.cat([handle.preprocess.apply(Image.open(f).convert("RGB"))[0] for f in files])


def _loss(handle, sae, pixels, mse_weight):
    """KL(p ‖ p̂) + a · normalised MSE, with x̂ put in place by a hook written here and KL by torch's kl_div."""
    with torch.no_grad():
        reference = handle.forward(pixels)
    seen = {}

    def hook(module, args, output):
        x = (output - sae.input_mean) / sae.input_scale
        x_hat = decode(encode(x, sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k), sae.W_dec, sae.b_dec)
        seen["mse"] = ((x - x_hat) ** 2).sum() / (x ** 2).sum()
        return x_hat * sae.input_scale + sae.input_mean

    removable = handle.blocks[sae.info.layer].register_forward_hook(hook)
    try:
        replaced = handle.forward(pixels)
    finally:
        removable.remove()
    kl = F.kl_div(replaced.log_softmax(-1), reference.log_softmax(-1), log_target=True, reduction="batchmean")
    return kl + mse_weight * seen["mse"]


def test_the_first_step_moves_each_tensor_against_the_gradient_of_the_loss(trained):
    handle, sae, files = trained
    options = FineTuneOptions(steps=1, lr=1e-3, images=len(files), mse_weight=0.5)
    stepped = fine_tune_kl(handle, sae, files, options)
    leaves = {name: getattr(sae, name).clone().requires_grad_() for name in ("W_enc", "b_enc", "b_dec")}
    here = type(sae)(leaves["W_enc"], leaves["b_enc"], sae.W_dec, leaves["b_dec"], sae.info, sae.input_mean,
                     sae.input_scale)
    loss = _loss(handle, here, _pixels(handle, files), 0.5)
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    for name, grad in grads.items():
        # Adam's first step is lr · g / (|g| + ε): lr against the sign of each element whose gradient is not ~0
        moved = getattr(stepped, name) - getattr(sae, name)
        clear = grad.abs() > 1e-5
        assert clear.sum() > 0, name
        assert torch.allclose(moved[clear], -1e-3 * grad[clear].sign(), atol=2e-5), name
    assert torch.allclose(stepped.W_dec.norm(dim=1), torch.ones(sae.info.features), atol=1e-5)  # unit rows
    record = stepped.info.training["kl_fine_tune"]
    assert record["steps"] == 1 and record["mse_weight"] == 0.5 and record["images_per_step"] == len(files)
    with torch.no_grad():
        assert record["kl_first"] == pytest.approx(float(_loss(handle, sae, _pixels(handle, files), 0.0)), rel=1e-4)
    assert stepped.info.training["epochs"] == sae.info.training["epochs"]  # the training record is kept


def test_it_lowers_the_kl_on_its_images_is_seeded_and_leaves_the_model_alone(trained):
    handle, sae, files = trained
    before = {name: p.detach().clone() for name, p in handle.model.named_parameters()}
    options = FineTuneOptions(steps=30, lr=3e-3, images=4, mse_weight=1.0, seed=5)
    tuned = fine_tune_kl(handle, sae, files, options, mirror=True, crops=1, crop_seed=2)
    pixels = _pixels(handle, files)
    with torch.no_grad():
        kl_before = float(_loss(handle, sae, pixels, 0.0))
        kl_after = float(_loss(handle, tuned, pixels, 0.0))
    assert kl_after < 0.8 * kl_before
    record = tuned.info.training["kl_fine_tune"]
    assert record["kl_last"] < record["kl_first"]
    again = fine_tune_kl(handle, sae, files, options, mirror=True, crops=1, crop_seed=2)
    assert torch.equal(again.W_enc, tuned.W_enc) and torch.equal(again.W_dec, tuned.W_dec)
    for name, p in handle.model.named_parameters():
        assert torch.equal(p, before[name]) and p.grad is None, name
    assert torch.equal(tuned.input_mean, sae.input_mean) and tuned.info.features == sae.info.features


def test_unreadable_images_are_left_out_and_none_readable_is_a_sentence(trained, tmp_path):
    handle, sae, files = trained
    (tmp_path / "broken.png").write_bytes(b"not a png")
    tuned = fine_tune_kl(handle, sae, [tmp_path / "broken.png", *files[:2]], FineTuneOptions(steps=2, images=2))
    assert tuned.info.training["kl_fine_tune"]["steps"] == 2
    with pytest.raises(VitInspectError, match="None of the images could be read"):
        fine_tune_kl(handle, sae, [tmp_path / "broken.png"], FineTuneOptions(steps=1, images=1))


@pytest.mark.parametrize(("kwargs", "words"), [({"steps": 0}, "--kl-steps must be between 1"),
                                               ({"steps": 2, "lr": 0}, "--kl-lr and the images per step"),
                                               ({"steps": 2, "mse_weight": -1}, "the MSE weight 0 or more"),
                                               ({"steps": 2, "lr": float("nan")}, "--kl-lr and the images"),
                                               ({"steps": 2, "lr": float("inf")}, "--kl-lr and the images"),
                                               ({"steps": 2, "mse_weight": float("nan")}, "the MSE weight")])
def test_options_out_of_range_are_sentences(kwargs, words):
    with pytest.raises(VitInspectError, match=words):
        FineTuneOptions(**kwargs)


def test_more_images_per_step_than_training_images_is_a_sentence(trained):
    handle, sae, files = trained
    options = FineTuneOptions(steps=1, images=3)
    options.check_images(3)  # as many as there are: allowed
    with pytest.raises(VitInspectError, match=r"--kl-images \(3\) is more than the 2 training images"):
        fine_tune_kl(handle, sae, files[:2], options)


def test_another_models_sae_is_refused(trained):
    _, sae, files = trained
    with pytest.raises(VitInspectError):
        fine_tune_kl(tiny_handle("reg4"), sae, files, FineTuneOptions(steps=1))

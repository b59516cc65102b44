"""SAE training from a folder: the shuffle buffer's bound and coverage, the activation pass (stopped after the
block), a tiny seeded run whose loss falls and whose variance explained rises, and the quality job."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle, write_folder

from vit_inspect.analysis.sae import reconstruct
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import find_images, square_crops
from vit_inspect.jobs.sae import SAEActivationWorker
from vit_inspect.jobs.sae_folder import evaluate_sae, save_with_metrics, train_from_folder
from vit_inspect.jobs.sae_train import TrainOptions, check_buffer, shuffled_batches
from vit_inspect.passes.sae import block_output


def test_the_buffer_yields_every_token_once_and_holds_at_most_its_bytes(tmp_path):
    width, files = 4, []
    for i, rows in enumerate((50, 7, 130, 1)):
        path = tmp_path / f"tokens-{i}.npy"
        start = sum(len(np.load(f)) for f in files)
        np.save(path, (np.arange(start, start + rows, dtype=np.float32)[:, None] * np.ones(width, np.float32)))
        files.append(path)
    buffer_bytes = 40 * 4 * width  # 40 tokens
    batches = [rows for rows, _ in shuffled_batches(files, width, 8, buffer_bytes, np.random.default_rng(0))]
    seen = np.concatenate([b[:, 0] for b in batches])
    assert sorted(seen.tolist()) == list(range(188))
    assert all(len(b) == 8 for b in batches[:-1]) and 0 < len(batches[-1]) <= 8
    assert seen.tolist() != list(range(188))  # shuffled
    again = np.concatenate([b[:, 0] for b, _ in shuffled_batches(files, width, 8, buffer_bytes,
                                                                    np.random.default_rng(0))])
    assert np.array_equal(seen, again)  # seeded


def test_each_token_carries_the_weight_of_its_position_in_its_image(tmp_path):
    width, files = 3, []
    for i, images in enumerate((4, 1, 7)):  # images of 5 tokens each; a token's value is its row in the file
        path = tmp_path / f"tokens-{i}.npy"
        np.save(path, np.arange(5 * images, dtype=np.float32)[:, None] * np.ones(width, np.float32))
        files.append(path)
    weights = np.array([30, 1, 1, 1, 1], np.float32)  # one prefix token of weight 30, then four patches
    pairs = list(shuffled_batches(files, width, 4, 12 * 4 * (width + 1), np.random.default_rng(1), weights))
    rows = np.concatenate([r[:, 0] for r, _ in pairs]).astype(int)
    got = np.concatenate([w for _, w in pairs])
    assert len(rows) == 60 and np.array_equal(got, np.where(rows % 5 == 0, 30, 1))
    plain = np.concatenate([w for _, w in shuffled_batches(files, width, 4, 12 * 4 * (width + 1),
                                                           np.random.default_rng(1))])
    assert np.all(plain == 1)
    with pytest.raises(VitInspectError, match="does not hold whole images of 7 tokens"):
        list(shuffled_batches(files, width, 4, 1024, np.random.default_rng(1), np.ones(7, np.float32)))


def test_the_activation_pass_stops_after_the_block_and_spills_its_tokens(tmp_path):
    handle = tiny_handle("reg4")
    ran = []
    handle.blocks[1].register_forward_hook(lambda *a: ran.append(1))
    worker = SAEActivationWorker(handle, 0, "patches", str(tmp_path))
    images = [np.zeros((32, 32, 3), np.uint8), np.full((32, 32, 3), 200, np.uint8)]
    sums = worker.map_batch(images, ["a.png", "b.png"])
    assert not ran  # block 1 never ran
    rows = np.load(next(tmp_path.glob("tokens-*.npy")))
    layout = handle.layout()
    assert rows.shape == (2 * layout.num_patches, handle.embed_dim)
    outputs = []
    with torch.no_grad(), block_output(handle, 0, outputs.append):
        handle.forward(torch.cat([handle.preprocess.apply(Image.fromarray(i))[0] for i in images]))
    assert np.allclose(rows, outputs[0][:, layout.patch_slice].reshape(-1, handle.embed_dim).numpy(), atol=1e-6)
    assert np.allclose(sums.arrays["sum"], rows.astype(np.float64).sum(0)) and sums.arrays["tokens"][0] == len(rows)


def test_mirrored_tokens_are_those_of_the_input_flipped_left_to_right(tmp_path):
    handle = tiny_handle("cls")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    sums = SAEActivationWorker(handle, 1, "all", str(tmp_path), mirror=True).map_batch(images, ["a.png", "b.png"])
    rows = np.load(next(tmp_path.glob("tokens-*.npy")))
    n, d = handle.layout().num_tokens, handle.embed_dim
    assert rows.shape == (4 * n, d) and sums.arrays["tokens"][0] == 4 * n and sums.count == 2
    pixels = torch.cat([handle.preprocess.apply(Image.fromarray(i))[0] for i in images])
    for half, given in ((rows[:2 * n], pixels), (rows[2 * n:], pixels.flip(-1))):
        outputs = []
        with torch.no_grad(), block_output(handle, 1, outputs.append):
            handle.forward(given)
        assert np.allclose(half, outputs[0].reshape(-1, d).numpy(), atol=1e-6)
    # the flip is of the model's input; here, where the centre crop is the whole image, it is the photo mirrored
    flipped = torch.cat([handle.preprocess.apply(Image.fromarray(np.ascontiguousarray(i[:, ::-1])))[0]
                         for i in images])
    assert torch.allclose(flipped, pixels.flip(-1))
    assert not np.allclose(rows[:2 * n], rows[2 * n:], atol=1e-3)


def test_square_crops_draw_side_corner_and_mirror_in_that_order():
    photo = Image.fromarray(np.arange(40 * 60 * 3, dtype=np.uint32).reshape(40, 60, 3).astype(np.uint8))
    views = square_crops(photo, 3, np.random.default_rng(5))
    rng = np.random.default_rng(5)  # by hand: side from 50-100 % of the shorter side (40), corner, then the mirror
    for view in views:
        side = int(rng.uniform(0.5, 1.0) * 40)
        left, top = int(rng.integers(0, 60 - side + 1)), int(rng.integers(0, 40 - side + 1))
        expected = np.asarray(photo)[top:top + side, left:left + side]
        expected = expected[:, ::-1] if rng.random() < 0.5 else expected
        assert view.size == (side, side) and 20 <= side <= 40
        assert np.array_equal(np.asarray(view), expected)
    assert len({v.size for v in views}) > 1


def test_crop_tokens_are_those_of_the_seeded_crops_whatever_the_batch(tmp_path):
    handle = tiny_handle("cls")
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (48, 40, 3), dtype=np.uint8) for _ in range(2)]
    worker = SAEActivationWorker(handle, 1, "all", str(tmp_path / "both"), mirror=True, crops=2, seed=4)
    (tmp_path / "both").mkdir()
    sums = worker.map_batch(images, ["a.png", "b.png"])
    rows = np.load(next((tmp_path / "both").glob("tokens-*.npy")))
    n, d = handle.layout().num_tokens, handle.embed_dim
    assert rows.shape == (8 * n, d) and sums.arrays["tokens"][0] == 8 * n and sums.count == 2
    crops = worker.crops_of(images[0], "a.png") + worker.crops_of(images[1], "b.png")
    pixels = torch.cat([handle.preprocess.apply(view)[0] for view in crops])
    outputs = []
    with torch.no_grad(), block_output(handle, 1, outputs.append):
        handle.forward(pixels)
    assert np.allclose(rows[4 * n:], outputs[0].reshape(-1, d).numpy(), atol=1e-6)  # after the plain and mirrored
    alone = SAEActivationWorker(handle, 1, "all", str(tmp_path / "alone"), crops=2, seed=4)
    (tmp_path / "alone").mkdir()
    alone.map_batch(images[1:], ["b.png"])  # b.png in a batch of its own: the same crops
    single = np.load(next((tmp_path / "alone").glob("tokens-*.npy")))
    assert np.allclose(single[n:], rows[6 * n:], atol=1e-6)
    other = SAEActivationWorker(handle, 1, "all", str(tmp_path), crops=2, seed=5).crops_of(images[1], "b.png")
    assert [v.size for v in other] != [v.size for v in crops[2:]] or not all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(other, crops[2:]))  # another seed, other crops


@pytest.mark.slow
def test_a_tiny_run_lowers_its_loss_and_explains_more_variance(tmp_path):
    write_folder(tmp_path, count=40)
    files = find_images([tmp_path])
    handle = tiny_handle("cls")
    short = TrainOptions(features=64, k=8, epochs=1, batch_tokens=64, lr=3e-3, seed=3)
    longer = TrainOptions(features=64, k=8, epochs=12, batch_tokens=64, lr=3e-3, seed=3)
    first = train_from_folder(handle, files[:32], 1, short)
    trained = train_from_folder(handle, files[:32], 1, longer, spill=str(tmp_path / "spill"))
    assert trained.info.training["mirrored"] is False
    mirrored = train_from_folder(handle, files[:32], 1, short, mirror=True)
    assert mirrored.info.training["mirrored"] is True
    assert mirrored.info.training_tokens == 2 * first.info.training_tokens
    cropped = train_from_folder(handle, files[:32], 1, short, mirror=True, crops=2)
    assert cropped.info.training["crops"] == 2 and cropped.info.training_tokens == 4 * first.info.training_tokens
    with pytest.raises(VitInspectError, match="--crops must be between 0 and 16"):
        train_from_folder(handle, files[:32], 1, short, crops=17)
    losses = trained.info.training["epoch_loss"]
    assert losses[-1] < 0.7 * losses[0]
    assert trained.info.training["dead_strategy"].startswith("AuxK")
    again = train_from_folder(handle, files[:32], 1, longer)
    assert torch.equal(again.W_enc, trained.W_enc)  # seeded
    quality = []
    for sae, name in ((first, "first"), (trained, "trained")):
        path = tmp_path / f"{name}.safetensors"
        save_with_metrics(sae, path, None)
        quality.append(evaluate_sae(handle, path, files[32:], sae=sae))
    assert quality[1].variance_explained > quality[0].variance_explained + 0.05
    assert quality[1].l0 <= 8 and quality[1].images == 8 and 0 <= quality[1].dead_fraction <= 1


def test_the_prefix_weight_trades_patch_error_for_class_token_error(tmp_path):
    write_folder(tmp_path, count=24)
    files, handle = find_images([tmp_path]), tiny_handle("cls")
    errors = {}
    for weight in (1.0, 200.0):
        options = TrainOptions(features=16, k=2, epochs=4, batch_tokens=32, lr=3e-3, seed=1, prefix_weight=weight)
        sae = train_from_folder(handle, files, 1, options)
        assert sae.info.training["prefix_weight"] == weight
        captured = []
        with torch.no_grad(), block_output(handle, 1, captured.append):
            handle.forward(torch.cat([handle.preprocess.apply(Image.open(f).convert("RGB"))[0] for f in files]))
        tokens = captured[0]  # (B, n, d), the class token first
        squared = ((tokens - reconstruct(tokens, sae)) ** 2).sum(-1)  # (B, n)
        errors[weight] = (float(squared[:, 0].sum() / (tokens[:, 0] ** 2).sum()),
                          float(squared[:, 1:].sum() / (tokens[:, 1:] ** 2).sum()))
    assert errors[200.0][0] < 0.5 * errors[1.0][0]  # the class token, relative error
    assert errors[200.0][1] > errors[1.0][1]  # the patches pay for it
    patches_only = train_from_folder(handle, files, 1, TrainOptions(features=16, k=2, epochs=1, prefix_weight=9),
                                     "patches")
    assert patches_only.info.training["prefix_weight"] == 1.0  # no prefix tokens to weigh
    with pytest.raises(VitInspectError, match="--prefix-weight must be above 0"):
        TrainOptions(features=16, k=2, prefix_weight=0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(VitInspectError, match="--prefix-weight must be above 0"):
            TrainOptions(features=16, k=2, prefix_weight=bad)
        with pytest.raises(VitInspectError, match="the learning rate must be positive"):
            TrainOptions(features=16, k=2, lr=bad)


def test_a_layer_the_model_lacks_is_a_sentence(tmp_path):
    write_folder(tmp_path, count=1)
    with pytest.raises(VitInspectError, match="--layer must be a block of 'tiny-cls': 0 to 1"):
        train_from_folder(tiny_handle("cls"), find_images([tmp_path]), 2, TrainOptions(features=8, k=2))


def test_a_buffer_smaller_than_two_batches_is_a_sentence_before_the_activation_pass(tmp_path):
    write_folder(tmp_path, count=2)
    handle, width = tiny_handle("cls"), tiny_handle("cls").embed_dim
    needed = 2 * 32 * 4 * (width + 1)  # two batches of 32 float32 tokens, each with its weight
    check_buffer(TrainOptions(features=8, k=2, batch_tokens=32, buffer_bytes=needed), width)  # fits exactly
    small = TrainOptions(features=8, k=2, batch_tokens=32, buffer_bytes=needed - 1)
    with pytest.raises(VitInspectError, match=f"two batches of 32 tokens of width {width}: at least 1 MiB"):
        check_buffer(small, width)
    spill = tmp_path / "spill"
    with pytest.raises(VitInspectError, match="must hold two batches"):
        train_from_folder(handle, find_images([tmp_path]), 0, small, spill=str(spill))
    assert not spill.exists()  # refused before the pass wrote a token
    with pytest.raises(VitInspectError, match="--buffer-mib must be positive"):
        TrainOptions(features=8, k=2, buffer_bytes=0)


def test_a_buffer_that_cannot_be_allocated_is_a_sentence(tmp_path):
    np.save(tmp_path / "tokens-0.npy", np.zeros((4, 8), np.float32))
    with pytest.raises(VitInspectError, match="could not be allocated; give a smaller --buffer-mib"):
        next(shuffled_batches([tmp_path / "tokens-0.npy"], 8, 2, 2 ** 62, np.random.default_rng(0)))

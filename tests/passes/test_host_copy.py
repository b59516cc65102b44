"""Large copies to the host through one page-locked buffer: the values of `.cpu()`, in memory of their own."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer

from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.passes import host_copy
from vit_inspect.passes.pipeline import analyze_image

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_checks.sh runs it on one)")


@pytest.fixture(autouse=True)
def fresh_buffer(monkeypatch):
    """Each test starts without the process's buffer and leaves the module's as it was."""
    monkeypatch.setattr(host_copy, "_buffer", None)


def test_a_tensor_on_the_cpu_is_given_as_it_is():
    tensor = torch.arange(2 * host_copy.MIN_BYTES // 4, dtype=torch.float32)
    assert host_copy.to_host(tensor) is tensor  # what `.cpu()` gives: no copy


def test_the_staged_copy_is_the_tensors_values_in_memory_of_its_own():
    """Through the shared buffer (here not page-locked): the values, in fresh memory, the buffer grown once and
    reused for a smaller copy; a later copy leaves an earlier result as it was."""
    first = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    kept = host_copy._staged(first, pinned=False)
    np.testing.assert_array_equal(kept.numpy(), first.numpy())
    assert kept.data_ptr() != host_copy._buffer.data_ptr() and kept.data_ptr() != first.data_ptr()
    larger = torch.full((5, 7), -3, dtype=torch.int64)
    np.testing.assert_array_equal(host_copy._staged(larger, pinned=False).numpy(), larger.numpy())
    buffer = host_copy._buffer
    assert buffer.numel() == larger.numel() * 8
    smaller = torch.ones(2, dtype=torch.float32)
    np.testing.assert_array_equal(host_copy._staged(smaller, pinned=False).numpy(), [1.0, 1.0])
    assert host_copy._buffer is buffer  # reused
    np.testing.assert_array_equal(kept.numpy(), first.numpy())  # untouched by the copies after it


@CUDA
def test_a_large_cuda_tensor_comes_back_equal_and_pageable():
    device_tensor = torch.randn(host_copy.MIN_BYTES // 2 + 7, device="cuda").to(torch.float16)  # over MIN_BYTES
    host = host_copy.to_host(device_tensor)
    assert host.device.type == "cpu" and not host.is_pinned() and host_copy._buffer.is_pinned()
    torch.testing.assert_close(host, device_tensor.cpu(), rtol=0, atol=0)


@CUDA
def test_copies_from_two_threads_each_get_their_own_values():
    tensors = [torch.full((host_copy.MIN_BYTES // 4 + i,), float(i), device="cuda") for i in range(4)]
    results = {}

    def copy(i):
        for _ in range(5):
            results[i] = host_copy.to_host(tensors[i])
    threads = [threading.Thread(target=copy, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, tensor in enumerate(tensors):
        assert results[i].shape == tensor.shape and bool((results[i] == i).all())


@CUDA
@pytest.mark.parametrize("kept", [True, False], ids=["kept-maps", "qk-store"])
def test_the_pass_through_the_buffer_equals_the_pass_through_cpu(kept, monkeypatch):
    """Every store copy of a pass on the GPU through the page-locked buffer (bound lowered to 0) gives the arrays
    the same pass gives through `.cpu()` (bound above every copy)."""
    from vit_inspect.passes import attention_store, spill

    if not kept:
        monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
        monkeypatch.setattr(spill, "shared_folder", lambda: None)  # and no automatic spill
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=10).eval()
    handle = handle_from_timm(model, name="tiny", device="cuda", input_size=(32, 32))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8))
    monkeypatch.setattr(host_copy, "MIN_BYTES", 2 ** 40)
    plain = analyze_image(handle, image, relevance=False).attention_store
    monkeypatch.setattr(host_copy, "MIN_BYTES", 0)
    staged = analyze_image(handle, image, relevance=False).attention_store
    assert staged.mode == plain.mode == ("maps" if kept else "qk16")
    for name in ("queries", "keys", "maps"):  # two passes on a GPU: equal up to its run-to-run rounding
        a, b = getattr(plain, name), getattr(staged, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), rtol=1e-2, atol=1e-3, err_msg=name)
    assert host_copy._buffer is not None and host_copy._buffer.is_pinned()

"""Hugging Face ZeroGPU Spaces: the model pass, and only the pass, runs on a lent GPU.

A ZeroGPU Space gets a GPU only inside functions decorated with ``spaces.GPU`` (the `spaces` package on
PyPI, preinstalled on such Spaces). `gpu_pass` wraps `analyze_image` so that, when that package is
importable, each pass runs under the decorator with the model moved to the GPU for the call and back to
the CPU afterwards. The result is plain numpy arrays, so every redraw runs on the CPU without the GPU.
Without the package `gpu_pass` returns the pass unchanged: nothing differs from a CPU or CUDA server.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable

import torch

from vit_inspect.core.handle import ViTHandle


def spaces_gpu() -> Callable | None:
    """``spaces.GPU`` when the `spaces` package is importable (a ZeroGPU Space), else None."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return None
    return getattr(spaces, "GPU", None)


def gpu_pass(pass_fn: Callable, decorator: Callable | None = None, device: str = "cuda") -> Callable:
    """``pass_fn(handle, ...)`` run under ``decorator`` (default: `spaces_gpu()`) with ``handle.model`` on
    ``device`` for the duration of the call; ``pass_fn`` itself when there is no decorator.

    The model goes back to the handle's own device afterwards (also after an exception), and one lock
    keeps two passes from moving the same model at once. ``pass_fn`` must return no tensors.
    """
    decorator = spaces_gpu() if decorator is None else decorator
    if decorator is None:
        return pass_fn
    lock = threading.Lock()

    @decorator
    def on_gpu(handle: ViTHandle, *args, **kwargs):
        with lock:
            target = torch.device(device)
            handle.model.to(target)
            try:
                return pass_fn(dataclasses.replace(handle, device=target), *args, **kwargs)
            finally:
                handle.model.to(handle.device)

    @functools.wraps(pass_fn)
    def run(handle: ViTHandle, *args, **kwargs):
        return on_gpu(handle, *args, **kwargs)

    run.on_gpu = True  # type: ignore[attr-defined]
    return run

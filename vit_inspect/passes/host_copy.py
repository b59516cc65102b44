"""Large copies from a CUDA device to the host through one page-locked buffer.

`Tensor.cpu()` copies into fresh pageable host memory through the CUDA driver's own staging, and for a large array
the driver's host-side copy into pages touched for the first time bounds it: the pass's float16 queries and keys of
DINOv2-L/14 at 518 px (135 MB, `layer_stream.LayerStream.store`) came at 1.4–1.6 GB/s on an H100 machine
(BENCHMARKS.md, GPU). `to_host` lets the device write into page-locked memory at the link's speed, then copies that
into fresh memory with torch's threads: the result is ordinary host memory, as `.cpu()`'s is, and the page-locked
buffer, kept for the process and grown to the largest copy made, serves the next pass.
"""
from __future__ import annotations

import threading

import torch

MIN_BYTES = 4 * 2 ** 20  # smaller copies go through `Tensor.cpu()`: a few milliseconds at most, the staging no gain

_lock = threading.Lock()  # one buffer for the process: passes in other threads wait for the copy in flight
_buffer: torch.Tensor | None = None  # (bytes,) uint8, page-locked on a machine with CUDA


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the host in memory of its own: `Tensor.cpu()` for a tensor already there (the tensor itself),
    one under MIN_BYTES or one on a device other than CUDA; from a CUDA device, through the page-locked buffer."""
    if not tensor.is_cuda or tensor.numel() * tensor.element_size() < MIN_BYTES:
        return tensor.cpu()
    return _staged(tensor.contiguous(), pinned=True)


def _staged(tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
    """A contiguous ``tensor`` copied into the shared buffer (page-locked if ``pinned``; grown if too small, reused
    otherwise), its device's stream waited for, then copied out of it into fresh host memory."""
    global _buffer
    nbytes = tensor.numel() * tensor.element_size()
    with _lock:
        if _buffer is None or _buffer.numel() < nbytes:
            _buffer = None  # the smaller buffer goes before the larger one is made
            _buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        staged = _buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        staged.copy_(tensor, non_blocking=pinned)
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()
        out = torch.empty(tensor.shape, dtype=tensor.dtype)  # pageable, as `.cpu()` gives
        return out.copy_(staged)

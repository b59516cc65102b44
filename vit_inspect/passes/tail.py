"""The rest of a model after block l: blocks l+1 to the last, then the final norm and head, run on (B, N, D)
tokens of block l's output (for interventions on the residual stream, as CRAFT's h(·) on rebuilt activations).

The blocks are called one after another with the tokens alone (a timm block, a Hugging Face layer whose output
is a tuple, an OpenCLIP residual block), then the model's own head (the logit lens's readout,
`lens.lens_readouts`). Models whose blocks need more than the tokens (rotary position arguments, masks) are
found out by `model_tail`'s check, which replays one image and compares with the model's own logits.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from vit_inspect.core.errors import UnsupportedModelError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.linear import onednn_linears
from vit_inspect.passes.block_tokens import recording_blocks
from vit_inspect.passes.lens import lens_readouts

TOLERANCE = 1e-3  # largest |logit| difference, relative to the largest |logit|, the replay may show

Tail = Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) tokens after block l -> (B, num_classes) logits


def run_tail(handle: ViTHandle, layer: int, read: Callable[[torch.Tensor], torch.Tensor],
             tokens: torch.Tensor) -> torch.Tensor:
    """(B, N, D) tokens of block ``layer``'s output -> (B, num_classes) logits through the later blocks and
    ``read`` (the final norm and head)."""
    x = tokens
    for block in handle.blocks[layer + 1:]:
        out = block(x)
        x = out[0] if isinstance(out, tuple) else out
    return read(x)


def model_tail(handle: ViTHandle, layer: int, pixels: torch.Tensor) -> Tail:
    """The rest of the model after 0-based block ``layer`` as a function of that block's (B, N, D) output
    tokens, checked on ``pixels`` (1, 3, H, W): the tail of the model's own tokens must give the model's own
    logits (within `TOLERANCE`); on the CPU its linear layers run through oneDNN as the handle's forward does, else an `UnsupportedModelError` (a model without a head, or whose blocks
    cannot be called on tokens alone)."""
    read = lens_readouts(handle).get("readout")
    if read is None:
        raise UnsupportedModelError(f"{handle.name!r} has no classification head vit_inspect can read, so no class "
                                    "logit to explain.")
    with torch.no_grad(), recording_blocks(handle, [layer]) as seen:
        logits = handle.forward(pixels).float()
        try:
            replayed = run_tail(handle, layer, read, seen[layer]).float()
        except (TypeError, RuntimeError):
            replayed = None
    if replayed is None or replayed.shape != logits.shape or \
            (replayed - logits).abs().max() > TOLERANCE * max(1.0, float(logits.abs().max())):
        raise UnsupportedModelError(f"The blocks after block {layer} of {handle.name!r} cannot be run on its tokens "
                                    "alone, so concepts cannot be removed there.")

    def tail(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if handle.device.type == "cpu":
                with onednn_linears(handle.model):
                    return run_tail(handle, layer, read, tokens.to(handle.device))
            return run_tail(handle, layer, read, tokens.to(handle.device))
    return tail

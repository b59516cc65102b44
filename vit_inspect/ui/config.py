"""How the server runs (`AppConfig`) and the launch arguments that bound what it holds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from vit_inspect.core.handle import DEFAULT_MODEL
from vit_inspect.core.images import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, ImageLimits
from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET
from vit_inspect.ui.model_cache import DEFAULT_CACHE_SIZE
from vit_inspect.ui.request_guard import RequestGuard, body_limit
from vit_inspect.ui.session_store import DEFAULT_BUDGET

ASSETS = Path(__file__).resolve().parents[2] / "assets"  # the example photos, beside the package
FIRST_IMAGE = ASSETS / "chelsea.png"  # what the page shows on load, so that its first view answers at once
SAE_FOLDER_ENV = "VIT_INSPECT_SAE_FOLDER"  # the operator's folder of SAE files the Features view lists
MAX_SAE_UPLOAD_MB = 16.0  # largest SAE file a web user may upload (one of 1536 features for DeiT-Ti: 2.4 MB)


@dataclass(frozen=True)
class AppConfig:
    """How the server runs; set from the command line."""

    model: str = DEFAULT_MODEL  # the model every session starts with
    weights: str | None = None  # its weights file; None: checkpoints/ first, then the hub
    device: str | None = None  # None: CUDA when available, else CPU
    model_file: str | None = None  # operator's hand-written model "FILE.py:FUNCTION" (then `model` is its name)
    zero_shot: tuple[str, ...] | None = None  # an OpenCLIP `model`'s zero-shot labels; None: the 1000 ImageNet classes
    templates: tuple[str, ...] | None = None  # their prompt templates, each with one {}; None: "a photo of a {}."
    cache_size: int = DEFAULT_CACHE_SIZE  # models held in memory at once
    max_upload_mb: float = DEFAULT_MAX_BYTES / 2**20  # largest upload Gradio accepts, MiB
    max_image_pixels: int = DEFAULT_MAX_PIXELS  # larger images are refused before decoding
    max_sessions: int = 100  # sessions whose results stay in memory; the oldest is dropped beyond this
    memory_budget: int = DEFAULT_BUDGET  # bytes of session results plus loaded models; LRU results dropped beyond
    spill_budget: int = DEFAULT_SPILL_BUDGET  # bytes of attention maps spilled to local disk (vit_inspect.passes.spill); 0: none
    session_ttl_s: float = 3600.0  # a session's results are dropped this long after their last update
    sae_folder: str | None = None  # SAE files offered by name in the Features view; None: uploads only
    max_sae_upload_mb: float = MAX_SAE_UPLOAD_MB  # largest SAE file a web user may upload, MiB
    first_image: str | None = str(FIRST_IMAGE) if FIRST_IMAGE.is_file() else None  # analysed on page load; None: none

    @property
    def limits(self) -> ImageLimits:
        return ImageLimits(max_pixels=self.max_image_pixels, max_bytes=int(self.max_upload_mb * 2**20))


def launch_limits(config: AppConfig) -> dict:
    """The `launch()` arguments that bound what one server holds: upload size, sessions in memory, and
    `RequestGuard` in front of every route (no file fetched from a URL, no request body or text beyond its
    bounds); and what a browser keeps: no run history (Gradio's records the inputs and outputs of the last 100
    events in the browser's storage and rewrites them all on every status message, which made it the largest
    cost in the browser of a new image, whose answer is followed by several redraws and checks)."""
    guard = Middleware(RequestGuard, max_body=body_limit(config.max_upload_mb))
    return dict(max_file_size=f"{config.max_upload_mb:g}mb", state_session_capacity=config.max_sessions,
                run_history=False, app_kwargs={"middleware": [guard]})


def with_launch_limits(blocks: gr.Blocks, config: AppConfig) -> gr.Blocks:
    """`blocks.launch(...)` with `launch_limits(config)` applied: the caller's own values win, and its own
    middleware runs inside `RequestGuard`. For code that imports `app.demo` and launches it itself."""
    launch = blocks.launch

    def launch_with_limits(*args, **kwargs):
        limits = launch_limits(config)
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = limits.pop("app_kwargs")["middleware"] + list(app_kwargs.get("middleware") or [])
        return launch(*args, **(limits | kwargs), app_kwargs=app_kwargs)

    blocks.launch = launch_with_limits
    return blocks

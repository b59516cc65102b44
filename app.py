"""vit_inspect's Gradio app: `python app.py` serves it on http://127.0.0.1:7860.

Gradio only: flags -> `AppConfig` -> `build_demo(config)` -> `gr.Blocks`. A new image runs one pass
(`analyze_image`: one forward, one backward) whose result is kept in the session's `gr.State`;
sliders, clicks and options redraw from it without calling the model. Models live in a bounded
`ModelCache` shared by all sessions and are loaded on first use, never at import.
"""
from __future__ import annotations

import argparse
import atexit
import logging
import math
import os
import signal
import sys
import threading

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import DEFAULT_MODEL
from vit_inspect.core.module_spec import model_file_name
from vit_inspect.core.open_clip_models import is_open_clip_name
from vit_inspect.core.prompts import DEFAULT_TEMPLATES, check_labels, read_labels
from vit_inspect.ui.common import own_upload_folder
from vit_inspect.ui.config import (
    SAE_FOLDER_ENV,
    AppConfig,
    launch_limits,
    with_launch_limits,
)
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.model_cache import DEFAULT_CACHE_SIZE, CacheKey, ModelCache
from vit_inspect.ui.view import READOUT  # noqa: F401  (the query choices, for API callers and tests)

log = logging.getLogger("vit_inspect.app")


if __name__ != "__main__":  # for importers (gradio's reload mode, tests); `python app.py` builds from its flags
    demo = with_launch_limits(build_demo(), AppConfig())


def parse_args(argv: list[str] | None = None) -> tuple[AppConfig, argparse.Namespace]:
    """Command-line flags -> the app's config and the server options (host, port, share)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    parser.add_argument("--weights", help="weights file for --model (.safetensors preferred)")
    parser.add_argument("--model-file", metavar="FILE.py:FUNCTION",
                        help="serve a hand-written ViT: imports FILE.py (runs its code) and calls FUNCTION() for "
                             "(model, ModuleSpec); replaces --model. Web users can never name a Python file.")
    parser.add_argument("--zero-shot", metavar="LABELS",
                        help="an OpenCLIP --model's zero-shot labels, comma-separated or a text file with one per "
                             "line (default: the 1000 ImageNet classes with OpenAI's templates, minutes on a CPU)")
    parser.add_argument("--templates", help="'|'-separated templates for --zero-shot labels, each with one {} "
                                            "(default 'a photo of a {}.')")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to serve on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also serve through a temporary gradio.live link")
    parser.add_argument("--cache-size", type=int, default=DEFAULT_CACHE_SIZE, help="models kept in memory at once")
    parser.add_argument("--max-upload-mb", type=float, default=AppConfig.max_upload_mb,
                        help=f"largest file an upload may be, MiB (default {AppConfig.max_upload_mb:g})")
    parser.add_argument("--max-image-pixels", type=int, default=AppConfig.max_image_pixels,
                        help=f"largest image, width x height, refused before decoding (default {AppConfig.max_image_pixels:,})")
    parser.add_argument("--memory-budget", type=float, default=AppConfig.memory_budget / 2 ** 30,
                        help="GiB of session results plus loaded models; the least recently used results are "
                             f"dropped beyond this (default {AppConfig.memory_budget / 2 ** 30:g})")
    parser.add_argument("--spill-budget", type=float, default=AppConfig.spill_budget / 2 ** 30,
                        help="GiB of local disk for the attention maps of models whose maps are dear to rebuild "
                             "(heads x N >= 0.015 D^2: DeiT-Ti at 224, DINOv2 at 518 px), read by redraws instead of "
                             "rebuilt; the least recently read "
                             f"are dropped beyond this; 0 turns it off (default {AppConfig.spill_budget / 2 ** 30:g})")
    parser.add_argument("--max-sessions", type=int, default=AppConfig.max_sessions,
                        help=f"sessions kept in memory; the oldest is dropped beyond this (default {AppConfig.max_sessions})")
    parser.add_argument("--sae-folder", default=os.environ.get(SAE_FOLDER_ENV),
                        help="folder of SAE files (.safetensors) the Features view offers by name "
                             f"(default: ${SAE_FOLDER_ENV}; none: uploads only)")
    parser.add_argument("--max-sae-upload-mb", type=float, default=AppConfig.max_sae_upload_mb,
                        help=f"largest SAE file a web user may upload (default {AppConfig.max_sae_upload_mb:g})")
    args = parser.parse_args(argv)
    try:
        model = model_file_name(args.model_file) if args.model_file else args.model
    except VitInspectError as exc:
        parser.error(str(exc))
    for option, value in (("--max-upload-mb", args.max_upload_mb), ("--max-image-pixels", args.max_image_pixels),
                          ("--memory-budget", args.memory_budget), ("--max-sessions", args.max_sessions),
                          ("--cache-size", args.cache_size), ("--max-sae-upload-mb", args.max_sae_upload_mb)):
        if not (math.isfinite(value) and value > 0):  # a bound must bound: NaN, inf, 0 and below are refused
            parser.error(f"{option} must be a positive finite number, got {value!r}.")
    if not math.isfinite(args.spill_budget):  # at most 0 turns spilling off; NaN or inf is a typing mistake
        parser.error(f"--spill-budget must be a finite number of GiB (0 turns it off), got {args.spill_budget!r}.")
    if (args.zero_shot or args.templates) and not is_open_clip_name(model):
        parser.error("--zero-shot and --templates are for an OpenCLIP --model (open_clip:ARCH[:TAG]).")
    try:
        zero_shot = None if args.zero_shot is None else check_labels(
            read_labels(args.zero_shot), args.templates.split("|") if args.templates else DEFAULT_TEMPLATES)
    except VitInspectError as exc:
        parser.error(str(exc))
    config = AppConfig(model=model, weights=args.weights, device=args.device, model_file=args.model_file,
                       zero_shot=None if zero_shot is None else zero_shot[0],
                       templates=None if zero_shot is None else zero_shot[1],
                       cache_size=args.cache_size,
                       max_upload_mb=args.max_upload_mb, max_image_pixels=args.max_image_pixels,
                       max_sessions=args.max_sessions, memory_budget=int(args.memory_budget * 2 ** 30),
                       spill_budget=int(max(0.0, args.spill_budget) * 2 ** 30), sae_folder=args.sae_folder,
                       max_sae_upload_mb=args.max_sae_upload_mb)
    return config, args


def preload(cache: ModelCache, config: AppConfig) -> None:
    """Load the default model in the background while the server starts; a page opened meanwhile waits
    for it with a progress bar, and a failure is explained on the page (and printed here)."""
    try:
        Inspector(config, cache).handle(CacheKey.of(config.model, config.weights, config.device))
    except (VitInspectError, ValueError) as exc:
        print(f"warning: {exc}")


def stop_like_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (`docker stop`, a Space restarting, systemd, `kill`) stops the server as Ctrl-C does:
    Gradio closes it and the process exits normally, so its `atexit` hooks remove the private upload
    folder and the spill folders. Python's default for SIGTERM ends the process at once, without them."""
    raise KeyboardInterrupt


def exit_cleanly() -> None:
    """End a stopped server with status 0: the `atexit` hooks run (the upload and spill folders go), the
    output is flushed, and the process ends without the C++ libraries' static destructors. Run through
    them, interpreter exit aborted now and then after a stop ("terminate called without an active
    exception", status -6, about one stop in ten here, with only the main thread left), so a Space or
    `docker stop` saw a crash after the folders were already removed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    config, args = parse_args()
    signal.signal(signal.SIGTERM, stop_like_ctrl_c)
    own_upload_folder()
    cache = ModelCache(config.cache_size)
    threading.Thread(target=preload, args=(cache, config), daemon=True).start()  # the port opens at once
    try:
        build_demo(config, cache).launch(server_name=args.host, server_port=args.port, share=args.share,
                                         **launch_limits(config))
    except KeyboardInterrupt:  # before the server ran (Gradio's own wait handles it once it runs)
        pass
    exit_cleanly()


if __name__ == "__main__":
    main()

"""What every tab of the app shares: how its pictures are shown and its events run, errors as sentences,
the upload folder a client's file may name, and model names as web users see them (never a server folder)."""
from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

import gradio as gr
import numpy as np
from gradio import processing_utils
from gradio import utils as gradio_utils
from gradio.data_classes import ImageData

from vit_inspect.core.errors import InputError, VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import DEFAULT_MAX_BYTES
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots.canvas import encode_png
from vit_inspect.ui.style import PICTURE, PROGRESS_SLOT
from vit_inspect.ui.untrusted import client_file, redact_paths

log = logging.getLogger("vit_inspect.app")

# Options of an output picture: a map over the image (captioned in the picture), and a figure (titled in it).
# Neither shows Gradio's label, which would sit over the picture's top-left corner.
# No container either: its border and padding would make the browser shrink a picture drawn at the column's width.
# Its buttons sit in a row above it (`style.PICTURE`).
MAP_OUT = MappingProxyType(dict(interactive=False, format="png", show_label=False, container=False,
                                buttons=["download", "fullscreen"], elem_classes=[PICTURE]))
FIGURE_OUT = MAP_OUT
# How events run. Model passes run one at a time on one queue (hooks are per model); redraws in parallel.
MODEL_PASS = MappingProxyType(dict(concurrency_id="model_pass", concurrency_limit=1))
DRAW_CONCURRENCY = 4
# Handlers get the client's raw values and check them themselves (vit_inspect.ui.untrusted), so that a NaN,
# a string or a forged file reference gets a sentence rather than Gradio's bare "Error".
RAW = MappingProxyType(dict(preprocess=False))


@contextmanager
def _no_stub_files():
    """Gradio's component metaclass writes a ``.pyi`` stub beside the module of every Component subclass
    it sees (`component_meta.create_or_modify_pyi`, for authors of custom components); an installed
    library must not write into its own package, so subclasses here are defined without it."""
    from gradio import component_meta

    write_stub = component_meta.create_or_modify_pyi
    component_meta.create_or_modify_pyi = lambda *args, **kwargs: None
    try:
        yield
    finally:
        component_meta.create_or_modify_pyi = write_stub


with _no_stub_files():
    class OutputImage(gr.Image):
        """An output `gr.Image` whose uint8 numpy pictures are sent as PNG at zlib level `plots.canvas.PNG_LEVEL`.

        Gradio encodes a numpy output at PIL's default level 6: ≈ 22 ms of a DeiT-Ti slider redraw whose
        drawing takes ≈ 2.5 ms (bench/bench_render.py). The file goes into Gradio's own cache the way its
        encoder puts it there (`processing_utils.save_bytes_to_cache`, a folder named by the content's hash);
        anything else (other dtypes, another format, a watermark) takes Gradio's own path. The browser draws
        it with Gradio's image component.

        The same picture drawn again (a redraw that changes nothing) names the same file, which a browser may be
        reading at that moment. So a file already there is never rewritten, and a new one appears whole, under
        its name, by a rename (`cache_png`): a reader that measured a half-written file would otherwise be sent
        more bytes than it announced, and the image would break."""

        def get_block_name(self) -> str:
            return "image"

        def postprocess(self, value):
            if (isinstance(value, np.ndarray) and value.dtype == np.uint8 and self.format == "png"
                    and getattr(getattr(self, "watermark", None), "watermark", None) is None
                    and (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (3, 4)))):
                path = cache_png(encode_png(value), self.GRADIO_CACHE)
                return ImageData(path=str(path), orig_name=path.name)
            return super().postprocess(value)


def cache_png(data: bytes, cache_dir: str | Path) -> Path:
    """`data` as ``image.png`` in Gradio's cache, in the folder Gradio names by the content's hash
    (`processing_utils.hash_bytes`). Written once: under a name of its own, then renamed into place, so the
    file under the served name is always complete; a file already there has these bytes and is kept, touched
    so that the server's `delete_cache`, which ages files by their change time, counts from this use."""
    folder = Path(cache_dir) / processing_utils.hash_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / "image.png").resolve()
    try:
        os.utime(path)
    except FileNotFoundError:
        handle, partial = tempfile.mkstemp(dir=folder, prefix=".image.", suffix=".part")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(partial, path)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return path


def progress_slot(elem_id: str) -> gr.Markdown:
    """An empty line where an action's progress bar shows while it runs (its event's ``show_progress_on``):
    Gradio draws the bar over the components it is shown on, and drawn over text it hides what the text says.
    The slot takes no room while nothing runs (`style.PROGRESS_SLOT`)."""
    return gr.Markdown("", elem_id=elem_id, elem_classes=[PROGRESS_SLOT])


def public_message(exc: VitInspectError) -> str:
    """What a web user sees of a library error: its public sentence, with any server path cut to its
    last component (the operator's console and the CLI keep `str(exc)`, the full detail)."""
    return redact_paths(exc.public)


def shows_errors(fn):
    """Handlers turn the library's exceptions into a gr.Error with their public sentence. Anything
    else is a bug: the user gets a sentence, the operator's console the traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except VitInspectError as exc:
            log.info("%s refused: %s", fn.__name__, exc)
            raise gr.Error(public_message(exc), print_exception=False) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"Something went wrong on the server while handling this request "
                           f"({fn.__name__.replace('_', ' ')}); it has been logged. Please try again "
                           "or with other settings.", print_exception=False) from None
    return wrapper


REFUSED = "⚠️ "  # how a refusal or failure starts where the page shows it (`says_refusals`)


def says_refusals(fn, note, *, appended=None, also=None):
    """``fn``, a handler, whose refusal or failure becomes one sentence in the Markdown ``note`` (one of the
    event's outputs), every other output left as it was. An event whose handler raises gets Gradio's "Error"
    badge over every one of its outputs (maps, top-5, status line) and its sentence in a toast that vanishes:
    this way the sentence stays where the user looks, and every panel keeps its last result.

    Without ``appended`` the handler writes ``note`` itself when it succeeds. With it, ``note`` follows the
    handler's own outputs (whose values it returns as a tuple, or as one value), and a success writes ``appended``
    there ("" clears an earlier refusal, ``gr.skip()`` leaves the note as it is); a tuple gives the values of
    ``note`` and of the outputs after it. ``also(*args, **kwargs)`` gives such outputs' values on a refusal (the
    model picker put back to the model in use). `shows_errors` words the sentence."""
    guarded = shows_errors(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = guarded(*args, **kwargs)
        except gr.Error as exc:
            return {note: REFUSED + exc.message} | (also(*args, **kwargs) if also is not None else {})
        if appended is None:
            return result
        extra = appended if isinstance(appended, tuple) else (appended,)
        return (*result, *extra) if isinstance(result, tuple) else (result, *extra)  # a list is one File's value
    return wrapper


@contextmanager
def still_showing(words: str):
    """A refusal (a library error) raised inside gets ``words`` after its sentence, "(... still ...)": what the
    outputs its note describes still show, since the page leaves them as they were (`says_refusals`)."""
    try:
        yield
    except VitInspectError as exc:
        if not words:
            raise
        raise InputError(f"{exc} ({words}.)", public=f"{exc.public} ({words}.)") from None


def upload_folders() -> list[str]:
    """The only folders a client's file reference may point into: Gradio's upload/cache folder, where
    Gradio puts uploads and its copies of the example images."""
    return [gradio_utils.get_upload_folder()]


def own_upload_folder() -> str:
    """Give this process a Gradio folder of its own, unless the operator chose one (GRADIO_TEMP_DIR).

    Gradio keeps uploads and every image it serves in one folder, by default /tmp/gradio for all Gradio
    processes of the machine, each file named by a hash of its content (so the same image drawn by two
    servers is one file); and a server built with `delete_cache` deletes every file it handed out when it
    stops, whatever its age. So when another Gradio server on the machine stops, this one's links to the
    same images answer 403. A folder of its own also narrows what a client's file reference may name
    (`upload_folders`) to this server's files. Call it before building the Blocks: Gradio reads the folder
    when it builds and launches. The folder is removed when the process exits.
    """
    if not os.environ.get("GRADIO_TEMP_DIR"):
        folder = tempfile.mkdtemp(prefix="vit_inspect_gradio_")
        os.environ["GRADIO_TEMP_DIR"] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return gradio_utils.get_upload_folder()


def upload_source(payload: object, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str | bytes, str] | None:
    """(file path or bytes, file name) of a raw gr.Image value; None when the image was cleared.

    The image events skip Gradio's preprocessing so that `load_image`, not PIL inside Gradio,
    reads the upload and explains what is wrong with it. Gradio checks a path only when the payload
    carries its `meta` field, so every shape goes through the one gate, `client_file`.
    """
    return client_file(payload, upload_folders(), max_bytes)


def public_name(name: str) -> str:
    """A model name as web users see it: a folder on this server (only the operator's --model can be
    one) by its base name, anything else (timm name, hub id) as it is."""
    return Path(name).name if os.path.isabs(name) or os.path.isdir(name) else name


def names_python_file(name: str) -> bool:
    """Whether a model name from the page points at Python code ("x.py", "x.py:build"): always refused. Other
    names with a colon go to the library, which answers each with the sentence that fits it (an OpenCLIP name:
    loaded by the operator only; anything else: not a valid model name)."""
    return any(part.strip().lower().rstrip("/").endswith((".py", ".pyc", ".pyw", ".pyz")) for part in name.split(":"))


def weights_label(handle: ViTHandle) -> str:
    """Where the weights came from, without revealing server folders."""
    return public_name(handle.weights)


def describe(handle: ViTHandle, shown=None) -> str:
    """The status line: the model, its weights and device, its layers, heads, patches and grid; with ``shown``
    (the `TokenLayout` of the input shown), that input's own size and grid when they differ from the model's."""
    layout = handle.layout()
    prefix = ", ".join(layout.prefix_names()) or "none"
    grid = f"a {layout.grid_h}×{layout.grid_w} grid"
    if shown is not None and (shown.grid_h, shown.grid_w) != (layout.grid_h, layout.grid_w):
        height, width = shown.input_size
        grid = (f"a {layout.grid_h}×{layout.grid_w} grid at its own size; **this input: {height}×{width} pixels, "
                f"a {shown.grid_h}×{shown.grid_w} grid**")
    return (f"**Model** `{public_name(handle.name)}` · **weights** `{weights_label(handle)}` · **device** `{handle.device}`  \n"
            f"{handle.depth} layers × {handle.num_heads} heads · "
            f"{handle.patch_size[0]}×{handle.patch_size[1]}-pixel patches on {grid} · "
            f"prefix tokens: {prefix}"
            + ("" if handle.has_head else " · no classification head (no predictions or Grad-CAM)"))


def geometry_updates(handle: ViTHandle) -> list[dict]:
    """Ranges and defaults of layer, head, rollout range, Grad-CAM layer and patch boxes for a model."""
    last = handle.depth - 1
    layout = handle.layout()
    return [gr.update(maximum=last, value=last), gr.update(maximum=handle.num_heads - 1, value=0),
            gr.update(maximum=last, value=0), gr.update(maximum=last, value=last), gr.update(maximum=last, value=last),
            gr.update(maximum=layout.grid_h - 1), gr.update(maximum=layout.grid_w - 1)]


def prediction_labels(handle: ViTHandle, result: ImageAnalysis) -> dict | None:
    """The gr.Label value of a result's top 5."""
    if not result.probs.size:
        return None
    return {f"{t['label']} (#{t['index']})": t["prob"] for t in handle.top_labels(result.probs, 5)}


def shown_model(handle: ViTHandle) -> str:
    """Model and weights as every caption names them, without server folders."""
    return f"{public_name(handle.name)} ({weights_label(handle)})"


def download_folder() -> Path:
    """A new folder for one request's downloads, inside Gradio's folder (Gradio serves and cleans files found there)."""
    cache_dir = Path(gradio_utils.get_upload_folder())
    cache_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="vit_inspect_", dir=cache_dir))

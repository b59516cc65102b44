"""The gate for client values (vit_inspect.ui.untrusted), the image-format allow-list (no external
program ever runs), and the loader's refusals: NaN/Inf weights, unknown tags, missing hub weights
refused before any model is built, and error messages whose public text names no server path."""
from __future__ import annotations

import base64
import io
import os
import stat
import struct
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image

from vit_inspect.core.errors import (
    ImageError,
    InputError,
    ModelNotFoundError,
    WeightsError,
    WeightsNotFoundError,
)
from vit_inspect.core.images import ALLOWED_FORMATS, load_image
from vit_inspect.ui import untrusted
from vit_inspect.ui.untrusted import (
    NOT_AVAILABLE,
    client_file,
    client_path,
    data_url_bytes,
    finite_float,
    finite_int,
    plain_markdown,
    redact_paths,
    safe_name,
    text,
)


def png_bytes(colour=(200, 10, 10), size=(8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def folders(tmp_path):
    """An upload folder with one image, and a planted image and a secret outside it."""
    uploads, outside = tmp_path / "uploads", tmp_path / "outside"
    uploads.mkdir(), outside.mkdir()
    (uploads / "abc").mkdir()
    (uploads / "abc" / "cat.png").write_bytes(png_bytes())
    (outside / "planted.png").write_bytes(png_bytes((0, 0, 255)))
    (outside / "secret.txt").write_text("root:x:0:0")
    os.symlink(outside / "planted.png", uploads / "abc" / "link.png")  # a symlink inside pointing out
    os.symlink(outside, uploads / "dirlink")
    return uploads, outside


def test_only_files_inside_the_upload_folder_pass_the_gate(folders):
    uploads, outside = folders
    good = str(uploads / "abc" / "cat.png")
    assert client_path(good, [uploads]) == os.path.realpath(good)
    for shape in (good, {"path": good}, {"path": good, "meta": {"_type": "gradio.FileData"}, "orig_name": "x.png"}):
        source, name = client_file(shape, [uploads], 10**6)
        assert source == os.path.realpath(good) and name in ("cat.png", "x.png")
    refused = [str(outside / "planted.png"), str(outside / "secret.txt"), str(outside / "missing.png"),
               str(uploads / "abc" / "link.png"), str(uploads / "dirlink" / "planted.png"),
               str(uploads / "abc" / ".." / ".." / "outside" / "planted.png"), str(uploads), str(uploads / "abc"),
               str(uploads / "abc" / "missing.png"), "/etc/passwd", "../../../../etc/hostname", good + "\x00",
               "", "data:image/png;base64,AAAA", "/gradio_api/file=" + good]
    for path in refused:
        for shape in (path, {"path": path}, {"path": path, "meta": {"_type": "gradio.FileData"}}):
            with pytest.raises(InputError) as error:
                client_file(shape, [uploads], 10**6) if path else client_path(path, [uploads])
            assert str(error.value) == NOT_AVAILABLE, (path, str(error.value))  # the same answer for all
    for shape in ({"url": "http://example.com/cat.png"}, {"url": "/gradio_api/file=" + good}, 42, [good],
                  {"path": ["x"]}, {"path": 3}):
        with pytest.raises(InputError, match="not available"):
            client_file(shape, [uploads], 10**6)
    assert client_file(None, [uploads], 1) is None and client_file({}, [uploads], 1) is None


def test_data_urls_are_bounded_before_decoding(monkeypatch):
    data = png_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert client_file({"url": url, "orig_name": "../../x.png"}, [], 10**6) == (data, "x.png")
    assert data_url_bytes(url, len(data)) == data  # exactly at the limit
    decoded = []
    monkeypatch.setattr(untrusted.base64, "b64decode", lambda *a, **k: decoded.append(1) or b"")
    with pytest.raises(InputError, match="larger than the limit of 1 MiB"):
        data_url_bytes("data:image/png;base64," + "A" * (2 * 2**20), 2**20)
    assert decoded == []  # refused from its length, never decoded
    monkeypatch.undo()
    for bad, message in (("data:image/png;base64,@@@@", "not valid base64"), ("data:image/png;base64,AAA", "base64"),
                         ("data:image/png,%89PNG", "not a base64 data URL"), ("data:;base64", "not a base64")):
        with pytest.raises(InputError, match=message):
            data_url_bytes(bad, 10**6)


def test_client_file_names_are_plain_base_names():
    assert safe_name("../../etc/passwd") == "passwd"
    assert safe_name("C:\\Users\\me\\cat.png") == "cat.png"
    assert safe_name("a\x00b\nc.png") == "a_b_c.png"
    assert safe_name("x" * 500 + ".png").endswith(".png") and len(safe_name("x" * 500 + ".png")) <= 120
    assert safe_name(None) == safe_name("") == safe_name("..") == "image"
    assert safe_name({"a": 1}, "file 3") == "file 3"
    # invisible and bidirectional characters are dropped: "\u202egnp.exe" shows as "exe.png"
    assert safe_name("cat\u202egnp.exe") == "catgnp.exe"
    assert safe_name("\u2066a\u200bb\u2069\ufeff\u00ad.png") == "ab.png"
    assert safe_name("a\u2028b\u2029c\ud800\ue000.png") == "abc.png"  # separators, a lone surrogate, private use
    assert safe_name("a\x85b\x9bc.png") == "a_b_c.png"  # C1 controls, as the C0 ones
    assert safe_name("\u202e\u200b.png") == "png" and safe_name("\u202e\u200b") == "image"
    assert safe_name("café 猫.png") == "café 猫.png"  # letters of any script stay


def test_a_clients_name_shows_as_it_is_in_markdown():
    assert plain_markdown("[x](javascript:y)<img src=z>*b*_i_.png") == (
        "\\[x\\]\\(javascript:y\\)\\<img src=z\\>\\*b\\*\\_i\\_.png")
    assert plain_markdown("chelsea.png") == "chelsea.png"


@pytest.mark.parametrize("value, expected", [
    (3, 3), (3.4, 3), ("7", 7), (" 2.6 ", 3), (None, 0), ("", 0), (True, 1),
    (float("inf"), 11), (float("-inf"), 0), (1e308, 11), (-5, 0), (np.float32(4.0), 4),
])
def test_finite_int_clamps_numbers(value, expected):
    assert finite_int(value, "Layer", 0, 11, default=0) == expected


@pytest.mark.parametrize("value, message", [
    (float("nan"), "not NaN"), ("nan", "not NaN"), ("abc", "not 'abc'"), ([1], "not a list"),
    ({"a": 1}, "not an object"), ("9" * 100, "not a long text"), ("1\x00", "not '1\\\\x00'"),
])
def test_finite_int_refuses_what_is_not_a_number(value, message):
    with pytest.raises(InputError, match=f"^Layer must be a number, {message}"):
        finite_int(value, "Layer", 0, 11, default=0)


def test_finite_values_out_of_range_can_be_refused_instead_of_clamped():
    with pytest.raises(InputError, match="between 16 and 100000, not inf"):
        finite_int(float("inf"), "The height", 16, 100_000, clamp=False)
    with pytest.raises(InputError, match="Give a value for The height"):
        finite_int(None, "The height", 16, 100_000, clamp=False)
    assert finite_float(0.99, "Discard ratio", 0, 0.95) == 0.95


def test_redact_paths_keeps_base_names_only():
    message = "put it at /root/work/checkpoints/deit.safetensors or 'google/vit-base' see https://x.org/a/b"
    assert redact_paths(message) == "put it at deit.safetensors or 'google/vit-base' see https://x.org/a/b"


# --------------------------------------------------------------------------------- image formats

EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n%%EndComments\n"
       b"newpath 0 0 moveto 16 0 lineto 16 16 lineto closepath fill\nshowpage\n%%EOF\n")
PS = b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 16 16\nshowpage\n"
PDF = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"


@pytest.fixture
def spawn_log(monkeypatch, tmp_path):
    """Records every attempt to start a process: a fake `gs` first on PATH that writes a marker, and
    subprocess.Popen, os.posix_spawn(p), os.exec* and os.system replaced by recorders."""
    calls: list[str] = []
    marker = tmp_path / "gs_ran"
    fake = tmp_path / "bin" / "gs"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    real_popen = subprocess.Popen

    class Recorder(real_popen):
        def __init__(self, args, *a, **k):
            calls.append(f"Popen {args}")
            super().__init__(args, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    for name in ("posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe", "system"):
        if hasattr(os, name):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, lambda *a, _n=name, _r=real, **k: calls.append(f"{_n} {a[:1]}") or _r(*a, **k))
    from PIL import EpsImagePlugin
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None, raising=False)  # let Pillow look for gs again
    return calls, marker


@pytest.mark.parametrize("name, data", [("drawing.eps", EPS), ("page.ps", PS), ("doc.pdf", PDF),
                                        ("eps_named.png", EPS), ("eps_named.jpg", EPS)])
def test_postscript_and_pdf_are_refused_and_start_no_process(spawn_log, tmp_path, name, data):
    calls, marker = spawn_log
    path = tmp_path / name
    path.write_bytes(data)
    for source in (data, path):
        with pytest.raises(ImageError, match="not an image format we can read"):
            load_image(source)
    assert calls == [] and not marker.exists()


def test_the_spawn_recorder_sees_pillows_ghostscript_call(spawn_log):
    """The recorder is not blind: Pillow's own EPS decoder, called directly, tries to run gs."""
    calls, marker = spawn_log
    with pytest.raises(Exception):
        Image.open(io.BytesIO(EPS)).load()
    assert calls or marker.exists()


def psd_bytes(width=6, height=4, colour=(10, 200, 30)) -> bytes:
    """A minimal RGB PSD (version 1, raw image data, no layers), written by hand."""
    header = b"8BPS" + struct.pack(">H6xHIIHH", 1, 3, height, width, 8, 3)
    sections = struct.pack(">I", 0) * 3  # colour mode data, image resources, layer and mask info: empty
    planes = b"".join(bytes([c]) * (width * height) for c in colour)
    return header + sections + struct.pack(">H", 0) + planes


def test_psd_is_read_as_its_flattened_image():
    rgb = np.asarray(load_image(psd_bytes()))
    assert rgb.shape == (4, 6, 3) and (rgb == (10, 200, 30)).all()
    assert "PSD" in ALLOWED_FORMATS and "EPS" not in ALLOWED_FORMATS


def test_a_null_byte_in_a_path_is_a_sentence():
    with pytest.raises(ImageError) as error:
        load_image("/tmp/cat\x00.png")
    assert "null" not in error.value.public and "/tmp" not in error.value.public


# ---------------------------------------------------------------------------------------- weights

def test_weights_with_nan_or_inf_are_refused(tmp_path):
    from safetensors.torch import save_file
    from support import make_tiny_timm

    from vit_inspect.core.weights import apply_state_dict, read_state_dict

    state = {k: v.clone().contiguous() for k, v in make_tiny_timm("cls").state_dict().items()}
    good = tmp_path / "good.safetensors"
    save_file(state, str(good))
    apply_state_dict(make_tiny_timm("cls", seed=1), read_state_dict(good), "good")  # a clean file loads
    for value in (float("nan"), float("inf"), float("-inf")):
        bad = dict(state)
        bad["blocks.1.attn.qkv.weight"] = bad["blocks.1.attn.qkv.weight"].clone()
        bad["blocks.1.attn.qkv.weight"][3, 5] = value
        path = tmp_path / "bad.safetensors"
        save_file(bad, str(path))
        with pytest.raises(WeightsError, match=r"weights contain NaN/Inf .*blocks\.1\.attn\.qkv\.weight"):
            read_state_dict(path)


def refuse_real_builds(monkeypatch) -> list:
    """Make timm.create_model fail the test if it builds a real model; a build on the meta device (the
    ViT check) holds no memory and is allowed. Returns the list of real builds (empty if none)."""
    import timm

    built = []
    def create_model(*args, **kwargs):
        if torch.get_default_device().type != "meta":
            built.append(args)
            pytest.fail("model built")
        raise RuntimeError("not built in this test")
    monkeypatch.setattr(timm, "create_model", create_model)
    return built


def test_nan_weights_refused_before_the_model_is_built(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from vit_inspect.core.load import load_model

    path = tmp_path / "nan.safetensors"
    save_file({"patch_embed.proj.weight": torch.full((4, 3, 16, 16), float("nan"))}, str(path))
    built = refuse_real_builds(monkeypatch)
    with pytest.raises(WeightsError, match="NaN/Inf"):
        load_model("deit_tiny_patch16_224", weights=path, device="cpu")
    assert built == []


@pytest.mark.parametrize("name", ["vit_base_patch16_224", "deit_small_patch16_224"])
def test_missing_hub_weights_offline_build_no_model_and_hide_server_paths(monkeypatch, tmp_path, name):
    from vit_inspect.core.load import load_model

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    built = refuse_real_builds(monkeypatch)
    with pytest.raises(WeightsNotFoundError) as error:
        load_model(name, device="cpu", checkpoint_dir=tmp_path)
    assert built == []  # nothing was built, so nothing is left in memory
    assert str(tmp_path / f"{name}.safetensors") in str(error.value)  # the operator learns where to put it
    assert error.value.public == (f"Weights for {name!r} are not available on this server (no network access to "
                                  "the Hugging Face hub and no local copy).")


def test_an_unknown_pretrained_tag_is_a_sentence():
    from vit_inspect.core.load import load_model

    with pytest.raises(ModelNotFoundError, match="'deit_tiny_patch16_224' has no pretrained tag 'no_such_tag'; "
                                                 "its tags are: fb_in1k"):
        load_model("deit_tiny_patch16_224.no_such_tag", device="cpu")


def test_a_local_hf_folder_is_named_by_its_base_name_in_public(tmp_path):
    from vit_inspect.core.load import load_model

    folder = tmp_path / "my_model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "resnet"}')
    with pytest.raises(Exception) as error:
        load_model(str(folder), device="cpu")
    assert str(folder) in str(error.value) and str(tmp_path) not in error.value.public
    assert "'my_model'" in error.value.public


def test_file_names_are_bounded_in_bytes_and_huge_integers_are_a_sentence():
    name = safe_name("猫の写真" * 22 + ".png")  # 92 characters, 268 UTF-8 bytes: too long for a file system's 255
    assert name == "猫の写真" * 9 + "猫の" + ".png" and len(name.encode("utf-8")) == 118
    assert safe_name("é" * 200) == "é" * 60  # no suffix: cut to 120 bytes
    with pytest.raises(InputError, match="Layer must be a number within range, not one of 401 digits"):
        finite_int(10 ** 400, "Layer", 0, 11)  # float() of it raised OverflowError, a traceback in the log


def test_text_is_trimmed_before_it_is_checked():
    """A pasted name with spaces and a line break around it is that name; a control character inside it, or
    a name too long, gets a sentence naming the real reason."""
    assert text("  deit_tiny_patch16_224\n", "The model name") == "deit_tiny_patch16_224"
    assert text(None, "The model name") == ""
    with pytest.raises(InputError, match="control character"):
        text("deit\x00tiny", "The model name")
    with pytest.raises(InputError, match=r"at most 20 characters \(it has 21\)"):
        text("x" * 21, "The model name", max_chars=20)

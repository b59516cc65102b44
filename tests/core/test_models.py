"""Loading: geometry read from the model, every token layout, HF models, weights files, errors."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support import (
    EXPECTED_PREFIX,
    TINY_TIMM,
    make_tiny_timm,
    offline_hub_cache,
    tiny_handle,
    tiny_hf,
)

from vit_inspect.core.errors import (
    ModelNotFoundError,
    UnsupportedModelError,
    WeightsError,
    WeightsNotFoundError,
)
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.core.load import load_model
from vit_inspect.core.weights import read_state_dict


def test_tiny_timm_geometry(tiny_kind):
    handle = tiny_handle(tiny_kind)
    kwargs, (height, width) = TINY_TIMM[tiny_kind]
    patch = kwargs["patch_size"]
    layout = handle.layout()
    assert handle.patch_size == (patch, patch)
    assert (layout.grid_h, layout.grid_w) == (height // patch, width // patch)
    assert handle.num_prefix_tokens == layout.num_prefix_tokens == EXPECTED_PREFIX[tiny_kind]
    assert handle.has_class_token == (tiny_kind != "gap")
    assert handle.num_dist_tokens == (1 if tiny_kind == "distilled" else 0)
    assert handle.num_reg_tokens == (4 if tiny_kind == "reg4" else 0)
    assert handle.no_embed_class == (tiny_kind in ("reg4", "no_embed_class"))
    assert handle.global_pool == ("avg" if tiny_kind == "gap" else "token")
    assert (handle.depth, handle.num_heads, handle.embed_dim) == (2, 2, 32)
    assert handle.labels == tuple(str(i) for i in range(10))
    assert handle.patch_embed_weight().shape == (32, 3, patch, patch)
    pos = handle.patch_pos_embed()
    assert pos.shape == (*handle.native_grid, 32)
    prefix = 0 if handle.no_embed_class else handle.num_prefix_tokens
    expected = handle.model.pos_embed[0, prefix:].detach().numpy().reshape(pos.shape)
    np.testing.assert_array_equal(pos, expected)


def test_nonsquare_input_interpolates_position_embeddings():
    handle = tiny_handle("cls")
    layout = handle.layout((32, 48))
    assert (layout.grid_h, layout.grid_w, layout.num_tokens) == (4, 6, 25)
    assert handle.patch_pos_embed((4, 6)).shape == (4, 6, 32)
    with torch.no_grad():
        logits = handle.forward(torch.randn(1, 3, 32, 48))
    assert logits.shape == (1, 10)


def test_hf_vit_geometry_and_labels():
    model = tiny_hf()
    model.config.id2label = {i: f"class{i}" for i in range(7)}
    handle = handle_from_hf(model, device="cpu")
    assert handle.family == "hf"
    assert (handle.patch_size, handle.native_grid, handle.num_prefix_tokens) == ((8, 8), (4, 4), 1)
    assert handle.labels == tuple(f"class{i}" for i in range(7))
    assert handle.preprocess.mean == (0.5, 0.5, 0.5)
    table = model.vit.embeddings.position_embeddings[0, 1:].detach().numpy()
    np.testing.assert_array_equal(handle.patch_pos_embed(), table.reshape(4, 4, 32))
    assert handle.patch_pos_embed((4, 6)).shape == (4, 6, 32)


def test_hf_deit_with_teacher_has_distillation_token():
    handle = handle_from_hf(tiny_hf(distilled=True), device="cpu")
    assert (handle.num_prefix_tokens, handle.num_dist_tokens, handle.has_class_token) == (2, 1, True)
    assert handle.patch_pos_embed().shape == (4, 4, 32)
    with torch.no_grad():
        assert handle.forward(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_hf_local_folder_loads(tmp_path):
    from transformers import ViTImageProcessor

    model = tiny_hf()
    model.save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    handle = load_model(str(tmp_path), device="cpu")
    assert handle.family == "hf" and handle.input_size == (32, 32)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(handle.forward(x), model(pixel_values=x).logits)


def test_explicit_safetensors_file_loads_exactly(tmp_path):
    source = make_tiny_timm("cls", seed=1)
    path = tmp_path / "w.safetensors"
    save_file(source.state_dict(), str(path))
    from vit_inspect.core.weights import apply_state_dict

    target = make_tiny_timm("cls", seed=2)
    apply_state_dict(target, read_state_dict(path), "w.safetensors")
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_nested_pth_state_dict_is_unwrapped(tmp_path):
    state = {k: v.clone() for k, v in make_tiny_timm("cls").state_dict().items()}
    path = tmp_path / "w.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}, path)
    loaded = read_state_dict(path)
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_integer_weights_are_refused_at_load_with_a_sentence(tmp_path):
    """A file whose weight matrices were cast to int8 used to load (the integers cast back to floats) and
    then fail inside the first image's pass; it is refused when the model loads."""
    import timm

    state = timm.create_model("test_vit", pretrained=False).state_dict()
    quantised = {k: (v / v.abs().max() * 127).round().to(torch.int8) if v.ndim >= 2 else v for k, v in state.items()}
    path = tmp_path / "int8.safetensors"
    save_file(quantised, str(path))
    with pytest.raises(WeightsError) as info:
        load_model("test_vit", weights=str(path), device="cpu")
    message = info.value.public
    assert "as int8" in message and "quantised weights are not supported" in message
    assert str(tmp_path) not in message


def test_key_mismatch_is_listed_readably(tmp_path):
    from vit_inspect.core.weights import apply_state_dict

    state = make_tiny_timm("cls").state_dict()
    state.pop("head.weight")
    state["extra.thing"] = torch.zeros(1)
    with pytest.raises(WeightsError) as info:
        apply_state_dict(make_tiny_timm("cls"), state, "w.safetensors")
    message = str(info.value)
    assert "1 missing key(s): head.weight" in message and "1 unexpected key(s): extra.thing" in message


def test_wrong_architecture_reports_shapes(tmp_path):
    from vit_inspect.core.weights import apply_state_dict

    state = make_tiny_timm("patch16").state_dict()
    with pytest.raises(WeightsError, match="wrong shape"):
        apply_state_dict(make_tiny_timm("cls"), state, "w")


class _Payload:
    """Unpickling this runs `exec`, which writes a marker file: the classic pickle attack."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def test_pickle_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"model": {"w": _Payload(str(marker))}}, f)
    with pytest.raises(WeightsError, match="Refused"):
        read_state_dict(path)
    with pytest.raises(WeightsError, match="Refused"):
        load_model("deit_tiny_patch16_224", weights=path, device="cpu")
    assert not marker.exists()


def test_truncated_and_empty_safetensors(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(make_tiny_timm("cls").state_dict(), str(path))
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(WeightsError, match="not a valid safetensors"):
        read_state_dict(path)
    empty = tmp_path / "e.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(WeightsError, match="empty"):
        read_state_dict(empty)


def _header_file(path: Path, header: bytes, length: int | None = None) -> Path:
    """A safetensors-shaped file: an 8-byte little-endian length, then `header` (no tensor data)."""
    path.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header)
    return path


def test_a_safetensors_header_is_bounded_before_any_tensor_is_read(tmp_path, monkeypatch):
    import safetensors.torch

    from vit_inspect.core import weights

    def never(*args, **kwargs):
        raise AssertionError("the tensors were read")

    four = tmp_path / "four.safetensors"
    save_file({f"t{i}": torch.full((2,), float(i)) for i in range(4)}, str(four), metadata={"by": "hand"})
    assert weights.check_safetensors_header(four) == 4  # "__metadata__" is not a tensor
    monkeypatch.setattr(weights, "MAX_TENSORS", 4)
    assert sorted(read_state_dict(four)) == ["t0", "t1", "t2", "t3"]
    monkeypatch.setattr(weights, "MAX_TENSORS", 3)
    monkeypatch.setattr(safetensors.torch, "load_file", never)
    with pytest.raises(WeightsError, match=r"'four.safetensors' lists 4 tensors, more than the 3"):
        read_state_dict(four)
    monkeypatch.setattr(weights, "MAX_TENSORS", 10_000)

    # the length is checked before the header is read: exactly the bound is read (and parsed), one more is not
    at_bound = b"{}" + b" " * (2 ** 20 - 2)  # JSON padded with spaces, as the format allows
    assert weights.check_safetensors_header(_header_file(tmp_path / "a.safetensors", at_bound)) == 0
    with pytest.raises(WeightsError, match=r"1,048,577-byte safetensors header, more than the 1,048,576"):
        read_state_dict(_header_file(tmp_path / "b.safetensors", at_bound + b" "))
    for name, data in [("short", b"\x02\x00\x00"), ("list", (2).to_bytes(8, "little") + b"[]"),
                       ("huge", (2 ** 64 - 1).to_bytes(8, "little") + b"{}"),  # a length past the file's end
                       ("pickle", pickle.dumps({"w": [1.0] * 100})),
                       ("cut", (9).to_bytes(8, "little") + b"{}"), ("bytes", (2).to_bytes(8, "little") + b"\xff\xfe")]:
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(data)
        with pytest.raises(WeightsError, match=f"'{name}.safetensors' is not a valid safetensors file"):
            read_state_dict(path)


def test_a_safetensors_file_of_many_tiny_tensors_is_refused_at_the_default_bound(tmp_path):
    many = tmp_path / "many.safetensors"
    save_file({f"t{i}": torch.zeros(1) for i in range(10_001)}, str(many))  # 0.7 MiB: any upload bound lets it in
    with pytest.raises(WeightsError, match=r"lists 10,001 tensors, more than the 10,000"):
        load_model("deit_tiny_patch16_224", weights=many, device="cpu")
    from support import DEIT_WEIGHTS

    from vit_inspect.core.weights import check_safetensors_header
    if DEIT_WEIGHTS.is_file():  # the real file, far inside both bounds
        assert check_safetensors_header(DEIT_WEIGHTS) == 152
        assert int.from_bytes(DEIT_WEIGHTS.read_bytes()[:8], "little") == 14_160


def test_missing_weights_names_the_file_to_provide(tmp_path):
    with pytest.raises(WeightsNotFoundError) as info:
        load_model("vit_small_patch16_224.dino", device="cpu", checkpoint_dir=tmp_path)
    assert str(tmp_path / "vit_small_patch16_224.dino.safetensors") in str(info.value)


def test_checkpoint_dir_file_is_used(tmp_path):
    source = make_tiny_timm("cls", seed=3)
    # a real timm architecture name, weights from a same-shaped file in checkpoint_dir
    from timm import create_model

    arch = create_model("vit_tiny_patch16_224", pretrained=False)
    save_file(arch.state_dict(), str(tmp_path / "vit_tiny_patch16_224.safetensors"))
    handle = load_model("vit_tiny_patch16_224", device="cpu", checkpoint_dir=tmp_path)
    assert handle.weights.endswith("vit_tiny_patch16_224.safetensors")
    assert torch.equal(handle.model.pos_embed, arch.pos_embed)
    del source


def test_the_default_checkpoint_folder_is_the_repositorys(monkeypatch, tmp_path):
    """Without $VIT_INSPECT_CHECKPOINTS the folder is checkpoints/ at the repository root, where README and
    checkpoints/README.md tell users to put weights; with it, that folder."""
    from support import REPO

    from vit_inspect.core.handle import default_checkpoint_dir

    monkeypatch.delenv("VIT_INSPECT_CHECKPOINTS", raising=False)
    assert default_checkpoint_dir() == REPO / "checkpoints"
    monkeypatch.setenv("VIT_INSPECT_CHECKPOINTS", str(tmp_path))
    assert default_checkpoint_dir() == tmp_path


@pytest.mark.parametrize("name, error", [
    ("resnet50", UnsupportedModelError),
    ("swin_tiny_patch4_window7_224", UnsupportedModelError),
    ("definitely_not_a_model", ModelNotFoundError),
    ("__import__('os').system('x')", ModelNotFoundError),
    ("../../etc", ModelNotFoundError),
])
def test_bad_model_names_give_clear_errors(name, error):
    with pytest.raises(error):
        load_model(name, pretrained=False, device="cpu", allow_local_dirs=False)


def test_a_non_vit_is_named_as_such_before_its_weights_are_looked_for(tmp_path):
    """Offline (conftest) and without its weights, a timm model that takes no ViT arguments is refused as
    not a ViT, not as missing weights (a Swin, which timm builds with them, is found out only once built)."""
    with pytest.raises(UnsupportedModelError, match="not a Vision Transformer"):
        load_model("resnet50", device="cpu", checkpoint_dir=tmp_path, allow_local_dirs=False)


@pytest.mark.parametrize("offline, endpoint", [(True, None), (False, "http://127.0.0.1:9")])
def test_windowed_attention_is_refused_before_any_weights_are_looked_for(monkeypatch, tmp_path, offline, endpoint):
    """A Swin is refused as windowed attention from its meta build, offline (HF_HUB_OFFLINE=1) or with a hub
    that does not answer (HF_ENDPOINT=http://127.0.0.1:9): neither the checkpoint folder, a weights file nor
    the hub is asked for anything."""
    from huggingface_hub import constants

    from vit_inspect.core import hub, timm_models

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    if endpoint is not None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    asked = []
    monkeypatch.setattr(hub, "hub_access", lambda name: asked.append(("hub", name)))
    monkeypatch.setattr(timm_models, "read_state_dict", lambda path: asked.append(("file", path)))
    (tmp_path / "swin_tiny_patch4_window7_224.safetensors").write_bytes(b"not read")
    for weights in (None, tmp_path / "swin_tiny_patch4_window7_224.safetensors"):
        with pytest.raises(UnsupportedModelError, match="'swin_tiny_patch4_window7_224' uses windowed attention"):
            load_model("swin_tiny_patch4_window7_224", weights, device="cpu", checkpoint_dir=tmp_path,
                       allow_local_dirs=False)
    assert asked == []


def test_unreachable_hub_id_is_a_clear_error():
    with pytest.raises(ModelNotFoundError, match="Hugging Face model config"):
        load_model("someone/not-a-cached-model", device="cpu")


def test_device_resolution():
    from vit_inspect.core.handle import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError):
        resolve_device("tpu:9")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")


def test_a_web_users_name_never_reads_a_server_folder(tmp_path, monkeypatch):
    """A name with a '/' from the page is a hub id: a folder of that name under the working directory (a
    Hugging Face model an operator keeps there) is not read, and its sentence names no server path."""
    from transformers import ViTConfig, ViTForImageClassification

    folder = tmp_path / "models" / "secret_vit"
    ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, image_size=32, patch_size=16)).save_pretrained(folder)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as refused:
        load_model("models/secret_vit", pretrained=False, device="cpu", allow_local_dirs=False)
    assert refused.value.public == "'models/secret_vit' is not a Hugging Face hub id this app loads."
    assert load_model("models/secret_vit", pretrained=False, device="cpu").num_heads == 2  # the operator's own path loads


def test_a_model_beyond_the_bound_or_unfit_weights_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    """A web user's timm name is built on the meta device first: a model larger than the server allows, or
    a weights file that does not fit it (68 bytes for ViT-L), is refused before real memory is taken."""
    import timm
    from safetensors.torch import save_file

    from vit_inspect.core.errors import ModelTooLargeError, WeightsError

    built = []
    real = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: built.append(torch.empty(0).device.type) or real(*a, **k))
    with pytest.raises(ModelTooLargeError) as refused:  # 304,326,632 parameters: 1.13 GiB in float32
        load_model("vit_large_patch16_224", pretrained=False, device="cpu", max_model_bytes=2 ** 30)
    assert str(refused.value).startswith("'vit_large_patch16_224' has 304 M parameters (1.1 GiB in float32), "
                                         "more than the 1.0 GiB this server allows one model")
    tiny = tmp_path / "tiny.safetensors"
    save_file({"x": torch.zeros(1)}, str(tiny))
    with pytest.raises(WeightsError, match="do not fit this architecture"):
        load_model("vit_large_patch16_224", weights=tiny, device="cpu")
    assert built == ["meta", "meta"]  # neither reached a real build
    handle = load_model("deit_tiny_patch16_224", pretrained=False, device="cpu", max_model_bytes=2 ** 30)
    assert handle.depth == 12 and built[-2:] == ["meta", "cpu"]  # 5.7 M parameters: built for real


def test_a_hugging_face_model_beyond_the_bound_is_refused_from_its_config(tmp_path, monkeypatch):
    """A Hugging Face id is sized from its config.json on the meta device before its weights are fetched:
    here the cache holds no weights at all, so reaching for them would be a WeightsError."""
    from transformers import ViTConfig

    from vit_inspect.core.errors import ModelTooLargeError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    large = ViTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      num_labels=1000, architectures=["ViTForImageClassification"])  # ViT-L/16: 304,326,632
    offline_hub_cache(tmp_path, "someone/large_vit", large)
    with pytest.raises(ModelTooLargeError) as refused:
        load_model("someone/large_vit", device="cpu", allow_local_dirs=False, max_model_bytes=2 ** 30)
    assert str(refused.value).startswith("'someone/large_vit' has 304 M parameters (1.1 GiB in float32), "
                                         "more than the 1.0 GiB this server allows one model")
    with pytest.raises(WeightsError):  # without the bound, the weights are looked for (and missing)
        load_model("someone/large_vit", device="cpu", allow_local_dirs=False)

    # The tiny ViT by hand: patch embedding 32*3*8*8 + 32 = 6,176; class token and 17 positions 32 + 544 = 576;
    # per layer 2 norms 128, q/k/v 3*(32*32 + 32) = 3,168, output 1,056, MLP 2,112 + 2,080: 8,544, twice 17,088;
    # final norm 64; head 32*7 + 7 = 231. 24,135 parameters, no buffers: 96,540 bytes in float32.
    folder = tmp_path / "tiny_vit"
    tiny_hf().save_pretrained(folder)
    with pytest.raises(ModelTooLargeError, match=r"^'tiny_vit' has 24,135 parameters \(0\.1 MiB in float32\), more than the 0\.1 MiB"):
        load_model(str(folder), device="cpu", max_model_bytes=96_539)
    assert load_model(str(folder), device="cpu", max_model_bytes=96_540).depth == 2


@pytest.mark.parametrize("settings, size", [
    ({"feature_extractor_type": "ViTFeatureExtractor", "size": 224, "do_resize": True}, (224, 224)),  # google/vit-*
    ({"image_processor_type": "ViTImageProcessor", "size": {"height": 384, "width": 384}, "resample": 3,
      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}, (384, 384)),
    ({"image_processor_type": "DeiTImageProcessor", "size": {"height": 256, "width": 256}, "do_center_crop": True,
      "crop_size": {"height": 224, "width": 224}, "resample": 3}, (224, 224)),
    ({"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256}, "do_center_crop": True,
      "crop_size": {"height": 224, "width": 224}, "image_mean": [0.485, 0.456, 0.406]}, (224, 224)),  # DINOv2's
    ({"image_processor_type": "BeitImageProcessorFast", "size": {"height": 160, "width": 160}, "resample": 2},
     (160, 160)),
    ({"do_resize": True, "size": {"height": 64, "width": 64}}, (64, 64)),  # no class named: the model type's own
], ids=["vit-legacy", "vit", "deit", "dinov2", "beit-fast", "unnamed"])
def test_hf_preprocessing_read_without_autoimageprocessor_matches_it(tmp_path, settings, size):
    """`_hf_processor` builds one of HF_IMAGE_PROCESSORS from the file's settings itself; the preprocessing
    read from it equals the one read from transformers' AutoImageProcessor for the same folder."""
    import json

    from transformers import AutoImageProcessor, ViTConfig, ViTModel

    from vit_inspect.core.hf_models import _hf_preprocess, _hf_processor

    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
                       patch_size=8)
    config.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
    model = ViTModel(config)
    ours = _hf_preprocess(model, _hf_processor(str(tmp_path), "m", config, {}), None)
    assert ours == _hf_preprocess(model, AutoImageProcessor.from_pretrained(str(tmp_path)), None)
    assert ours.input_size == size


def test_a_hf_config_dtype_does_not_change_the_float32_model(tmp_path):
    """A config's "dtype": "float64" doubled a random (and a downloaded) model's memory past what the bound counts."""
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8, dtype="float64").save_pretrained(tmp_path)
    handle = load_model(str(tmp_path), device="cpu", pretrained=False)
    assert {p.dtype for p in handle.model.parameters()} == {torch.float32}

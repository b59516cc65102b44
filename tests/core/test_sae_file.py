"""SAE files: the safetensors format's round trip and refusals, saev's format read without unpickling, and
pickled checkpoints refused."""
from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import save_file

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.sae_file import METADATA_KEY, SAEInfo, SparseAutoencoder, check_fits, save_sae
from vit_inspect.core.sae_load import load_sae

D, F = 6, 16


def random_sae(k: int = 3, normalised: bool = True) -> SparseAutoencoder:
    torch.manual_seed(0)
    info = SAEInfo(model="deit_tiny_patch16_224", layer=2, k=k, features=F, width=D, tokens="patches",
                   training_tokens=1234, training={"epochs": 2}, metrics={"held_out": {"variance_explained": 0.5}})
    return SparseAutoencoder(torch.randn(D, F), torch.randn(F), torch.randn(F, D), torch.randn(D), info,
                             torch.randn(D) if normalised else None, torch.tensor(2.0) if normalised else None)


def test_round_trip(tmp_path):
    sae = random_sae()
    save_sae(sae, tmp_path / "a.safetensors")
    back = load_sae(tmp_path / "a.safetensors")
    assert back.info == sae.info
    for name, tensor in sae.tensors().items():
        assert torch.equal(back.tensors()[name], tensor), name
    plain = random_sae(normalised=False)
    save_sae(plain, tmp_path / "b.safetensors")
    assert load_sae(tmp_path / "b.safetensors").input_mean is None


def _write(path, tensors, info: dict | None):
    metadata = None if info is None else {METADATA_KEY: json.dumps(info)}
    save_file(tensors, str(path), metadata=metadata)


def _info(**changes) -> dict:
    return {"model": "m", "layer": 1, "k": 2, "F": F, "d": D, **changes}


def _tensors(d: int = D, f: int = F) -> dict:
    return {"W_enc": torch.zeros(d, f), "b_enc": torch.zeros(f), "W_dec": torch.zeros(f, d), "b_dec": torch.zeros(d)}


@pytest.mark.parametrize("tensors, info, says", [
    (_tensors(), None, "not a vit_inspect SAE"),
    (_tensors(d=D + 1), _info(), "W_enc has shape (7, 16)"),
    ({**_tensors(), "W_dec": torch.zeros(D, F)}, _info(), "W_dec has shape (6, 16)"),
    ({k: v for k, v in _tensors().items() if k != "b_dec"}, _info(), "missing b_dec"),
    ({**_tensors(), "extra": torch.zeros(1)}, _info(), "unexpected extra"),
    (_tensors(), _info(k=F + 1), "k must be 1 to F"),
    (_tensors(), _info(F=2 ** 40), "features of width"),
    ({**_tensors(), "b_enc": torch.zeros(F, dtype=torch.int32)}, _info(), "stored as I32"),
    (_tensors(), {"model": "m"}, "damaged SAE metadata"),
])
def test_refusals_before_any_tensor_is_read(tmp_path, monkeypatch, tensors, info, says):
    path = tmp_path / "bad.safetensors"
    _write(path, tensors, info)

    def never(*args, **kwargs):
        raise AssertionError("a tensor was read before the header was checked")

    monkeypatch.setattr("safetensors.torch.load_file", never)
    with pytest.raises(WeightsError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_sae(path)


def test_an_sae_for_another_model_or_width_gets_a_sentence():
    sae = random_sae()
    check_fits(sae, "deit_tiny_patch16_224", depth=12, width=D)
    with pytest.raises(WeightsError, match="reads 6-wide tokens, but 'vit_base' has 768-wide"):
        check_fits(sae, "vit_base", depth=12, width=768)
    with pytest.raises(WeightsError, match="reads block 2, but 'tiny' has 2 blocks"):
        check_fits(sae, "tiny", depth=2, width=D)
    with pytest.raises(WeightsError, match="trained on 'deit_tiny_patch16_224', not on 'other'"):
        check_fits(sae, "other", depth=12, width=D)


def test_pickled_checkpoints_are_refused_with_the_way_to_convert_them(tmp_path):
    path = tmp_path / "prisma_sae.pt"
    torch.save({"W_enc": torch.zeros(2, 2)}, path)
    with pytest.raises(WeightsError, match="pickled checkpoint.*machine you trust.*save_sae") as caught:
        load_sae(path)
    assert str(tmp_path) not in caught.value.public


def write_saev(path, state: dict, header: dict) -> None:
    """saev's layout: one line of JSON, then torch.save of the state dict."""
    with open(path, "wb") as handle:
        handle.write((json.dumps(header) + "\n").encode())
        torch.save(OrderedDict(state), handle)


def saev_header(activation: str = "TopK", top_k: int = 4) -> dict:
    return {"schema": 2, "cfg": {"d_vit": D, "exp_factor": F // D if F % D == 0 else 2, "d_sae": F, "seed": 0,
                                 "activation": {"cls": activation, "params": {"top_k": top_k} if activation != "Relu"
                                                else {}}},
            "commit": "unknown", "lib": "1.0"}


def test_saev_format_is_read_without_unpickling(tmp_path, monkeypatch):
    torch.manual_seed(1)
    state = {"W_enc": torch.randn(D, F), "b_enc": torch.randn(F), "W_dec": torch.randn(F, D), "b_dec": torch.randn(D)}
    path = tmp_path / "sae.pt-free"
    write_saev(path, state, saev_header())
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads was called"))
    sae = load_sae(path, layer=5, model="clip")
    assert (sae.info.k, sae.info.features, sae.info.width, sae.info.layer, sae.info.source) == (4, F, D, 5, "saev")
    assert torch.equal(sae.W_enc, state["W_enc"]) and torch.equal(sae.W_dec, state["W_dec"])
    x = torch.randn(9, D)
    # saev's encoder: TopK(ReLU(x W_enc + b_enc)); ours subtracts b_dec first, with b_enc converted
    theirs = torch.relu(x @ state["W_enc"] + state["b_enc"])
    kept = theirs.topk(4, dim=-1)
    theirs = torch.zeros_like(theirs).scatter(-1, kept.indices, kept.values)
    ours = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
    kept = ours.topk(4, dim=-1)
    ours = torch.zeros_like(ours).scatter(-1, kept.indices, kept.values)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_saev_relu_is_top_f_and_batch_top_k_is_refused(tmp_path):
    state = {"W_enc": torch.zeros(D, F), "b_enc": torch.zeros(F), "W_dec": torch.zeros(F, D), "b_dec": torch.zeros(D)}
    write_saev(tmp_path / "relu", state, saev_header("Relu"))
    assert load_sae(tmp_path / "relu", layer=0).info.k == F
    write_saev(tmp_path / "batch", state, saev_header("BatchTopK"))
    with pytest.raises(WeightsError, match="'BatchTopK' activation"):
        load_sae(tmp_path / "batch", layer=0)
    with pytest.raises(WeightsError, match="do not record which block"):
        load_sae(tmp_path / "relu")
    write_saev(tmp_path / "wide", {**state, "W_enc": torch.zeros(D + 1, F)}, saev_header())
    with pytest.raises(WeightsError, match=r"W_enc has shape \(7, 16\)"):
        load_sae(tmp_path / "wide", layer=0)


class _Evil:
    def __reduce__(self):
        return (exec, ("open(__import__('os').environ['SAE_MARKER'], 'w').write('ran')",))


def test_saev_file_carrying_code_is_refused_and_the_code_never_runs(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("SAE_MARKER", str(marker))
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w") as archive:
        archive.writestr("sae/data.pkl", pickle.dumps(OrderedDict(W_enc=_Evil())))
    path = tmp_path / "evil"
    path.write_bytes((json.dumps(saev_header()) + "\n").encode() + body.getvalue())
    with pytest.raises(WeightsError, match="builtins.exec"):
        load_sae(path, layer=0)
    assert not marker.exists()
    path.write_bytes((json.dumps(saev_header()) + "\n").encode() + b"not a zip at all")
    with pytest.raises(WeightsError, match="unreadable"):
        load_sae(path, layer=0)


def test_saev_tensors_that_are_views_of_one_storage_are_read_at_their_offsets(tmp_path):
    """torch.save keeps a view's whole storage with its offset and strides; each tensor is read from its own place."""
    torch.manual_seed(2)
    shared = torch.randn(D * F * 2 + F + D + 5)
    w_enc = shared[5:5 + D * F].view(D, F)
    w_dec = shared[5 + D * F:5 + 2 * D * F].view(D, F).T  # strided: (F, D) with strides (1, F)
    b_enc, b_dec = shared[-F - D:-D], shared[-D:]
    write_saev(tmp_path / "views", {"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec, "b_dec": b_dec}, saev_header())
    sae = load_sae(tmp_path / "views", layer=0)
    assert torch.equal(sae.W_enc, w_enc) and torch.equal(sae.W_dec, w_dec) and torch.equal(sae.b_dec, b_dec)
    assert torch.allclose(sae.b_enc, b_enc + b_dec @ w_enc)

"""saev's released SAE format, read without running anything from the file.

saev (Stevens et al., "Sparse autoencoders for scientifically rigorous interpretation of vision models",
2025) writes one line of JSON (its config), then `torch.save(state_dict)`: a zip archive whose
`<name>/data.pkl` is a pickle of the state dict, with each tensor's bytes in `<name>/data/<key>`.

The pickle is interpreted by a restricted unpickler: `find_class` answers only five names (an ordered dict,
torch's tensor and parameter rebuild functions, and the storage types), each with a function of this module
that builds plain records, and any other global is refused; the storages become `torch.frombuffer` over the
archive's bytes after their sizes and strides are checked. No object of the file's choosing is ever
constructed and no code from it runs, unlike `torch.load`, whose `weights_only` mode is a safety filter
over torch's own unpickler.

saev's encoder has no `- b_dec` inside: its `h = x W_enc + b_enc'`. The same map in this tool's form
(`(x - b_dec) W_enc + b_enc`) has `b_enc = b_enc' + b_dec W_enc`, which is what is stored. A ReLU SAE is
TopK_F (every feature may fire), which is the same function.
"""
from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.sae_file import (MAX_SAE_BYTES, SAEInfo, SparseAutoencoder, check_entries, check_info)
from vit_inspect.core.weights import check_finite

MAX_HEADER_LINE = 2 ** 16  # bytes of saev's JSON line (a config of a few dozen fields)
MAX_PICKLE = 2 ** 20  # bytes of the state dict's pickle (names and shapes only; the tensors live beside it)
DTYPES = {"FloatStorage": torch.float32, "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
          "DoubleStorage": torch.float64}


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorRecord:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage, offset, size, stride, *_rest) -> _TensorRecord:
    if not isinstance(storage, _Storage):
        raise WeightsError("A tensor in the saev file does not point at a storage.")
    return _TensorRecord(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


def _rebuild_parameter(data, *_rest):
    return data


class _StateDictUnpickler(pickle.Unpickler):
    """Only the names a saved state dict uses; each mapped to a record builder of this module."""

    SAFE = {("collections", "OrderedDict"): OrderedDict, ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}

    def find_class(self, module: str, name: str):
        if (module, name) in self.SAFE:
            return self.SAFE[(module, name)]
        if module == "torch" and name in DTYPES:
            return DTYPES[name]
        raise WeightsError(f"The saev file's state dict names {module}.{name}, which a plain state dict of "
                           "tensors never does; refusing it.")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)
                and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise WeightsError("The saev file's state dict has a storage reference of an unknown kind.")
        return _Storage(pid[1], pid[2], pid[4])


def _tensor(archive: zipfile.ZipFile, prefix: str, record: _TensorRecord) -> torch.Tensor:
    storage = record.storage
    itemsize = torch.empty((), dtype=storage.dtype).element_size()
    name = f"{prefix}data/{storage.key}"
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise WeightsError(f"The saev file lacks the bytes of storage {storage.key!r}.") from None
    if info.file_size != storage.numel * itemsize or storage.numel * itemsize > MAX_SAE_BYTES:
        raise WeightsError(f"Storage {storage.key!r} of the saev file has {info.file_size} bytes, not the "
                           f"{storage.numel} × {itemsize} its state dict declares.")
    if len(record.size) != len(record.stride) or any(s < 0 for s in record.size + record.stride) or record.offset < 0:
        raise WeightsError("A tensor of the saev file has a malformed shape.")
    if math.prod(record.size) and record.offset + sum((n - 1) * s for n, s in zip(record.size, record.stride)) \
            >= storage.numel:
        raise WeightsError("A tensor of the saev file reaches past the end of its storage.")
    flat = torch.frombuffer(bytearray(archive.read(name)), dtype=storage.dtype)
    return flat.as_strided(record.size, record.stride, record.offset).clone().float()


def _info(config: dict, features: int, width: int, layer: int, model: str, name: str) -> SAEInfo:
    cfg = config.get("cfg", config)
    activation = cfg.get("activation")
    kind = activation.get("cls") if isinstance(activation, dict) else config.get("cls", "Relu")
    if kind == "SparseAutoencoderConfig":  # schema 1 with the activation given in cfg
        kind = "Relu"
    if kind == "TopK":
        params = activation.get("params", {}) if isinstance(activation, dict) else cfg
        k = int(params.get("top_k", 0))
    elif kind == "Relu":
        k = features  # ReLU(h) is TopK_F(ReLU(h))
    else:
        raise WeightsError(f"{name!r} is a saev SAE with a {kind!r} activation; this tool reads top-k and ReLU "
                           "SAEs only (a batch top-k SAE has no per-token equivalent).")
    info = SAEInfo(model=model, layer=layer, k=k, features=features, width=width, tokens="patches",
                   training={"saev_config": cfg}, source="saev")
    check_info(info, name)
    return info


def read_saev(path: str | Path, layer: int | None = None, model: str = "") -> SparseAutoencoder:
    """An SAE from a saev checkpoint. saev's files name neither the model nor the block: `layer` is the
    block whose output the SAE reads (required), `model` the model's name (optional, for display)."""
    path = Path(path)
    if layer is None:
        raise WeightsError(f"{path.name!r} is a saev SAE, and saev's files do not record which block they read; "
                           "give the block (--layer).")
    if path.stat().st_size > MAX_SAE_BYTES + MAX_PICKLE:
        raise WeightsError(f"{path.name!r} is larger than the {MAX_SAE_BYTES:,} bytes an SAE file may be.")
    with open(path, "rb") as handle:
        line = handle.readline(MAX_HEADER_LINE)
        try:
            config = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            config = None
        if not isinstance(config, dict) or not line.endswith(b"\n"):
            raise WeightsError(f"{path.name!r} does not start with saev's line of JSON.")
        body = io.BytesIO(handle.read())
    cfg = config.get("cfg", config)
    try:
        width = int(cfg["d_vit"])
        features = int(cfg.get("d_sae") or width * int(cfg["exp_factor"]))
    except (KeyError, TypeError, ValueError):
        raise WeightsError(f"{path.name!r}: saev's JSON line lacks d_vit and exp_factor.") from None
    info = _info(config, features, width, layer, model, path.name)
    try:
        archive = zipfile.ZipFile(body)
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1 or archive.getinfo(pickles[0]).file_size > MAX_PICKLE:
            raise WeightsError(f"{path.name!r}: after the JSON line there is no torch state dict archive.")
        prefix = pickles[0].removesuffix("data.pkl")
        records = _StateDictUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
    except WeightsError:
        raise
    except Exception as exc:  # zipfile and the unpickler raise many types; none may pass through
        raise WeightsError(f"{path.name!r}: the state dict after saev's JSON line is unreadable "
                           f"({type(exc).__name__}).") from None
    if not isinstance(records, dict) or not all(isinstance(r, _TensorRecord) for r in records.values()):
        raise WeightsError(f"{path.name!r}: the state dict holds something other than tensors.")
    entries = {str(k): {"shape": list(r.size), "dtype": "F32"} for k, r in records.items()}
    check_entries(entries, info, path.name)
    state = {str(k): _tensor(archive, prefix, r) for k, r in records.items()}
    check_finite(state.items(), repr(path.name))
    state["b_enc"] = state["b_enc"] + state["b_dec"] @ state["W_enc"]  # saev encodes x, not x - b_dec
    return SparseAutoencoder(info=info, **state)

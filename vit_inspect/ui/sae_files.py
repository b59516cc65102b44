"""The SAE files of the Features view (`ui.tabs.features`): the SAEs of the operator's folder, and the feature
index an SAE loads with (uploaded beside it, or beside a server's SAE), each checked before it enters the session
store with its bytes counted."""
from __future__ import annotations

import hashlib
import os

from vit_inspect.core.errors import InputError, WeightsError
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.sae_index import SAEIndex, index_path, read_index
from vit_inspect.ui.common import upload_folders
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.untrusted import client_file, plain_markdown

SAE_SUFFIXES = (".safetensors",)  # what the operator's folder lists (saev files need a block, given on upload)
NO_INDEX_UPLOAD = ("Galleries and labels need a feature index: upload the SAE's `.index.safetensors` (built with "
                   "`vit-inspect sae index`) beside it and load again.")


def sae_bytes(sae: SparseAutoencoder) -> int:
    return sum(t.numel() * t.element_size() for t in sae.tensors().values())


def index_nbytes(index: SAEIndex) -> int:
    """Bytes of an index's arrays (its crops counted, memory-mapped or not)."""
    return sum(a.nbytes for a in (index.activation, index.image, index.patch, index.crops, index.label_class,
                                  index.label_share, index.fired))


def server_saes(folder: str | None) -> list[str]:
    """The SAE files of the operator's folder, by name (never a path)."""
    if not folder or not os.path.isdir(folder):
        return []
    return sorted(entry.name for entry in os.scandir(folder)
                  if entry.is_file() and entry.name.lower().endswith(SAE_SUFFIXES))


def file_digest(path: str) -> str:
    hasher = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(2 ** 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def is_saev(path: str) -> bool:
    """Whether a file starts as saev's format does (a line of JSON), as `load_sae` tells them apart."""
    with open(path, "rb") as handle:
        return handle.read(1) == b"{"


def uploaded_index(app, upload: object, sae: SparseAutoencoder) -> tuple[Slot | None, str]:
    """(an uploaded index in the session store, or None, and why none): bounded by the page's upload size,
    read by `read_index` (header, shapes and contents checked; crops memory-mapped), and checked to belong
    to `sae`. A file that is no index of this SAE is a sentence; the SAE loads without it."""
    cap = int(app.config.max_upload_mb * 2 ** 20)
    given = client_file(upload, upload_folders(), max_bytes=cap, default_name="index")
    if given is None:
        return None, NO_INDEX_UPLOAD
    path, _ = given
    if isinstance(path, bytes):
        raise InputError("Upload the feature index as a file.")
    if os.path.getsize(path) > cap:
        return None, (f"The feature index is larger than the {app.config.max_upload_mb:g} MiB this server accepts; "
                      "build a smaller one (`vit-inspect sae index` with fewer `--index-top` patches or a smaller "
                      "`--index-crop`). Its galleries and labels are off.")
    return stored_index(app, path, sae)


def served_index(app, path: str, sae: SparseAutoencoder, name: str) -> tuple[Slot | None, str]:
    """(the index beside an SAE of the server's folder in the session store, or None, and why none): an
    index of another SAE or a damaged one is a sentence, and the SAE loads without it."""
    beside = index_path(path)
    if not beside.is_file():
        return None, (f"{plain_markdown(name)} has no feature index beside it; the operator builds one with "
                      f"`vit-inspect sae index FOLDER --sae {plain_markdown(name)}`.")
    return stored_index(app, beside, sae)


def stored_index(app, path, sae: SparseAutoencoder) -> tuple[Slot | None, str]:
    """(the index at `path` read by `read_index` and put in the session store with its bytes, "") or, when it is
    damaged, not an index or another SAE's, (None, that sentence): the SAE loads without it."""
    try:
        index = read_index(path, sae)
    except WeightsError as exc:
        return None, f"{exc.public} Its galleries and labels are off."
    return app.store.put(index, index_nbytes(index)), ""

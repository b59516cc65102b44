"""Hugging Face hub access that fails fast and remembers failures.

Left to itself the hub client retries a failed request five times with growing back-off, and
forgets the failure at once: offline, every look-up of a weights file stalls for about 48 seconds,
and the next one stalls again. Here every hub look-up goes through `hub_access(name)`:

1. `HF_HUB_OFFLINE=1`: nothing is probed; only the local hub cache is used (the client's own rule).
2. Otherwise one TCP connection to the hub endpoint (`HF_ENDPOINT`, default huggingface.co) is tried,
   with a `PROBE_TIMEOUT_S` time-out. If it fails, the look-up runs in offline mode, so files already
   in the local cache still load and a missing file fails at once, without retries.
3. The outcome of the probe is remembered for `PROBE_TTL_S`; a model whose load failed is remembered
   for `FAILURE_TTL_S` (a negative cache with expiry), and asking again within that time raises the
   same error without touching the network.

A web user's hub id is downloaded by `fetch_configs` and `fetch_weights`: every file a load reads is sized
from the hub's listing first, and only files within the server's bounds are downloaded.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping
from urllib.parse import urlsplit

from vit_inspect.core.errors import ModelNotFoundError, ModelTooLargeError

# Read by huggingface_hub when it is first imported: short time-outs instead of 10 s per request.
os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")
os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
# Read by transformers on each load: a repository with only .bin weights would otherwise make it ask the hub's
# conversion Space, from a background thread, to convert them: a request on a web user's behalf to another service.
os.environ.setdefault("DISABLE_SAFETENSORS_CONVERSION", "1")

PROBE_TIMEOUT_S = 2.0  # seconds one TCP connection to the hub may take
PROBE_TTL_S = 60.0  # seconds a probe's outcome (reachable or not) is trusted
FAILURE_TTL_S = 60.0  # seconds a failed model load is remembered
MAX_FAILURES = 256  # model names whose failure is remembered at once; the oldest is forgotten first
LISTING_TIMEOUT_S = 10.0  # seconds the hub's file listing may take
MAX_CONFIG_FILE_BYTES = 4 * 2 ** 20  # a JSON file a load reads; ImageNet-21k's labels in a config.json are ~1.7 MB
WEIGHTS_SLACK_BYTES = 2 ** 20  # per weights file, over the model bound: a safetensors header is at most 1 MiB
CONFIG_FILES = ("config.json", "preprocessor_config.json", "processor_config.json")  # what transformers reads
SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE_WEIGHTS, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"

_lock = threading.Lock()  # guards the two caches below and the offline switch
_probe: tuple[float, bool] | None = None  # (monotonic time, reachable) of the last probe
_failures: dict[str, tuple[float, Exception]] = {}  # model name -> (monotonic time, the error raised)
_offline_users = 0  # look-ups running with the offline switch on
_saved_offline: bool | None = None  # huggingface_hub's own offline flag before the first of them
clock: Callable[[], float] = time.monotonic  # replaceable in tests


def endpoint() -> str:
    """The hub endpoint the client talks to (`HF_ENDPOINT`)."""
    from huggingface_hub import constants
    return constants.ENDPOINT


def offline_by_setting() -> bool:
    """True when the user switched the hub off (`HF_HUB_OFFLINE=1` or `TRANSFORMERS_OFFLINE=1`)."""
    from huggingface_hub import constants
    with _lock:
        return bool(_saved_offline if _offline_users else constants.HF_HUB_OFFLINE)


def probe_endpoint(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the URL's host and port opens within `timeout` seconds."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def hub_reachable() -> bool:
    """Whether the hub endpoint answered a connection recently; probes at most once per `PROBE_TTL_S`."""
    global _probe
    with _lock:
        if _probe is not None and clock() - _probe[0] < PROBE_TTL_S:
            return _probe[1]
    reachable = probe_endpoint(endpoint())
    with _lock:
        _probe = (clock(), reachable)
    return reachable


def forget() -> None:
    """Drop the remembered probe and failures (e.g. after the network came back)."""
    global _probe
    with _lock:
        _probe = None
        _failures.clear()


def remembered_failure(name: str) -> Exception | None:
    """The error of a load of `name` that failed less than `FAILURE_TTL_S` ago, else None. A fresh copy
    each time: raising the kept exception itself would chain every raise's frames onto its traceback."""
    with _lock:
        entry = _failures.get(name)
        if entry is None:
            return None
        if clock() - entry[0] >= FAILURE_TTL_S:
            del _failures[name]
            return None
        return _frameless(entry[1])


def _frameless(exc: Exception) -> Exception:
    """A copy of `exc` (type, arguments, attributes such as a public sentence) without its traceback or
    chained exceptions, so that nothing it remembers keeps a request's frames and their data alive."""
    try:
        kept = copy.copy(exc)
    except Exception:  # an exception type that cannot be rebuilt from its arguments
        kept = RuntimeError(str(exc))
    kept.__traceback__ = kept.__cause__ = kept.__context__ = None
    return kept


def remember_failure(name: str, exc: Exception) -> None:
    """Remember that loading `name` failed with `exc`, for `FAILURE_TTL_S`; at most `MAX_FAILURES` names
    (expired ones go first, then the oldest), so that a client naming many models cannot grow it."""
    with _lock:
        now = clock()
        for stale in [key for key, (when, _) in _failures.items() if now - when >= FAILURE_TTL_S]:
            del _failures[stale]
        _failures.pop(name, None)
        _failures[name] = (now, _frameless(exc))
        while len(_failures) > MAX_FAILURES:
            del _failures[next(iter(_failures))]


@contextmanager
def _offline() -> Iterator[None]:
    """huggingface_hub's offline flag on for the block (reference-counted across threads)."""
    global _offline_users, _saved_offline
    from huggingface_hub import constants
    with _lock:
        if _offline_users == 0:
            _saved_offline = constants.HF_HUB_OFFLINE
        _offline_users += 1
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        with _lock:
            _offline_users -= 1
            if _offline_users == 0:
                constants.HF_HUB_OFFLINE = bool(_saved_offline)


@contextmanager
def hub_access(name: str) -> Iterator[bool]:
    """Run one hub look-up for model `name`: fail at once if it failed recently, go offline (local
    cache only) when the endpoint does not answer, and remember a failure. Yields whether the network
    is used. Any exception from the block is remembered for `name` and re-raised."""
    failure = remembered_failure(name)
    if failure is not None:
        raise failure
    online = not offline_by_setting() and hub_reachable()
    try:
        if online:
            yield True
        else:
            with _offline():
                yield False
    except Exception as exc:
        remember_failure(name, exc)
        raise


def weight_files(sizes: Mapping[str, int | None], explicit: str | None,
                 read_index: Callable[[str], dict]) -> list[str]:
    """The weights files transformers' `from_pretrained` (5.x, no variant, no subfolder) takes from a hub
    repository whose files are ``sizes``' keys: the config's ``transformers_weights`` when it names one;
    else model.safetensors, its sharded index, pytorch_model.bin, its sharded index, in that order. A
    sharded checkpoint is its index plus every file the index's ``weight_map`` names (``read_index(name)``
    gives the index's JSON). Empty when the repository has none (the load then fails by itself)."""
    if explicit is not None:
        order = [explicit]
    else:
        order = [name for name in (SAFE_WEIGHTS, SAFE_INDEX, PICKLE_WEIGHTS, PICKLE_INDEX) if name in sizes][:1]
    if not order:
        return []
    chosen = order[0]
    if chosen not in sizes:
        raise ModelNotFoundError(f"The config names weights {_quoted(chosen)} that the repository does not hold.")
    if not chosen.endswith(".index.json"):
        return [chosen]
    weight_map = read_index(chosen).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelNotFoundError(f"The weights index {_quoted(chosen)} has no weight_map of file names.")
    shards = sorted(set(weight_map.values()))
    absent = [shard for shard in shards if shard not in sizes]
    if absent:
        raise ModelNotFoundError(f"The weights index {_quoted(chosen)} names {_quoted(absent[0])}, which the repository "
                                 "does not hold.")
    return [chosen, *shards]


def _quoted(name: str, most: int = 100) -> str:
    """A file name a repository's own files wrote, quoted and cut to ``most`` characters for a message: a
    remembered failure (`remember_failure`) must not keep megabytes of it."""
    return repr(name[:most]) + ("..." if len(name) > most else "")


def _size_text(nbytes: int) -> str:
    unit, scale = ("GiB", 2 ** 30) if nbytes >= 2 ** 30 else ("MiB", 2 ** 20)
    return f"{nbytes / scale:,.1f} {unit}"


@dataclass(frozen=True)
class Listing:
    """A hub repository's files with their sizes, at one commit, as the hub listed them (`fetch_configs`).
    Every file `fetch` downloads is sized from it first and taken at that commit."""

    repo: str
    revision: str  # the commit listed; the load reads this commit from the local cache only
    sizes: dict[str, int | None]  # file name -> bytes (None: the hub gave no size)
    fetched: dict[str, Path] = field(default_factory=dict)  # file name -> its path in the local cache

    def size(self, name: str) -> int:
        """The listed size of ``name`` in bytes; a file the hub gave no size for is refused with a sentence."""
        size = self.sizes.get(name)
        if size is None:
            raise ModelNotFoundError(f"The Hugging Face hub did not give the size of {name!r} in {self.repo!r}; "
                                     "refusing to download it.")
        return size

    def fetch(self, name: str, bound: int) -> Path:
        """The file ``name`` in the local cache, downloaded at `revision` unless it is larger than ``bound``
        bytes or has no listed size (refused with a sentence, before any byte of it is fetched)."""
        from huggingface_hub import hf_hub_download

        size = self.size(name)
        if size > bound:
            raise ModelTooLargeError(f"{self.repo!r} has a {name} of {_size_text(size)}, more than the "
                                     f"{_size_text(bound)} this server reads; refusing to download it.")
        if name not in self.fetched:
            self.fetched[name] = Path(hf_hub_download(self.repo, name, revision=self.revision, token=False))
        return self.fetched[name]


def list_repo(repo: str) -> Listing:
    """Hub model ``repo``'s files with their sizes at its current commit (nothing downloaded). No token is
    sent: a web user's id never reaches a private repository through the operator's login."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, files_metadata=True, timeout=LISTING_TIMEOUT_S, token=False)
    except Exception as exc:  # not found, gated, unreachable: many types
        raise ModelNotFoundError(f"Could not list the files of {repo!r} on the Hugging Face hub "
                                 f"({type(exc).__name__}).") from None
    return Listing(repo, info.sha, {sibling.rfilename: sibling.size for sibling in info.siblings or ()})


def fetch_configs(repo: str) -> Listing:
    """List hub model ``repo``'s files with their sizes and download the config files transformers reads
    (`CONFIG_FILES` present), each refused over `MAX_CONFIG_FILE_BYTES`. The caller then loads the listed
    commit from the local cache only (``revision=listing.revision, local_files_only=True``), so nothing it
    did not size is downloaded, and sizes the model from its config before `fetch_weights`.

    No token is sent: a web user's id never reaches a private repository through the operator's login."""
    listing = list_repo(repo)
    if "config.json" not in listing.sizes:
        raise ModelNotFoundError(f"{repo!r} on the Hugging Face hub has no config.json; it is not a transformers model.")
    for name in CONFIG_FILES:
        if name in listing.sizes:
            listing.fetch(name, MAX_CONFIG_FILE_BYTES)
    return listing


def fetch_weights(listing: Listing, max_weight_bytes: int, explicit: object = None) -> None:
    """Download the weights files `weight_files` names for ``listing``'s repository (``explicit``: the
    loaded config's ``transformers_weights``, as transformers reads it), refused before any is fetched when
    their listed sizes sum over ``max_weight_bytes`` (the model bound: float32 parameters) plus
    `WEIGHTS_SLACK_BYTES` per file, or a size is missing. A config sized to pass the model bound could
    otherwise come with weights files of any size, downloaded to disk in full before any check."""
    files = weight_files(listing.sizes, explicit if isinstance(explicit, str) else None,
                         lambda index: _json_object(listing.fetch(index, MAX_CONFIG_FILE_BYTES), index))
    data = [name for name in files if not name.endswith(".index.json")]
    total = sum(listing.size(name) for name in data)
    if total > max_weight_bytes + WEIGHTS_SLACK_BYTES * len(data):
        raise ModelTooLargeError(
            f"{listing.repo!r} keeps {_size_text(total)} of weights ({', '.join(name[:100] for name in data[:3])}"
            f"{', ...' if len(data) > 3 else ''}), more than the {_size_text(max_weight_bytes)} this server "
            "allows one model; refusing to download them.")
    for name in data:
        listing.fetch(name, max_weight_bytes + WEIGHTS_SLACK_BYTES)


def _json_object(path: Path, name: str) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise ModelNotFoundError(f"{name} is not a JSON object; it is not a transformers model.")
    return value

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
"""
from __future__ import annotations

import copy
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator
from urllib.parse import urlsplit

# Read by huggingface_hub when it is first imported: short time-outs instead of 10 s per request.
os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")
os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")

PROBE_TIMEOUT_S = 2.0  # seconds one TCP connection to the hub may take
PROBE_TTL_S = 60.0  # seconds a probe's outcome (reachable or not) is trusted
FAILURE_TTL_S = 60.0  # seconds a failed model load is remembered
MAX_FAILURES = 256  # model names whose failure is remembered at once; the oldest is forgotten first

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

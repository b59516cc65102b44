"""The one gate for values a web client sends: file references, numbers, flags and names.

Everything a client sends is untrusted. A file reference (a path, a Gradio file payload with or
without `meta`, a `url`, a `data:` URL) becomes bytes or a path only through `client_file`, which
accepts a path only if it resolves, symlinks included, inside one of the folders the server
itself writes uploads to; anything else gets one fixed message (`NOT_AVAILABLE`) that says nothing
about what exists on the server. Numbers go through `finite_int` / `finite_float`, which refuse NaN
and wrong types with a sentence and clamp (or refuse) values outside a range. No UI toolkit is
imported here: the caller passes the upload folders.
"""
from __future__ import annotations

import base64
import binascii
import math
import numbers
import os
import re
import unicodedata
from typing import Iterable

from vit_inspect.core.errors import InputError
from vit_inspect.core.prompts import check_prompt

NOT_AVAILABLE = "This file is not available to this app; please upload it again."
NO_DATA = "The image arrived without its data; please upload it again."
MAX_NAME_CHARS = 120  # a client's file name is kept for downloads, shortened to this
MAX_NAME_BYTES = 120  # ... and to this many UTF-8 bytes (names around it add < 60; most file systems allow 255)
_DATA_URL = re.compile(r"^data:([\w.+\-]+/[\w.+\-]+)?((?:;[\w\-]+=[\w.\-]+)*);base64,", re.ASCII)
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")
_INVISIBLE = frozenset(("Cf", "Cs", "Co", "Cn", "Zl", "Zp"))  # Unicode categories dropped from a client's file name


def _roots(roots: Iterable[str | os.PathLike]) -> list[str]:
    return [os.path.realpath(os.fspath(r)) for r in roots]


def inside(path: str, roots: Iterable[str | os.PathLike]) -> bool:
    """Whether `path` resolves (symlinks followed) to something inside one of `roots`."""
    real = os.path.realpath(path)
    for root in _roots(roots):
        try:
            if os.path.commonpath([real, root]) == root and real != root:
                return True
        except ValueError:  # different drives (Windows) or a mix of absolute and relative paths
            continue
    return False


def client_path(value: object, roots: Iterable[str | os.PathLike]) -> str:
    """The resolved path of a regular file inside `roots`, or InputError(NOT_AVAILABLE).

    The same message for a path outside the roots, a missing file, a folder, a null byte or a
    value that is not a path at all: a client learns nothing about the server's files.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(NOT_AVAILABLE)
    path = os.fspath(value)
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
        raise InputError(NOT_AVAILABLE)
    try:
        if not inside(path, roots):
            raise InputError(NOT_AVAILABLE)
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            raise InputError(NOT_AVAILABLE)
    except (OSError, ValueError):
        raise InputError(NOT_AVAILABLE) from None
    return real


def _visible(name: str) -> str:
    """`name` with control characters (Unicode category Cc) as "_" and every invisible one dropped: format
    characters (Cf: the bidirectional overrides such as U+202E, which show "gnp.exe" as "exe.png", and zero-width
    ones), surrogates, private-use and unassigned code points, line and paragraph separators."""
    kept = []
    for char in name:
        kind = unicodedata.category(char)
        if kind == "Cc":
            kept.append("_")
        elif kind not in _INVISIBLE:
            kept.append(char)
    return "".join(kept)


def safe_name(value: object, default: str = "image") -> str:
    """A client's file name as a plain base name: no folders, no control or invisible characters, bounded length."""
    if not isinstance(value, str):
        return default
    name = _visible(_UNSAFE_NAME.sub("_", value.replace("\\", "/").rsplit("/", 1)[-1])).strip(" .")
    if not name:
        return default
    stem, dot, suffix = name.rpartition(".")
    if len(name) > MAX_NAME_CHARS:
        name = (stem[: MAX_NAME_CHARS - len(suffix) - 1] + "." + suffix[:10]) if dot else name[:MAX_NAME_CHARS]
    while len(name.encode("utf-8")) > MAX_NAME_BYTES:  # file systems count bytes: 92 CJK characters are 268
        stem, dot, suffix = name.rpartition(".")
        name = (stem[:-1] + "." + suffix) if dot and stem[:-1] else name[:-1]
    return name or default


def data_url_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a base64 `data:` URL, refusing before decoding anything larger than `max_bytes`."""
    match = _DATA_URL.match(url)
    if match is None:
        raise InputError("The image data is not a base64 data URL; please upload the file instead.")
    encoded = url[match.end():]
    limit = 4 * math.ceil(max_bytes / 3)  # base64 length of max_bytes bytes, padding included
    if len(encoded) > limit:
        raise InputError(f"The image is larger than the limit of {max_bytes / 2**20:.0f} MiB.")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InputError("The image data is damaged (not valid base64); please upload the file again.") from None


def client_file(payload: object, roots: Iterable[str | os.PathLike], max_bytes: int,
                default_name: str = "image") -> tuple[str | bytes, str] | None:
    """(resolved path or decoded bytes, a safe file name) of any file reference a client may send;
    None when there is none (a cleared input).

    Accepted shapes: a path string; a dict with `path` (with or without Gradio's `meta`); a dict
    whose `url` is a base64 `data:` URL; an object with a `path` attribute (Gradio's FileData).
    Every path goes through `client_path`. Any other `url` (http, Gradio's /file= route) is refused:
    the server never fetches or opens what a client names.
    """
    if payload is None or payload == "" or payload == {}:
        return None
    roots = list(roots)
    if isinstance(payload, (str, os.PathLike)):
        path = client_path(payload, roots)
        return path, safe_name(os.path.basename(path), default_name)
    if not isinstance(payload, dict):
        path_attr = getattr(payload, "path", None)
        if path_attr is None:
            raise InputError(NOT_AVAILABLE)
        payload = {"path": path_attr, "orig_name": getattr(payload, "orig_name", None)}
    path, url = payload.get("path"), payload.get("url")
    if path not in (None, ""):
        real = client_path(path, roots)
        return real, safe_name(payload.get("orig_name"), safe_name(os.path.basename(real), default_name))
    if isinstance(url, str) and url.startswith("data:"):
        return data_url_bytes(url, max_bytes), safe_name(payload.get("orig_name"), default_name)
    if url not in (None, ""):
        raise InputError(NOT_AVAILABLE)
    raise InputError(NO_DATA)


def client_files(payload: object, roots: Iterable[str | os.PathLike], max_bytes: int,
                 max_count: int) -> list[tuple[str | bytes, str]]:
    """Every file of a multiple-file input, each through `client_file`; at most `max_count`."""
    if payload is None or payload == []:
        return []
    if not isinstance(payload, (list, tuple)):
        payload = [payload]
    if len(payload) > max_count:
        raise InputError(f"Please upload at most {max_count} files at once ({len(payload)} given).")
    files = [client_file(item, roots, max_bytes, default_name=f"file {i + 1}") for i, item in enumerate(payload)]
    return [f for f in files if f is not None]


# ------------------------------------------------------------------------------------------ numbers

def _number(value: object, name: str) -> float | None:
    """A float from a JSON-ish value, None for an empty one; a sentence for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # a JSON integer of 400 digits: no float holds it
            raise InputError(f"{name} must be a number within range, not one of {len(str(value))} digits.") from None
    elif isinstance(value, str) and len(value) <= 40:
        try:
            number = float(value.strip())
        except ValueError:
            raise InputError(f"{name} must be a number, not {value[:20]!r}.") from None
    else:
        kind = {list: "a list", tuple: "a list", dict: "an object", str: "a long text"}.get(type(value), "that value")
        raise InputError(f"{name} must be a number, not {kind}.")
    if math.isnan(number):
        raise InputError(f"{name} must be a number, not NaN.")
    return number


def finite_float(value: object, name: str, lo: float, hi: float, *, default: float | None = None,
                 clamp: bool = True) -> float:
    """`value` as a float in [lo, hi]. Empty -> `default` (or a sentence if None); NaN and wrong types
    -> a sentence; outside the range (±inf included) -> clamped, or a sentence when `clamp` is False."""
    number = _number(value, name)
    if number is None:
        if default is None:
            raise InputError(f"Give a value for {name}.")
        return float(default)
    if lo <= number <= hi:
        return number
    if clamp:
        return float(min(max(number, lo), hi))
    raise InputError(f"{name} must be between {lo:g} and {hi:g}, not {number:g}.")


def finite_int(value: object, name: str, lo: int, hi: int, *, default: int | None = None, clamp: bool = True) -> int:
    """`value` rounded to a whole number in [lo, hi]; see `finite_float` for what is refused or clamped."""
    number = finite_float(value, name, lo, hi, default=None if default is None else float(default), clamp=clamp)
    return int(min(max(round(number), lo), hi))


def flag(value: object, name: str) -> bool:
    """A checkbox value: True/False (None or 0/1 also); anything else is refused."""
    if value is None:
        return False
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return bool(value)
    raise InputError(f"{name} must be true or false.")


def text(value: object, name: str, max_chars: int = 200) -> str:
    """A short text value, stripped; None is empty. Lists, objects and control characters are refused."""
    if value is None:
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InputError(f"{name} must be text.")
    value = value.strip()  # spaces and line breaks around a pasted name are not part of it
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InputError(f"{name} must be printable characters only (it holds a control character).")
    if len(value) > max_chars:
        raise InputError(f"{name} must be at most {max_chars} characters (it has {len(value)}).")
    return value


def prompt_text(value: object, what: str = "prompt", optional: bool = False) -> str | None:
    """A text prompt from a client, checked as the library checks one (`core.prompts.check_prompt`: text, not
    empty, at most 300 characters, no control or invisible characters), stripped. An ``optional`` box left
    empty is None (no versus prompt)."""
    if optional and (value is None or (isinstance(value, str) and not value.strip())):
        return None
    return check_prompt("" if value is None else value, what)


# ----------------------------------------------------------------------------------------- messages

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#!|~])")


def plain_markdown(value: str) -> str:
    """``value`` (a client's file name) with every character Markdown or HTML would read as markup escaped, so that
    a page's Markdown shows it as it is: "[x](y)" is no link, "<b>" no tag."""
    return _MARKDOWN.sub(r"\\\1", value)


_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~])(?:~|[A-Za-z]:)?/(?:[^\s'\"`()<>,;/]+/)+([^\s'\"`()<>,;/]*)")


def redact_paths(message: str) -> str:
    """`message` with every absolute path (two or more components) replaced by its last component:
    a last line of defence so that no server folder reaches a web user. Hub ids (`org/name`) and
    URLs are left alone."""
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "(folder)", message)

"""A guard in front of Gradio's routes for what Gradio does with a request before any handler runs.

Two things reach memory, disk or the network there, whatever the handler later refuses:

- **A file object whose ``path`` is a URL** (``{"path": "https://host/x.png", "meta": {"_type":
  "gradio.FileData"}}``): Gradio's input processing (`processing_utils.async_move_files_to_cache`)
  downloads it into its cache, reading the whole body into memory, before the handler's gate
  (`untrusted.client_file`) sees the file. Offline that is only a failed DNS lookup in the log; on a
  Space it is a download of any size from any public host.
- **Long values**: Gradio keeps every input value of a session (`SessionState`) before the handler's
  checks run, so a 200 MB string in a text field stays in memory for the session's life.

A third answers with a traceback: **an empty session hash** (``"session_hash": ""`` in a POST body, or
``?session_hash=`` on the queue's stream) passes Gradio's own check for a missing one and ends in a KeyError
inside its queue (HTTP 500, "Exception in ASGI application" in the log).

`RequestGuard` reads each POST body but uploads (at most ``max_body`` bytes: a ``data:`` URL of the largest
upload, base64, plus slack) and refuses it, with a sentence and status 400 or 413, when any value is a
file object whose path is a URL, any string other than a ``data:`` URL is longer than
`MAX_TEXT_CHARS`, or the session hash is empty; a GET whose ``session_hash`` parameter is empty is refused
the same way. Uploads (multipart, bounded by Gradio's ``max_file_size``) and every other request
pass untouched. It runs in front of every route, so no handler can forget it.
"""
from __future__ import annotations

import json
import math
from urllib.parse import parse_qs

MAX_TEXT_CHARS = 64 * 1024  # longest string a request may carry, a data: URL aside (the app's texts are < 500)
MAX_DEPTH = 64  # nesting deeper than this is refused before it is walked
NO_SESSION = "The request's session hash is empty; reload the page (a script: give each client a session hash)."


def body_limit(max_upload_mb: float) -> int:
    """Bytes a JSON request may have: a ``data:`` URL of the largest upload (base64: 4/3), plus 1 MiB."""
    return math.ceil(max_upload_mb * 2 ** 20 * 4 / 3) + 2 ** 20


def refusal(value: object) -> str | None:
    """Why a request's parsed JSON body is refused, or None: a file object whose ``path`` is a URL, a
    string (other than a ``data:`` URL) of more than MAX_TEXT_CHARS, nesting deeper than MAX_DEPTH, or an
    empty session hash (one that is missing, null, Gradio answers itself)."""
    if isinstance(value, dict) and isinstance(value.get("session_hash"), str) and not value["session_hash"].strip():
        return NO_SESSION
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return "The request is nested too deeply."
        if isinstance(item, str):
            if len(item) > MAX_TEXT_CHARS and not item[:5].lower() == "data:":
                return f"A text in the request is longer than {MAX_TEXT_CHARS:,} characters."
        elif isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and path.strip().lower().startswith(("http://", "https://")):
                return "A file must be uploaded to this app; it does not fetch files from other addresses."
            stack.extend((v, depth + 1) for v in item.values())
            stack.extend((k, depth + 1) for k in item if isinstance(k, str))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return None


class RequestGuard:
    """ASGI middleware: POST bodies (uploads aside) of at most ``max_body`` bytes, refused when their JSON
    is something `refusal` names."""

    def __init__(self, app, max_body: int):
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and _empty_session(scope):
            return await _refuse(send, 400, NO_SESSION)
        if scope["type"] != "http" or scope["method"] != "POST" or _is_multipart(scope):
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await _refuse(send, 413, f"The request is larger than {self.max_body / 2 ** 20:.1f} MiB.")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            why = refusal(json.loads(body)) if body else None
        except (ValueError, RecursionError):
            why = None  # not JSON after all: Gradio answers it as it would
        if why is not None:
            return await _refuse(send, 400, why)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _empty_session(scope) -> bool:
    """Whether a request's query string names a ``session_hash`` and gives it no value."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return any(not value.strip() for value in query.get("session_hash", ()))


def _is_multipart(scope) -> bool:
    """An upload (bounded by Gradio's max_file_size). Every other body is read: FastAPI parses JSON from a
    request without a content type, or with any application/*+json one, not only application/json."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";")[0].strip().lower().startswith(b"multipart/")
    return False


async def _refuse(send, status: int, sentence: str) -> None:
    body = json.dumps({"detail": sentence, "error": sentence}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

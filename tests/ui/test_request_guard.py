"""`RequestGuard`: what Gradio would do with a request before any handler runs is refused in front of it
(a file object whose path is a URL is never fetched; long texts and bodies are refused), live, through a
small Gradio app launched with the app's own `launch_limits`, and by hand on the walk itself."""
from __future__ import annotations

import http.server
import threading

import gradio as gr
import httpx
import pytest
from support.app import free_port

import app
from vit_inspect.ui.config import launch_limits
from vit_inspect.ui.request_guard import MAX_TEXT_CHARS, NO_SESSION, body_limit, refusal


def test_refusal_by_hand():
    file = {"path": "/tmp/gradio/x.png", "url": "http://127.0.0.1:7860/gradio_api/file=/tmp/gradio/x.png",
            "meta": {"_type": "gradio.FileData"}}
    assert refusal({"data": [file, "cat", 3, None], "fn_index": 1}) is None  # what the page itself sends
    assert "does not fetch files" in refusal({"data": [{**file, "path": "https://example.com/cat.png"}]})
    assert "does not fetch files" in refusal({"data": [[{"path": " HTTP://host/x"}]]})  # nested, any case
    assert refusal({"data": ["a" * MAX_TEXT_CHARS]}) is None
    assert "longer than 65,536 characters" in refusal({"data": ["a" * (MAX_TEXT_CHARS + 1)]})
    assert "longer than" in refusal({"a" * (MAX_TEXT_CHARS + 1): 1})  # keys count too
    assert refusal({"data": ["data:image/png;base64," + "A" * 10 * MAX_TEXT_CHARS]}) is None  # an image sent inline
    deep = []
    for _ in range(70):
        deep = [deep]
    assert refusal(deep) == "The request is nested too deeply."
    assert refusal({"data": [], "fn_index": 1, "session_hash": "a1b2c3"}) is None
    assert refusal({"data": [], "fn_index": 1, "session_hash": None}) is None  # Gradio's own 400
    for empty in ("", "  "):
        assert refusal({"data": [], "fn_index": 1, "session_hash": empty}) == NO_SESSION
    assert body_limit(30) == 42_991_616 and body_limit(1) == 2_446_678  # ceil(MiB x 4/3) + 1 MiB


@pytest.fixture(scope="module")
def served():
    """A Gradio app with a file input and a text input, launched with the app's own limits (1 MiB uploads),
    and a local HTTP server that counts what is fetched from it."""
    fetched = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            fetched.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\x89PNG\r\n\x1a\n" + b"0" * 100)

        def log_message(self, *args):
            pass

    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    with gr.Blocks() as demo:
        upload, words, out = gr.File(), gr.Textbox(), gr.Textbox()
        gr.Button().click(lambda f, t: f"file {f is not None}, text {len(t or '')}", [upload, words], out,
                          api_name="echo")
    config, _ = app.parse_args(["--max-upload-mb", "1"])
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                **launch_limits(config))
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{files.server_address[1]}", fetched
    demo.close()
    files.shutdown()


def _call(base: str, data: list):
    return httpx.post(f"{base}/gradio_api/call/echo", json={"data": data}, timeout=30)


def test_a_file_path_that_is_a_url_is_never_fetched(served):
    base, files, fetched = served
    for path in (f"{files}/cat.png", f"{files}/big.png".upper().replace("HTTP://", "http://")):
        answer = _call(base, [{"path": path, "meta": {"_type": "gradio.FileData"}}, "x"])
        assert answer.status_code == 400
        assert answer.json()["detail"] == "A file must be uploaded to this app; it does not fetch files from other addresses."
    # without the guard Gradio answers 200 and tries to download it into its cache before the handler runs
    # (safehttpx refuses this loopback host, so the count is a second line of evidence, not the first)
    assert fetched == []
    assert _call(base, [None, "hello"]).status_code == 200  # an ordinary call still runs


def test_long_texts_and_bodies_are_refused_before_gradio_keeps_them(served):
    base, _, _ = served
    answer = _call(base, [None, "a" * (MAX_TEXT_CHARS + 1)])
    assert answer.status_code == 400 and "longer than 65,536 characters" in answer.json()["detail"]
    answer = _call(base, [None, "data:" + "a" * body_limit(1)])  # a data: URL, but beyond the body bound
    assert answer.status_code == 413 and answer.json()["detail"] == "The request is larger than 2.3 MiB."
    answer = httpx.post(f"{base}/gradio_api/call/echo", content=b'{"data": [null, "' + b"b" * 70_000 + b'"]}',
                        headers={"content-type": "text/plain"}, timeout=30)  # FastAPI reads JSON without its type
    assert answer.status_code == 400


def test_an_empty_session_hash_is_refused_with_a_sentence(served, capfd):
    """It reached Gradio's queue, which answered HTTP 500 and logged "Exception in ASGI application"."""
    base, _, _ = served
    config = httpx.get(f"{base}/config", timeout=30).json()
    echo = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "echo")
    for session in ("", " "):
        answer = httpx.post(f"{base}/gradio_api/queue/join", timeout=30,
                            json={"data": [None, "x"], "fn_index": echo, "session_hash": session})
        assert answer.status_code == 400 and answer.json()["detail"] == NO_SESSION
    stream = httpx.get(f"{base}/gradio_api/queue/data", params={"session_hash": ""}, timeout=30)
    assert stream.status_code == 400 and stream.json()["detail"] == NO_SESSION
    joined = httpx.post(f"{base}/gradio_api/queue/join", timeout=30,
                        json={"data": [None, "x"], "fn_index": echo, "session_hash": "s1"})
    assert joined.status_code == 200  # a session of its own still joins
    assert "Exception in ASGI application" not in capfd.readouterr().err


def test_the_imported_demo_launches_behind_the_guard_with_the_default_limits():
    """`from app import demo; demo.launch()` (not `python app.py`) gets the same limits: RequestGuard in
    front (a URL file path is a 400 on the app's own analyze endpoint), 30 MiB uploads, 100 sessions."""
    port = free_port()
    app.demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/gradio_api/call/analyze", timeout=30,
                            json={"data": [{"path": "https://example.com/cat.png", "meta": {"_type": "gradio.FileData"}}]})
        assert answer.status_code == 400 and "does not fetch files" in answer.json()["detail"]
        assert app.demo.max_file_size == 30 * 2 ** 20 and app.demo.state_session_capacity == 100
    finally:
        app.demo.close()

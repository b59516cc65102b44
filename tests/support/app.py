"""The served app as the UI tests drive it: real DeiT-Ti weights, a free port, a client's calls."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import gradio.networking
import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from support import REPO
from vit_inspect.ui.common import REFUSED
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import LATER_PANELS
from vit_inspect.ui.model_cache import CacheKey, ModelCache
from vit_inspect.ui.panels import IMAGE_PANELS


def _patient_url_ok(url: str) -> bool:
    """Gradio's launch probes its own page with a HEAD of 3 s timeout and gives up (a ValueError saying localhost
    is not accessible) at the first timeout. Late in a full run on two loaded cores the first page render of a
    large demo can take longer than that; the tests then wait as a user's browser would, up to 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.head(url, timeout=10).status_code in (200, 401, 301, 302, 303, 307, 308):
                return True
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


gradio.networking.url_ok = _patient_url_ok  # every launch in the tests imports this module first


def _patient_client(init):
    """gradio_client posts each call (`/queue/join`) with httpx's default 5 s read timeout. Late in a full run on
    two loaded cores the server can take longer to answer that post while it serves another; the tests' clients
    wait up to 120 s (the server sends a heartbeat every 15 s while a call runs), unless a test gives its own timeout."""
    def patient_init(self, *args, httpx_kwargs=None, **kwargs):
        init(self, *args, httpx_kwargs={"timeout": 120, **(httpx_kwargs or {})}, **kwargs)
    return patient_init


Client.__init__ = _patient_client(Client.__init__)  # every served-app test imports this module before its client

WEIGHTS = REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors"
CHELSEA = REPO / "assets" / "chelsea.png"
CATS = ("Egyptian cat", "tabby", "tiger cat")
ANALYZE_OUTPUTS = ("predictions", "crop", "target", *IMAGE_PANELS, "seen", "geometry", "status", "query", "notice")
KEPT = {"__type__": "update"}  # an output an answer leaves as it was (Gradio's update with nothing in it)
APP_MARKS = [  # each served-app test module: pytestmark = APP_MARKS
    pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS} "
                                                     "(bash .ci/run copies them from ../shared/models)"),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),  # Gradio's own pandas deprecations
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def app_process(port: int, env: dict, log: Path | None = None) -> subprocess.Popen:
    """`python app.py --port PORT --device cpu` in a process of its own with ``env``, returned once its port
    answers (stdout and stderr together in ``.stdout``, or in the file ``log`` when one is given, for a server
    that runs long enough to fill a pipe); waits against a deadline, not a timing claim."""
    output = subprocess.PIPE if log is None else log.open("w")
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--device", "cpu"], cwd=REPO, env=env,
                              stdout=output, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        output.close()  # the server writes through its own copy
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None:
            said = server.stdout.read() if log is None else log.read_text()
            pytest.fail(f"the server stopped: {said[-3000:]}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            return server
        except httpx.TransportError:
            if time.monotonic() > deadline:
                server.kill()
                pytest.fail("the server never opened its port")
            time.sleep(0.2)


def launch(demo) -> str:
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    return f"http://127.0.0.1:{port}/"


class Server:
    """The app on a free port, its model cache, and a count of forward passes of the served model."""

    def __init__(self):
        self.config = AppConfig(weights=str(WEIGHTS), device="cpu")
        self.cache = ModelCache(self.config.cache_size)
        self.demo = build_demo(self.config, self.cache)
        self.url = launch(self.demo)
        self.forwards = 0
        handle = self.cache.get(CacheKey.of(self.config.model, self.config.weights, self.config.device))
        handle.model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.forwards += 1


EXPLAIN_TABS = ("Attention", "Rollout", "Grad-CAM")  # the Explain section's views of a single map


def analyze(client: Client, path: Path = CHELSEA) -> dict:
    """/analyze's outputs by name, with the Explain section's maps filled in as the page draws them when their
    view is shown (/panels_of_new_image); the other figures stay as the answer left them (None)."""
    answer = dict(zip(ANALYZE_OUTPUTS, client.predict(handle_file(str(path)), api_name="/analyze"), strict=True))
    if not isinstance(answer["first_attention"], str):
        return answer  # no image (None), or the image shown already (nothing changes)
    for tab in EXPLAIN_TABS:
        drawn = dict(zip(LATER_PANELS, client.predict(tab, api_name="/panels_of_new_image"), strict=True))
        answer |= {name: drawn[name] for name, shown in LATER_PANELS.items() if shown == tab}
    return answer


def refusal(answer) -> str | None:
    """The sentence a refused request answers with, in the note its page shows (`common.says_refusals`: the one
    output starting with a warning sign), without the sign; None for an answer that is no refusal."""
    notes = [value for value in answer if isinstance(value, str) and value.startswith(REFUSED)]
    assert len(notes) <= 1, notes
    return notes[0][len(REFUSED):] if notes else None


def refused(client: Client, *args, api_name: str, **kwargs) -> str:
    """`client.predict(...)` of a request that must be refused: its sentence, every output but the note left as
    it was (the model picker aside, which a refused model load puts back)."""
    answer = client.predict(*args, api_name=api_name, **kwargs)
    answer = answer if isinstance(answer, tuple) else (answer,)
    sentence = refusal(answer)
    assert sentence is not None, answer
    others = [value for value in answer if not (isinstance(value, str) and value.startswith(REFUSED))]
    kept = others[:-1] if api_name == "/load_model" else others  # a refused load puts the picker back: its last
    assert all(value == KEPT for value in kept), answer
    return sentence


def pixels(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def click(client: Client, api_name: str, x: int, y: int) -> list:
    """Send a select event with (x, y) like the browser does; gradio_client cannot attach event data."""
    dependency = next(d for d in client.config["dependencies"] if d.get("api_name") == api_name)
    defaults = {c["id"]: c.get("props", {}).get("value") for c in client.config["components"]}
    payload = {"data": [defaults.get(i) for i in dependency["inputs"]], "fn_index": dependency["id"],
               "trigger_id": dependency["targets"][0][0], "session_hash": client.session_hash,
               "event_data": {"index": [x, y], "value": None, "selected": True}}
    base = client.src.rstrip("/") + "/gradio_api"
    event_id = httpx.post(f"{base}/queue/join", json=payload, timeout=30).json()["event_id"]
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": client.session_hash}, timeout=60) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("event_id") == event_id and message.get("msg") == "process_completed":
                assert message["success"], message["output"]
                return message["output"]["data"]
    raise AssertionError("the select event never completed")


def dependency(client: Client, api_name: str) -> dict:
    return next(d for d in client.config["dependencies"] if d.get("api_name") == api_name)


def queue_call(client: Client, api_name: str, data: list, event_data=None) -> dict:
    """One event through /queue/join with hand-made JSON (NaN and Infinity allowed): the completion message."""
    dep = dependency(client, api_name)
    payload = {"data": data, "fn_index": dep["id"], "session_hash": client.session_hash,
               "trigger_id": dep["targets"][0][0] if dep["targets"] else None, "event_data": event_data}
    base = client.src.rstrip("/") + "/gradio_api"
    joined = httpx.post(f"{base}/queue/join", content=json.dumps(payload), timeout=30,
                        headers={"content-type": "application/json"})
    if joined.status_code != 200:
        return {"success": False, "output": {"error": f"HTTP {joined.status_code}"}}
    event_id = joined.json()["event_id"]
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": client.session_hash}, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("event_id") == event_id and message.get("msg") == "process_completed":
                    return message
    raise AssertionError("no completion")


class StandIn:
    """A `spaces.GPU` stand-in: counts decorated functions and calls, and records what runs inside."""

    def __init__(self):
        self.decorated, self.inside, self.calls = [], False, 0

    def __call__(self, fn):
        self.decorated.append(fn.__name__)

        def lent(*args, **kwargs):
            self.inside, self.calls = True, self.calls + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside = False
        return lent

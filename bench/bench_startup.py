"""Time from `python app.py` to the first answered request, with the app's default model.

5. Starts `python app.py --port PORT` (HF_HUB_OFFLINE=1, Gradio analytics off) and measures
   - until GET / answers with HTTP 200 ("server answers HTTP"), and
   - until the first real request to ENDPOINT, made with gradio_client, has its answer.
   If the app has no ENDPOINT (it is being rewritten) or it needs inputs this script cannot fill,
   only the HTTP time is reported, with the endpoints the app does have.

Weights come from checkpoints/ (or the data folder beside the checkout when checkpoints/ lacks them), never the network.

    python -m bench.bench_startup [--repeats 3] [--image assets/chelsea.png] [--timeout 300]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from vit_inspect.core.handle import DEFAULT_MODEL

from .common import REPO, SHARED, print_header, report, set_threads

ENDPOINT = "/analyze"  # api_name of the first real request: an image in, predictions and every map out
IMAGE_COMPONENTS = ("Image", "File", "ImageEditor")  # inputs given the test image
POLL_SECONDS = 0.05  # between HTTP polls


@dataclass(frozen=True)
class Startup:
    """One cold start of the app."""

    http_s: float  # launch -> GET / answers 200
    first_request_s: float | None  # launch -> first ENDPOINT answer; None when not measured
    request_s: float | None  # the first request alone (client connect + predict)
    note: str  # why the request was not measured, or what was called


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def app_environment() -> dict[str, str]:
    """The environment of the app process: offline, no analytics, weights found locally."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    weights = f"{DEFAULT_MODEL}.safetensors"
    if not (REPO / "checkpoints" / weights).is_file() and (SHARED / "models" / weights).is_file():
        env.setdefault("VIT_INSPECT_CHECKPOINTS", str(SHARED / "models"))
    return env


def wait_for_http(url: str, server: subprocess.Popen, deadline: float) -> None:
    """Poll GET `url` until it answers 200; raise if the server exits or the deadline passes."""
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"app.py exited with code {server.returncode} before answering HTTP")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"no HTTP answer from {url} in time")


def request_arguments(endpoint: dict, image: str) -> dict | None:
    """Keyword arguments for the endpoint: the image for image inputs, defaults for the rest;
    None when an input is neither an image nor has a default."""
    from gradio_client import handle_file

    arguments = {}
    for parameter in endpoint.get("parameters", []):
        name = parameter.get("parameter_name") or parameter.get("label")
        if parameter.get("component") in IMAGE_COMPONENTS:
            arguments[name] = handle_file(image)
        elif parameter.get("parameter_has_default"):
            arguments[name] = parameter.get("parameter_default")
        else:
            return None
    return arguments


def first_request(url: str, image: str) -> tuple[bool, str]:
    """Connect with gradio_client and call ENDPOINT once; (called, note)."""
    from gradio_client import Client

    client = Client(url, verbose=False, download_files=False)
    api = client.view_api(print_info=False, return_format="dict")
    named = api.get("named_endpoints", {})
    if ENDPOINT not in named:
        return False, f"no {ENDPOINT} endpoint; the app has: {', '.join(sorted(named)) or 'none'}"
    arguments = request_arguments(named[ENDPOINT], image)
    if arguments is None:
        return False, f"{ENDPOINT} needs an input without a default that is not an image"
    client.predict(**arguments, api_name=ENDPOINT)
    return True, f"{ENDPOINT}({', '.join(arguments)})"


def cold_start(image: str, timeout: float) -> Startup:
    """Launch app.py, wait for HTTP, make the first request, stop the app."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        server = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=REPO, env=app_environment(),
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_http(url, server, start + timeout)
            http = time.perf_counter() - start
            called, note = first_request(url, image)
            done = time.perf_counter() - start
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return Startup(http_s=http, first_request_s=done if called else None,
                   request_s=done - http if called else None, note=note)


def seconds(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "not measured"
    return f"{statistics.median(known):.2f} ({min(known):.2f}–{max(known):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed cold starts (after 1 untimed warm-up start)")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"), help="image sent with the request")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a start may take before failing")
    args = parser.parse_args()
    set_threads()  # this process only; the app sets its own threads
    print_header(f"Start-up of app.py to the first answered request ({DEFAULT_MODEL})")
    cold_start(args.image, args.timeout)  # warm-up: file-system caches, compiled bytecode
    runs = [cold_start(args.image, args.timeout) for _ in range(args.repeats)]
    print(f"Median (min–max) of {args.repeats} cold starts after 1 warm-up start; each start is a new process "
          f"`python app.py --port PORT` with HF_HUB_OFFLINE=1 and GRADIO_ANALYTICS_ENABLED=False. "
          f"Request: {runs[-1].note}.\n")
    print(report("startup", ("step", "seconds"), [
        ("launch -> server answers HTTP (GET /)", seconds([r.http_s for r in runs])),
        ("first request alone (gradio_client connect + view_api + predict)", seconds([r.request_s for r in runs])),
        (f"**launch -> first answered request ({ENDPOINT})**", seconds([r.first_request_s for r in runs])),
    ], key=("step",)))


if __name__ == "__main__":
    main()

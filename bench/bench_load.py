"""Load: N simulated users at once against `python app.py`, each a session of its own, on this machine.

For each N, a fresh app process (default model, HF_HUB_OFFLINE=1, `--memory-budget` as given) serves N
users started together. Each user, through gradio_client: uploads one of the example photos (a new image:
the pass and the first view), makes ``--redraws`` rollout redraws (head fusion, discard ratio and layer range
varied, as a user moving the sliders), changes the class once, and scores faithfulness once, with
``--think-s`` seconds of think time before every action after the upload. Think time is the user's, not a
timing claim: the latencies are measured from each request's submission to its answer, queue included.

Reported per N: p50 and p95 latency of a new image, a redraw, a class change and a scoring; failed requests
(an exception from the client, or no answer within ``--request-timeout``); the largest queue position any
request saw; and the server's peak resident memory (VmHWM from /proc) against ``--memory-budget``.

    python -m bench.bench_load [--users 1 4 8 16] [--redraws 10] [--think-s 1.0] [--memory-budget 4]
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gradio_client import Client, handle_file

from .bench_startup import app_environment, free_port, wait_for_http
from .common import REPO, print_header, report

PHOTOS = sorted((REPO / "assets").glob("*.png")) + sorted((REPO / "assets").glob("*.jpg"))
ACTIONS = ("new image", "redraw", "class change", "faithfulness")


@dataclass
class Tally:
    """Latencies per action, failures and the largest queue position seen, shared by the user threads."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ACTIONS})
    failures: list[str] = field(default_factory=list)
    queue_position: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, client: Client, action: str, timeout: float, *args, **kwargs) -> bool:
        """Submit one request, follow its queue position, wait for its answer; True when it answered."""
        start = time.perf_counter()
        try:
            job = client.submit(*args, **kwargs)
            while not job.done():
                position = job.status().rank
                if position is not None:
                    with self.lock:
                        self.queue_position = max(self.queue_position, int(position) + 1)
                if time.perf_counter() - start > timeout:
                    job.cancel()
                    raise TimeoutError(f"no answer in {timeout:.0f} s")
                time.sleep(0.05)  # polling the job's status, not a timing claim
            job.result()
        except Exception as exc:  # counted and reported: the load goes on
            with self.lock:
                self.failures.append(f"{action}: {type(exc).__name__}: {str(exc)[:200]}")
            return False
        with self.lock:
            self.seconds[action].append(time.perf_counter() - start)
        return True


def one_user(url: str, index: int, args: argparse.Namespace, tally: Tally) -> None:
    """One visitor's session: an upload, redraws, a class change and a scoring, with think time."""
    rng = random.Random(index)
    client = Client(url, verbose=False, download_files=False)
    photo = handle_file(str(PHOTOS[index % len(PHOTOS)]))
    if not tally.call(client, "new image", args.request_timeout, photo, api_name="/analyze"):
        return
    for _ in range(args.redraws):
        time.sleep(args.think_s)  # the user looks at the page before moving a slider
        first = rng.randrange(0, 12)
        tally.call(client, "redraw", args.request_timeout, head_fusion=rng.choice(("mean", "max", "min")),
                   discard_ratio=rng.choice((0.0, 0.5, 0.9)), first_layer=first, last_layer=rng.randrange(first, 12),
                   api_name="/rollout")
    time.sleep(args.think_s)
    tally.call(client, "class change", args.request_timeout, str(rng.randrange(0, 1000)), "", api_name="/set_target")
    time.sleep(args.think_s)
    tally.call(client, "faithfulness", args.request_timeout, api_name="/faithfulness")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmHWM")


def percentile(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.2f} s" if values else "–"


def run(users: int, args: argparse.Namespace) -> list[object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--device", "cpu",
                               "--memory-budget", str(args.memory_budget)],
                              cwd=REPO, env=app_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tally = Tally()
    try:
        wait_for_http(url, server, time.perf_counter() + 300)
        start = time.perf_counter()
        with ThreadPoolExecutor(users) as pool:
            list(pool.map(lambda i: one_user(url, i, args, tally), range(users)))
        wall = time.perf_counter() - start
        peak = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    for failure in tally.failures:
        print(f"N={users}: {failure}", file=sys.stderr)
    s = tally.seconds
    return [users, percentile(s["new image"], 50), percentile(s["new image"], 95), percentile(s["redraw"], 50),
            percentile(s["redraw"], 95), percentile(s["class change"], 50), percentile(s["faithfulness"], 50),
            percentile(s["faithfulness"], 95), len(tally.failures), tally.queue_position,
            f"{peak:.0f} MB / {args.memory_budget * 2 ** 30 / 1e6:.0f} MB", f"{wall:.0f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--redraws", type=int, default=10)
    parser.add_argument("--think-s", type=float, default=1.0, help="think time before each action after the upload")
    parser.add_argument("--memory-budget", type=float, default=4.0, help="the app's --memory-budget, GiB")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="a request unanswered this long fails")
    args = parser.parse_args()
    print_header("Load: simulated users at once against the served app")
    rows = [run(users, args) for users in args.users]
    print(report("load", ("users", "new image p50", "new image p95", "redraw p50", "redraw p95", "class change p50",
                          "faithfulness p50", "faithfulness p95", "failed requests", "largest queue position",
                          "peak RSS / --memory-budget", "wall time"), rows, key=("users",)))


if __name__ == "__main__":
    main()

"""Soak: many requests from many sessions against `python app.py`; resident memory must level off.

Starts the app (default model, HF_HUB_OFFLINE=1, `--max-sessions` small enough to reach within the
run) and sends REQUESTS requests from CLIENTS threads. Every request opens a fresh session (a new
gradio_client.Client: the worst case, nobody comes back), analyses one of the example photos and
redraws the attention of one layer from that session. The server's resident memory (VmRSS from
/proc) is sampled before, every `--every` requests during, and after the run. Bounded means: once
the session capacity is full, memory stops growing (last third of the samples within a few per cent
of the middle third). The request loop is bounded in count and time and only talks to 127.0.0.1.

    python -m bench.bench_soak [--requests 300] [--clients 4] [--max-sessions 40] [--every 25]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gradio_client import Client, handle_file

from .bench_startup import app_environment, free_port, wait_for_http
from .common import REPO, markdown_table, print_header, report

PHOTOS = sorted((REPO / "assets").glob("*.png")) + sorted((REPO / "assets").glob("*.jpg"))
DEADLINE_S = 1800  # the whole soak stops by itself after this long


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one_request(url: str, index: int) -> None:
    client = Client(url, verbose=False)  # a new session every time
    client.predict(handle_file(str(PHOTOS[index % len(PHOTOS)])), api_name="/analyze")
    client.predict(layer=index % 12, head=index % 3, api_name="/attention")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=40)
    parser.add_argument("--every", type=int, default=25, help="sample memory every this many requests")
    args = parser.parse_args()
    print_header("Soak: resident memory of the app over many sessions")

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--device", "cpu",
                               "--max-sessions", str(args.max_sessions)],
                              cwd=REPO, env=app_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.perf_counter()
    samples: list[tuple[str, int, float]] = []
    failures = 0
    try:
        wait_for_http(url, server, time.perf_counter() + 300)
        samples.append(("before (started, idle)", 0, rss_mb(server.pid)))
        done = 0
        with ThreadPoolExecutor(args.clients) as pool:
            while done < args.requests and time.perf_counter() - start < DEADLINE_S:
                chunk = range(done, min(done + args.every, args.requests))
                for outcome in pool.map(lambda i: _safe(one_request, url, i), chunk):
                    failures += not outcome
                done = chunk.stop
                samples.append(("during", done, rss_mb(server.pid)))
        samples.append(("after (idle)", done, rss_mb(server.pid)))
    finally:
        server.terminate()
        server.wait(timeout=30)

    during = [mb for kind, _, mb in samples if kind == "during"]
    third = max(1, len(during) // 3)
    middle, last = max(during[third:2 * third] or during), max(during[-third:])
    growth = (last - middle) / middle
    print(markdown_table(("sample", "requests done", "VmRSS MB"), [(k, n, f"{mb:.0f}") for k, n, mb in samples]))
    print()
    print(report("soak", ("measure", "value"), [
        ("requests (each a new session) / clients", f"{done} / {args.clients}"),
        ("failed requests", failures),
        ("--max-sessions", args.max_sessions),
        ("peak of middle third → peak of last third", f"{middle:.0f} → {last:.0f} MB ({100 * growth:+.1f} %)"),
        ("levels off (last third within 5 % of middle third)", "yes" if growth <= 0.05 else "NO"),
        ("wall time", f"{time.perf_counter() - start:.0f} s"),
    ], key=("measure",)))


def _safe(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except Exception as exc:  # a failed request is counted and reported, the soak goes on
        print(f"request failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False


if __name__ == "__main__":
    main()

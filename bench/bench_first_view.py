"""The first view in Chromium, this page against an older one (default: the app before its sections), in one run.

Both pages are served by their own `python app.py --device cpu --weights checkpoints/<DeiT-Ti>` (HF_HUB_OFFLINE=1)
and driven by one Chromium through Playwright, taking turns
(old, new, old, new, ...) so that a change of load on a shared machine hits both alike:

1. **page load -> first view**: `page.goto` until the pictures of the first view have loaded. The new page
   analyses its example on load (no control touched) and its first view is three maps; the older page
   opens on an empty Predictions tab, so the script uploads the same photo (assets/chelsea.png) the moment
   its input appears, and waits for that tab's pictures (the model's input and the seen region: the
   answer that carries them carries its maps too, drawn into tabs Gradio renders only when opened).
2. **new image -> first view**: an upload of another photo (the example photos in turn) until those
   pictures have loaded anew.

Each server is warmed up first (one page load, its model loaded). Medians over ``--repeats`` turns, and
the ratio new / old of each, are printed as markdown and written to bench/results/first_view.csv.

    python -m bench.bench_first_view [--old REF] [--repeats 7]
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
from pathlib import Path

from vit_inspect.core.handle import DEFAULT_MODEL

from .common import REPO, print_header, report

PHOTOS = ("coffee.png", "astronaut.png", "rocket.jpg", "china.jpg", "flower.jpg")  # "new image", in turn
FIRST = "chelsea.png"  # the new page's example, and what the older page is given on load
MAPS = {"new": ("first-attention", "first-rollout", "first-relevance"),  # the first view's three maps
        "old": ("crop", "seen-region")}  # the older page's first tab (Predictions): its pictures
CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 120_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SECTIONS = "vit_inspect/ui/sections.py"  # the page's sections: the older page is the app before this file


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def older_page(ref: str | None) -> str:
    """The commit of the older page: ``ref``'s merge base with HEAD, or by default the first parent of the
    commit that brought the page's sections (`SECTIONS`) into HEAD's first-parent history (on the main line: the
    app just before the merge of its sections and first view)."""
    if ref is not None:
        return git("merge-base", "HEAD", ref)
    added = git("log", "--first-parent", "--diff-filter=A", "--format=%H", "HEAD", "--", SECTIONS).splitlines()
    if not added:
        raise SystemExit(f"no commit adds {SECTIONS} in this history: name the older page with --old REF")
    return git("rev-parse", f"{added[-1]}^1")


def old_tree(ref: str | None, folder: Path) -> Path:
    """The older page (`older_page`) unpacked into ``folder`` (git archive), with this checkout's weights."""
    base = older_page(ref)
    archive = subprocess.run(["git", "archive", base], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    (folder / "checkpoints").mkdir(exist_ok=True)
    for weights in (REPO / "checkpoints").glob("*.safetensors"):
        target = folder / "checkpoints" / weights.name
        if not target.exists():
            target.symlink_to(weights)
    return folder


def serve(tree: Path, device: str = "cpu", weights: Path | None = None,
          log: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`python app.py` of ``tree`` on a free port and ``device``, serving the default model with ``weights`` (by
    default this checkout's real ones), returned once it answers HTTP; its output goes to ``log`` if given."""
    port = free_port()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                        "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))}
    weights = weights or REPO / "checkpoints" / f"{DEFAULT_MODEL}.safetensors"  # named: main looked in the wrong folder
    with open(log or os.devnull, "w") as out:
        server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--device", device, "--weights",
                                   str(weights)], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return server, url
        except (urllib.error.URLError, ConnectionError, OSError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                said = log.read_text()[-2000:] if log is not None else ""
                raise RuntimeError(f"the app in {tree} did not start {said}") from None
            time.sleep(0.1)


def maps_loaded(page, ids: tuple[str, ...], before: dict | None = None) -> dict:
    """Wait until every map of ``ids`` shows a loaded picture (another than ``before``'s); their sources."""
    page.wait_for_function(
        """([ids, before]) => ids.every(id => { const i = document.querySelector('#' + id + ' img');
             return i && i.complete && i.naturalWidth > 0 && (!before || i.src !== before[id]); })""",
        arg=[list(ids), before], timeout=TIMEOUT_MS)
    return page.evaluate("ids => Object.fromEntries(ids.map(id => [id, document.querySelector('#' + id + ' img').src]))",
                         list(ids))


def load_page(page, url: str, kind: str) -> float:
    """Seconds from `page.goto` to the first view's pictures."""
    start = time.perf_counter()
    page.goto(url, wait_until="commit")
    if kind == "old":
        page.locator("#input-image input[type=file]").set_input_files(str(REPO / "assets" / FIRST),
                                                                       timeout=TIMEOUT_MS)
    maps_loaded(page, MAPS[kind])
    return time.perf_counter() - start


def new_image(page, kind: str, photo: str) -> float:
    """Seconds from an upload of ``photo`` to the first view's pictures drawn for it."""
    before = maps_loaded(page, MAPS[kind])
    start = time.perf_counter()
    page.locator("#input-image input[type=file]").set_input_files(str(REPO / "assets" / photo))
    maps_loaded(page, MAPS[kind], before)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=None, help="git ref of the older page (its merge base with HEAD is served); "
                        f"default: the app just before {SECTIONS} came into this history")
    parser.add_argument("--repeats", type=int, default=7, help="turns of each measurement per page")
    args = parser.parse_args(argv)
    from playwright import sync_api

    print_header("The first view: page load and a new image, older page against this one")
    with tempfile.TemporaryDirectory(prefix="vit_inspect_old_page_") as folder:
        trees = {"old": old_tree(args.old, Path(folder)), "new": REPO}
        servers = {kind: serve(tree) for kind, tree in trees.items()}
        times = {(kind, what): [] for kind in trees for what in ("load", "image")}
        try:
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
                pages = {kind: browser.new_page(viewport={"width": 1366, "height": 768}) for kind in trees}
                for kind, page in pages.items():  # warm-up: the model loaded, the page's files cached
                    load_page(page, servers[kind][1], kind)
                for turn in range(args.repeats):
                    for kind, page in pages.items():
                        times[kind, "load"].append(load_page(page, servers[kind][1], kind))
                    for kind, page in pages.items():
                        times[kind, "image"].append(new_image(page, kind, PHOTOS[turn % len(PHOTOS)]))
                browser.close()
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait(30)
    rows = []
    for what, words in (("load", "page load -> first view"), ("image", "new image -> first view")):
        old, new = (statistics.median(times[kind, what]) for kind in ("old", "new"))
        spread = {kind: f"{min(times[kind, what]):.2f}–{max(times[kind, what]):.2f}" for kind in ("old", "new")}
        rows.append((words, f"{old:.2f} ({spread['old']})", f"{new:.2f} ({spread['new']})", f"{new / old:.2f}"))
    print(report("first_view", ("seconds, median (min–max)", "older page", "this page", "ratio new / old"), rows,
                 key=("seconds, median (min–max)",)))


if __name__ == "__main__":
    main()

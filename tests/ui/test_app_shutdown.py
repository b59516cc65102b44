"""`python app.py` stopped with SIGTERM (docker stop, a Space restarting) or Ctrl-C removes its private
upload folder and its spill folders, with the uploads in them, and exits with status 0."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
from support import REPO
from support.app import APP_MARKS, CHELSEA, app_process, free_port

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: real app processes started and stopped

FOLDERS = ("vit_inspect_gradio_", "vit_inspect_spill_")


def ours(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(FOLDERS))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_removes_its_folders(tmp_path, stop):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_TEMP_DIR"} | {
        "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    server = app_process(port, env)
    try:
        with CHELSEA.open("rb") as photo:
            upload = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload", files={"files": photo})
        assert upload.status_code == 200
        (uploaded,) = upload.json()
        folders = ours(tmp_path)
        assert [name.startswith(FOLDERS[0]) for name in folders].count(True) == 1 and len(folders) >= 2
        assert uploaded.startswith(str(tmp_path / folders[0])) and os.path.isfile(uploaded)
        server.send_signal(stop)
        log, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, log
    assert ours(tmp_path) == [] and not os.path.exists(uploaded)
    assert "Traceback" not in log


def test_a_stopped_server_runs_its_exit_hooks_then_ends_with_status_0():
    """`app.exit_cleanly`: the `atexit` hooks run and the output is flushed, and nothing after it runs (the
    process ends there, without the libraries' static destructors)."""
    code = ("import atexit, app; atexit.register(print, 'hook ran'); print('before', end=''); "
            "app.exit_cleanly(); print('not reached')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items()} | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "beforehook ran\n"

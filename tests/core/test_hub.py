"""Hub access fails fast and remembers: an unreachable endpoint costs seconds once, then nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO

from vit_inspect.core import hub

# Run in a fresh interpreter: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when imported.
SCRIPT = """
import json, time
import timm  # imported before timing, as in a running server
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.load import load_model
times, messages = [], []
for _ in range(2):
    start = time.perf_counter()
    try:
        load_model("deit_small_patch16_224", device="cpu", checkpoint_dir="{empty}")
    except VitInspectError as exc:
        messages.append(str(exc))
    times.append(time.perf_counter() - start)
print(json.dumps({{"times": times, "messages": messages}}))
"""


def test_unreachable_endpoint_fails_within_seconds_and_is_remembered(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(empty=tmp_path / "empty")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = report["times"]
    assert len(report["messages"]) == 2, "both tries must fail with a message, not hang or crash"
    assert "does not answer" in report["messages"][0] and "--weights" in report["messages"][0]
    assert report["messages"][1] == report["messages"][0]
    assert first < 5.0, f"the first failure took {first:.1f} s"
    assert second < 0.5, f"the remembered failure took {second:.2f} s"


def test_failures_expire(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(hub, "clock", lambda: now[0])
    hub.forget()
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    calls = []
    with pytest.raises(RuntimeError):
        with hub.hub_access("some-model") as online:
            calls.append(online)
            raise RuntimeError("no weights")
    assert calls == [False]  # an unreachable hub runs the look-up offline
    now[0] += hub.FAILURE_TTL_S - 1
    with pytest.raises(RuntimeError, match="no weights"):  # remembered: the block does not run again
        with hub.hub_access("some-model"):
            calls.append("ran")
    assert calls == [False]
    now[0] += 2  # expired: the look-up runs again
    with hub.hub_access("some-model"):
        calls.append("ran")
    assert calls == [False, "ran"]
    hub.forget()


def test_remembered_failures_are_bounded_and_keep_no_frames(monkeypatch):
    """At most MAX_FAILURES names, expired ones dropped first, then the oldest; each raise is a fresh copy
    (type, message, public sentence) whose traceback holds only its own raise, not every earlier one."""
    from vit_inspect.core.errors import ModelNotFoundError

    now = [0.0]
    monkeypatch.setattr(hub, "clock", lambda: now[0])
    monkeypatch.setattr(hub, "MAX_FAILURES", 3)
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    hub.forget()

    def fail(name: str):
        try:
            with hub.hub_access(name):
                raise ModelNotFoundError(f"no {name} at /srv/secret", public=f"no {name}")
        except ModelNotFoundError as exc:
            return exc

    def depth(exc) -> int:
        tb, frames = exc.__traceback__, 0
        while tb is not None:
            tb, frames = tb.tb_next, frames + 1
        return frames

    first = fail("a")
    again = [fail("a") for _ in range(5)]  # remembered: the block does not run, the kept error is raised
    assert [depth(exc) for exc in again] == [3] * 5  # fail, hub_access's __enter__, remembered raise: never more
    assert all(exc is not first and exc.public == "no a" and str(exc) == "no a at /srv/secret" for exc in again)
    assert hub._failures["a"][1].__traceback__ is None and hub._failures["a"][1].__context__ is None
    now[0] = 10.0
    for name in "bcd":
        fail(name)
    assert list(hub._failures) == ["b", "c", "d"]  # "a" was the oldest of four
    now[0] = 10.0 + hub.FAILURE_TTL_S
    fail("e")  # b, c and d expired: dropped before any count
    assert list(hub._failures) == ["e"]
    for count in range(1, 1000):
        fail(f"name{count}")
    assert len(hub._failures) == 3
    hub.forget()


def test_probe_of_a_closed_port_is_false_and_cached(monkeypatch):
    hub.forget()
    probes = []
    real_probe = hub.probe_endpoint
    monkeypatch.setattr(hub, "endpoint", lambda: "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "probe_endpoint", lambda url: probes.append(url) or real_probe(url))
    assert hub.hub_reachable() is False  # nothing listens on the discard port of loopback
    assert hub.hub_reachable() is False
    assert probes == ["http://127.0.0.1:9"], "the second question must be answered from the cache"
    hub.forget()

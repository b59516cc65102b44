"""Progress on stderr: one line rewritten on a terminal, a line per update anywhere else (a log, a pipe, CI),
and an error after a half-done progress line on a terminal starts a line of its own."""
from __future__ import annotations

import io
import sys

from vit_inspect.cli import analyze
from vit_inspect.cli.common import progress_line
from vit_inspect.cli.main import main
from vit_inspect.core.errors import VitInspectError


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stderr(monkeypatch, stream: io.StringIO) -> io.StringIO:
    """``stream`` as sys.stderr for the rest of the test (set in the test's body: pytest's capture sets
    sys.stderr again when the body starts)."""
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_off_a_terminal_each_update_is_a_line(monkeypatch):
    log_file = stderr(monkeypatch, io.StringIO())
    progress = progress_line("{done}/{total} images")
    for done in range(1, 4):
        progress(done, 3)
    assert log_file.getvalue() == "1/3 images\n2/3 images\n3/3 images\n"


def test_on_a_terminal_one_line_is_rewritten_and_ended_at_the_last(monkeypatch):
    terminal = stderr(monkeypatch, Terminal())
    progress = progress_line("{done}/{total} passes")
    for done in range(1, 4):
        progress(done, 3)
    assert terminal.getvalue() == "\r1/3 passes\r2/3 passes\r3/3 passes\n"


def fails_half_way(args) -> None:
    progress = progress_line("{done}/{total} images")
    progress(1, 3)
    raise VitInspectError("the second image is not an image")


def test_an_error_after_half_a_terminal_line_starts_its_own(monkeypatch):
    terminal = stderr(monkeypatch, Terminal())
    monkeypatch.setattr(analyze, "run", fails_half_way)
    assert main(["analyze", "x.png"]) == 1
    assert terminal.getvalue() == "\r1/3 images\nerror: the second image is not an image\n"


def test_an_error_off_a_terminal_follows_the_last_line(monkeypatch):
    log_file = stderr(monkeypatch, io.StringIO())
    monkeypatch.setattr(analyze, "run", fails_half_way)
    assert main(["analyze", "x.png"]) == 1
    assert log_file.getvalue() == "1/3 images\nerror: the second image is not an image\n"


def test_an_error_after_a_finished_line_adds_no_blank_line(monkeypatch):
    terminal = stderr(monkeypatch, Terminal())
    def fails_after(args) -> None:
        progress_line()(2, 2)
        raise VitInspectError("no labels")

    monkeypatch.setattr(analyze, "run", fails_after)
    assert main(["analyze", "x.png"]) == 1
    assert terminal.getvalue() == "\r2/2 images\nerror: no labels\n"

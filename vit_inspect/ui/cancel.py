"""The app's one way of cancelling a long action (the sanity checks, head importance): each browser session's
run holds a flag, the library function reads it before its next pass (``cancelled=flag.is_set``) and raises
`core.errors.Cancelled`, and the action's Cancel button sets it, off the queue."""
from __future__ import annotations

import threading
from contextlib import contextmanager


def session_of(request) -> str:
    """The browser session a request comes from ("anonymous" without one)."""
    return getattr(request, "session_hash", None) or "anonymous"


class Cancels:
    """Per browser session, the cancel flag of its running action of one kind, and the Cancel button's two
    sentences: when nothing of this kind runs for the session, and when its run will stop."""

    def __init__(self, nothing: str, cancelling: str):
        self.nothing, self.cancelling = nothing, cancelling
        self.running: dict[str, threading.Event] = {}  # session hash -> its run's flag

    @contextmanager
    def run(self, request):
        """The flag of this browser session's new run, forgotten when the run ends (however it ends)."""
        session_id = session_of(request)
        stop = self.running[session_id] = threading.Event()
        try:
            yield stop
        finally:
            if self.running.get(session_id) is stop:
                del self.running[session_id]

    def cancel(self, request) -> str:
        """Set this browser session's flag; the sentence the Cancel button shows."""
        stop = self.running.get(session_of(request))
        if stop is None:
            return self.nothing
        stop.set()
        return self.cancelling

"""Which of a session's overlapping draws of one panel may still show its picture.

Redraws run in parallel (several per server), and more than one event writes the same panel: the
attention map redraws on its sliders, on a clicked patch, on a typed patch and from the Heads tab.
Two such draws of one session can finish in either order, so an older picture could land after a
newer one and stay, while the controls say something else. Each draw takes a ticket when it begins;
when it ends, it shows its picture only if no later draw of that panel began meanwhile (the newest
begun wins). A new pass (an upload, another class) supersedes every draw begun before it ended,
since those drew the previous result.

Bounded in bytes: at most `max_keys` (session, panel) pairs are remembered, the least recently used
forgotten first (a draw whose pair was forgotten shows its picture, as it would without ordering), and a
session id, which a client chooses, is kept as a 16-byte digest whatever its length.
No UI toolkit is imported here: the caller passes the session's id (Gradio's `session_hash`).
"""
from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from typing import Iterable

DEFAULT_MAX_KEYS = 8192  # (session, panel) pairs; about 1 MB at most


def _key(session: str, panel: str) -> tuple[bytes, str]:
    """(a 16-byte digest of the client's session id, one of the app's own panel names)."""
    return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=16).digest(), panel


def session_hash(request: object) -> str | None:
    """The web session an event came from (Gradio's `Request.session_hash`); None for a direct call."""
    value = getattr(request, "session_hash", None)
    return value if isinstance(value, str) else None


class DrawOrder:
    """Tickets per (session, panel): `begin` when a draw starts, `is_latest` when it ends."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS):
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._latest: OrderedDict[tuple[bytes, str], int] = OrderedDict()

    def begin(self, session: str | None, panel: str) -> int:
        """A ticket for a draw of `panel` starting now; it makes every earlier one of the pair stale.
        A draw without a session id (a direct call, not a web event) gets 0 and is never stale."""
        if session is None:
            return 0
        key = _key(session, panel)
        with self._lock:
            ticket = next(self._numbers)
            self._latest[key] = ticket
            self._latest.move_to_end(key)
            while len(self._latest) > self.max_keys:
                self._latest.popitem(last=False)
            return ticket

    def supersede(self, session: str | None, panels: Iterable[str]) -> None:
        """Every draw of these panels begun so far is stale (a new pass replaced what they drew)."""
        for panel in panels:
            self.begin(session, panel)

    def is_latest(self, session: str | None, panel: str, ticket: int) -> bool:
        """Whether the draw holding `ticket` is the newest begun for (session, panel)."""
        if session is None or ticket == 0:
            return True
        with self._lock:
            latest = self._latest.get(_key(session, panel))
        return latest is None or latest == ticket

    def __len__(self) -> int:
        return len(self._latest)

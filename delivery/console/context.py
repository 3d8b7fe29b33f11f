"""What a page reaches during a request: the console's shared state, this request's database
session, the audit actor of the signed-in user, and the ``before`` id of a keyset page."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from flask import g, request
from sqlalchemy.orm import Session, sessionmaker

from delivery.config.settings import Settings
from delivery.console.auth import Csrf, Users
from delivery.console.jobs import Jobs
from delivery.errors import InvalidFilter

__all__ = ["ConsoleState", "TimedCache", "actor", "before", "db", "state"]


class TimedCache:
    """Values kept for a few seconds, so that a dashboard left open (or several operators on
    it) does not re-run the same aggregate over a large outbox on every load."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._values: dict[object, tuple[float, object]] = {}

    def get(self, key: object, ttl: float, compute: Callable[[], object]) -> object:
        now = self._clock()
        with self._lock:
            found = self._values.get(key)
            if found is not None and now - found[0] < ttl:
                return found[1]
        value = compute()
        with self._lock:
            self._values[key] = (now, value)
        return value


class ConsoleState:
    """What the console's pages share: settings, sessions, users, tokens, bulk jobs."""

    def __init__(
        self,
        settings: Settings,
        users: Users,
        sessions: sessionmaker[Session],
        *,
        flower_url: str | None = None,
        trace_url: str | None = None,
    ) -> None:
        self.settings = settings
        self.users = users
        self.sessions = sessions
        self.csrf = Csrf(os.urandom(32))
        self.jobs = Jobs(sessions)
        self.cache = TimedCache()
        # Flower's address as the operator's browser reaches it (DELIVERY_FLOWER_URL); without
        # one, no page links to Flower.
        self.flower_url = (flower_url or "").strip().rstrip("/") or None
        # The operators' trace UI (DELIVERY_TRACE_URL, checked by ``app.trace_url``: with
        # ``{trace_id}``, a Jaeger or Tempo address); without one, a trace id is not linked.
        self.trace_url = trace_url


def state() -> ConsoleState:
    """The console state of the app serving this request."""
    found = g.get("console_state")
    assert isinstance(found, ConsoleState)
    return found


def db() -> Session:
    """This request's session (closed when the request ends; pages commit themselves)."""
    if "db" not in g:
        g.db = state().sessions()
    session = g.db
    assert isinstance(session, Session)
    return session


def actor() -> str:
    """The audit actor of this request: ``console:<user>``."""
    return f"console:{g.user}"


def before(what: str) -> int | None:
    """This request's ``before`` (the keyset of the next page): an id, or None when absent;
    ``InvalidFilter`` saying it ``is not {what}`` otherwise."""
    text = request.args.get("before", "").strip()
    if text and not text.isdigit():
        raise InvalidFilter("before", f"is not {what}")
    return int(text) if text else None

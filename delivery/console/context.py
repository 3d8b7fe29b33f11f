"""What a page reaches during a request: the console's shared state, this request's database
session, and the audit actor of the signed-in user."""

from __future__ import annotations

import os

from flask import g
from sqlalchemy.orm import Session, sessionmaker

from delivery.config.settings import Settings
from delivery.console.auth import Users
from delivery.console.csrf import Csrf
from delivery.console.jobs import Jobs

__all__ = ["ConsoleState", "actor", "db", "state"]


class ConsoleState:
    """What the console's pages share: settings, sessions, users, tokens, bulk jobs."""

    def __init__(self, settings: Settings, users: Users, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.users = users
        self.sessions = sessions
        self.csrf = Csrf(os.urandom(32))
        self.jobs = Jobs(sessions)
        flower = os.environ.get("DELIVERY_FLOWER_URL", "http://127.0.0.1:5555")
        self.flower_url = flower.rstrip("/")


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

"""SQLAlchemy over Django's own database connection.

The library's code (``delivery.enqueue``, ``delivery.ops``) takes a SQLAlchemy ``Session``.
To run it inside a Django transaction, the session is bound to an engine whose connections
*are* Django's DB-API connection of the current thread. Django owns that connection: it
begins, commits and rolls back (``transaction.atomic``) and closes it. SQLAlchemy is handed
a proxy whose ``commit``, ``rollback`` and ``close`` do nothing, so closing the session never
ends Django's transaction. Never call ``commit`` on such a session: Django does.

Supported backend: PostgreSQL through psycopg 3 (Django's default driver when installed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from django.db import connections
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from delivery.errors import ConfigError

__all__ = ["borrowed_engine", "borrowed_session", "sqlalchemy_url"]

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


class _Borrowed:
    """Django's DB-API connection as SQLAlchemy sees it: everything is delegated except
    ending the transaction or the connection, which belong to Django."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def commit(self) -> None:
        """Django commits."""

    def rollback(self) -> None:
        """Django rolls back."""

    def close(self) -> None:
        """Django closes."""

    def add_notice_handler(self, handler: Any) -> None:
        """SQLAlchemy's psycopg dialect adds one per checkout; Django's connection keeps its own."""


def _driver_url(vendor: str) -> str:
    if vendor != "postgresql":
        # SQLite is out: Django's sqlite3 converters hand SQLAlchemy datetimes it would parse.
        raise ConfigError(
            "DATABASES", f"delivery.contrib.django needs PostgreSQL (psycopg 3), not {vendor}"
        )
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        raise ConfigError("DATABASES", "delivery.contrib.django needs psycopg 3, not psycopg2")
    return "postgresql+psycopg://"


def sqlalchemy_url(using: str) -> str:
    """A SQLAlchemy URL for ``DATABASES[using]``: where the worker reads what Django writes."""
    wrapper = connections[using]
    params = wrapper.settings_dict
    driver = _driver_url(wrapper.vendor).removesuffix("://")
    port = params.get("PORT")
    url = URL.create(
        driver,
        username=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=int(port) if port else None,
        database=params.get("NAME") or None,
    )
    return url.render_as_string(hide_password=False)


def _borrow(using: str) -> Any:
    wrapper = connections[using]
    wrapper.ensure_connection()
    return _Borrowed(wrapper.connection)


def borrowed_engine(using: str) -> Engine:
    """The engine whose connections are Django's connection ``using`` of the calling thread."""
    with _lock:
        engine = _engines.get(using)
        if engine is None:
            engine = create_engine(
                _driver_url(connections[using].vendor),
                creator=lambda: cast(Any, _borrow(using)),
                poolclass=NullPool,
                pool_reset_on_return=None,
                # No hstore: registering it would change the adapters of Django's connection.
                use_native_hstore=False,
            )
            _engines[using] = engine
        return engine


@contextmanager
def borrowed_session(using: str) -> Iterator[Session]:
    """A session inside Django's current transaction on ``using``; it never commits."""
    session = Session(borrowed_engine(using), autoflush=True, expire_on_commit=False)
    try:
        yield session
        session.flush()
    finally:
        session.close()

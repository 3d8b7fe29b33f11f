"""Engines, sessions and schema migrations."""

from __future__ import annotations

import functools
import select
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["current_revision", "make_engine", "make_sessionmaker", "upgrade"]

_INI = Path(__file__).parents[1] / "alembic.ini"  # delivery/alembic.ini, shipped as package data


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for the outbox. SQLite gets WAL and a busy timeout so that several
    processes (app, relay, workers) can share one file. On PostgreSQL a pooled connection is
    checked before it is lent out, without a round trip (``_quiet_or_replaced``; pass
    ``pool_pre_ping=True`` for SQLAlchemy's ``SELECT 1`` instead). Statement parameters
    (recipients, payloads) are kept out of the engine's error messages and logs (G6)."""
    kwargs.setdefault("hide_parameters", True)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if parsed.get_backend_name() != "postgresql" or kwargs.get("pool_pre_ping"):
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(url, **kwargs)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "checkout", functools.partial(_quiet_or_replaced, engine.dialect))
    return engine


def _quiet_or_replaced(dialect: Any, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Before a pooled PostgreSQL connection is lent out: is it still open? Instead of
    ``pool_pre_ping``'s ``SELECT 1``, a round trip on every checkout (three per message on a
    worker's single path), look at the socket without a round trip. An idle connection
    receives nothing, so a quiet socket is lent out as it is. Something to read is most likely
    the server's goodbye (its termination notice on a restart, ``pg_terminate_backend`` or an
    idle timeout; or end of file), but may be harmless (a notification, a TLS message): then,
    and only then, the connection is pinged as ``pool_pre_ping`` would. A failed ping raises
    ``DisconnectionError``, SQLAlchemy's documented answer: the pool drops that connection and
    checks out another, connecting anew, up to three times. A connection that dies during use
    raises from that use, with or without a ping."""
    if dbapi_connection.closed or getattr(dbapi_connection, "broken", False):  # psycopg2: none
        raise DisconnectionError("the pooled connection is closed")
    try:
        poller = select.poll()
        poller.register(dbapi_connection.fileno(), select.POLLIN)
        quiet = not poller.poll(0)
    except Exception as exc:  # fileno() of a connection psycopg has given up on
        raise DisconnectionError("the pooled connection has no socket") from exc
    if quiet:
        return
    try:
        dialect.do_ping(dbapi_connection)
    except Exception as exc:
        raise DisconnectionError("the pooled connection no longer answers") from exc


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic_config(engine: Engine) -> Config:
    config = Config(str(_INI))
    config.set_main_option("script_location", "delivery:migrations")
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Create or migrate the outbox tables to ``revision`` with the shipped migrations."""
    config = _alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()

"""Engines, sessions, schema migrations, and whether the outbox is usable, in one line.

``check_outbox(url)`` is what worker and beat ask before they start
([docs/deployment.md](../../docs/deployment.md#start-up-checks)): it raises
``ConfigError`` naming ``DELIVERY_DATABASE_URL`` when the database does not answer or is not at
the revision this package ships (``delivery db upgrade`` migrates it). ``database_error``
words any ``OperationalError`` / ``ProgrammingError`` of a command the same way, in one line.
"""

from __future__ import annotations

import functools
import select
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from delivery.errors import ConfigError

__all__ = [
    "DATABASE_VARIABLE",
    "check_outbox",
    "current_revision",
    "database_error",
    "head_revision",
    "make_engine",
    "make_sessionmaker",
    "revisions_between",
    "upgrade",
]

#: The setting that names the outbox: every database error a user reads names it.
DATABASE_VARIABLE = "DELIVERY_DATABASE_URL"
UPGRADE_HINT = "`delivery db upgrade`"

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
    ``pool_pre_ping``'s ``SELECT 1``, a round trip on every checkout, look at the socket: an
    idle connection receives nothing, so a quiet one is lent out as it is. Something to read
    is most likely the server's goodbye (a restart, ``pg_terminate_backend``, an idle timeout)
    but may be harmless (a notification, a TLS message): only then is it pinged. A failed
    check raises ``DisconnectionError``: the pool drops that connection and checks out
    another, as SQLAlchemy documents."""
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


def _alembic_config() -> Config:
    config = Config(str(_INI))
    config.set_main_option("script_location", "delivery:migrations")
    return config


def _scripts() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    """The schema revision this package's migrations end at (what ``upgrade`` migrates to)."""
    head = _scripts().get_current_head()
    assert isinstance(head, str)
    return head


def revisions_between(before: str | None, after: str | None) -> list[tuple[str, str]]:
    """The migrations going from ``before`` to ``after``, oldest first: (revision, summary),
    the summary being the first line of the migration's docstring, without markup."""
    if after is None:
        return []
    found = []
    for rev in _scripts().iterate_revisions(after, before):
        lines = (rev.doc or "").strip().splitlines()
        summary = lines[0].strip().replace("``", "").replace("`", "") if lines else ""
        found.append((rev.revision, summary))
    return list(reversed(found))


def upgrade(engine: Engine, revision: str = "head", *, partition: bool = True) -> bool:
    """Create or migrate the outbox tables to ``revision`` with the shipped migrations. A new
    PostgreSQL outbox (no message yet, at the newest revision) is then partitioned by day
    (``delivery.runtime.partitions``), unless ``partition`` is False; a filled one is left
    as it is (``delivery db partition`` converts it), and a partitioned one has its functions
    brought up to date. Whether it was partitioned now."""
    from delivery.runtime import conversion, partitions

    config = _alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        if partitions.is_partitioned(connection):
            conversion.functions(connection)
        new = (
            partition
            and revision == "head"
            and connection.dialect.name == "postgresql"
            and not partitions.is_partitioned(connection)
            and connection.scalar(text("SELECT NOT EXISTS (SELECT 1 FROM delivery_messages)"))
        )
    if new:
        conversion.partition(engine)
    return bool(new)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def database_error(
    exc: DBAPIError, url: str | None = None, *, upgrading: bool = False
) -> ConfigError:
    """The one-line error for a database error a command or a process start ran into: it
    names ``DELIVERY_DATABASE_URL`` and what to do (``upgrading``: the error is the migration
    command's own, which must not suggest itself), with the driver's last line only (never the
    statement or its parameters)."""
    reason = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[-1].strip()
    where = f" {_shown(url)}" if url else ""
    if "no such table" in reason or ("relation" in reason and "does not exist" in reason):
        problem = f"the outbox{where} has no delivery tables ({reason}): run {UPGRADE_HINT}"
    else:
        then = "or fix the URL" if upgrading else f"and run {UPGRADE_HINT}"
        problem = (
            f"cannot use the outbox{where}: {reason} (is it reachable? create the database, "
            f"e.g. `createdb NAME`, {then})"
        )
    return ConfigError(DATABASE_VARIABLE, problem)


def check_outbox(url: str, *, timeout: float = 5.0) -> None:
    """Raise ``ConfigError`` (key ``DELIVERY_DATABASE_URL``) unless the outbox at ``url``
    answers within about ``timeout`` seconds and is at this package's schema revision."""
    backend = make_url(url).get_backend_name()
    connect_args: dict[str, Any] = {"connect_timeout": max(1, round(timeout))}
    if backend == "sqlite":
        connect_args = {"timeout": timeout}
    engine = create_engine(url, connect_args=connect_args, poolclass=NullPool, hide_parameters=True)
    try:
        revision = current_revision(engine)
    except DBAPIError as exc:
        raise database_error(exc, url) from None
    finally:
        engine.dispose()
    head = head_revision()
    if revision == head:
        return
    if revision is None or revision in {rev for rev, _ in revisions_between(None, head)}:
        raise ConfigError(
            DATABASE_VARIABLE,
            f"{_shown(url)} is at revision {revision or 'none (empty)'}, this package needs "
            f"{head}: run {UPGRADE_HINT}",
        )
    raise ConfigError(
        DATABASE_VARIABLE,
        f"{_shown(url)} is at revision {revision}, which this package does not know (migrated "
        f"by a newer version?): install the version that migrated it",
    )

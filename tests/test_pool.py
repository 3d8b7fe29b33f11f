"""The outbox engine's pooled PostgreSQL connections: a connection the server closed while it
sat in the pool is replaced at checkout, without the ``SELECT 1`` round trip of
``pool_pre_ping`` on every checkout (``delivery.runtime.db._quiet_or_replaced``)."""

from __future__ import annotations

import select
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from delivery.runtime.db import make_engine
from tests.conftest import PG_URL

pytestmark = pytest.mark.integration


def _pooled_backend(engine: Engine) -> tuple[int, Any]:
    """Use one connection and put it back in the pool: its server pid and its psycopg
    connection."""
    with engine.connect() as conn:
        pid = conn.scalar(text("SELECT pg_backend_pid()"))
        raw = conn.connection.dbapi_connection
    assert isinstance(pid, int)
    return pid, raw


def _terminate(admin: Engine, pid: int, raw: Any) -> None:
    """Close the pooled connection from the server's side (as a restart or an idle timeout
    does) and wait until its FATAL notice has reached the client's socket."""
    with admin.connect() as conn:
        assert conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    _wait_readable(raw)


def _wait_readable(raw: Any) -> None:
    """Wait until the server's message has reached the idle connection's socket."""
    poller = select.poll()
    poller.register(raw.fileno(), select.POLLIN)
    deadline = time.monotonic() + 5
    while not poller.poll(50):
        assert time.monotonic() < deadline, "nothing reached the idle connection's socket"


def test_a_connection_the_server_closed_is_replaced_at_checkout(pg_engine: Engine) -> None:
    engine = make_engine(PG_URL, pool_size=1, max_overflow=0)
    try:
        pid, raw = _pooled_backend(engine)
        _terminate(pg_engine, pid, raw)
        with engine.connect() as conn:  # no error: the dead connection was dropped
            again = conn.scalar(text("SELECT pg_backend_pid()"))
        assert again != pid
    finally:
        engine.dispose()


def test_a_harmless_message_on_an_idle_connection_costs_one_ping_not_the_connection(
    pg_engine: Engine,
) -> None:
    """Something waiting on an idle connection is not always a goodbye (here a notification;
    elsewhere a TLS message): the connection is pinged then, and kept when it answers."""
    engine = make_engine(PG_URL, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("LISTEN delivery_test_pool")
            conn.commit()
            pid = conn.scalar(text("SELECT pg_backend_pid()"))
            raw = conn.connection.dbapi_connection
        with pg_engine.connect() as admin:
            admin.exec_driver_sql("NOTIFY delivery_test_pool")
            admin.commit()
        _wait_readable(raw)
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT pg_backend_pid()")) == pid  # the same connection
    finally:
        engine.dispose()


def test_without_the_check_the_same_checkout_fails(pg_engine: Engine) -> None:
    """The case above is real: a plain pool lends out the dead connection."""
    engine = create_engine(PG_URL, pool_size=1, max_overflow=0)
    try:
        pid, raw = _pooled_backend(engine)
        _terminate(pg_engine, pid, raw)
        with pytest.raises(OperationalError), engine.connect() as conn:
            conn.scalar(text("SELECT 1"))
    finally:
        engine.dispose()


def test_a_healthy_pooled_connection_is_lent_without_a_round_trip(tmp_path: Path) -> None:
    """The check sends nothing: libpq's protocol trace of the pooled connection shows no
    message from the client during 20 checkouts, where pool_pre_ping sends a query each."""
    sent: dict[str, int] = {}
    for name, ping in (("check", False), ("pre_ping", True)):
        engine = make_engine(PG_URL, pool_size=1, max_overflow=0, pool_pre_ping=ping)
        try:
            pid, raw = _pooled_backend(engine)
            trace = tmp_path / f"{name}.trace"
            with trace.open("w") as out:
                raw.pgconn.trace(out.fileno())
                for _ in range(20):
                    with engine.connect():
                        pass
                raw.pgconn.untrace()
            sent[name] = sum("\tF\t" in line for line in trace.read_text().splitlines())
            with engine.connect() as conn:
                assert conn.scalar(text("SELECT pg_backend_pid()")) == pid  # the same one
        finally:
            engine.dispose()
    assert sent["check"] == 0, sent
    assert sent["pre_ping"] >= 20, sent

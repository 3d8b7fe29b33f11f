"""``insert_one``: one validated row (``outbox.row_values``) into the caller's transaction.

One statement, ``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING id``, so that a repeated key
never breaks the caller's transaction. On PostgreSQL through psycopg its text is built once and
run on the session's own connection by SQLAlchemy's cursor-level execution: the
``before/after_cursor_execute`` events, echo, ``hide_parameters`` and error wrapping apply as
for any statement, without compiling or building a result per call; the cursor is kept per
database connection, and psycopg prepares the statement on the server after a few uses.
Elsewhere it is a cached Core statement.

The returned ``Message`` is built the way the ORM builds a loaded one (its state filled with
the row, its identity key set) and added to the session: nothing to flush, nothing to load.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, class_mapper, make_transient_to_detached

from delivery.pipeline.models import Message, messages_table

__all__ = ["COLUMNS", "insert_one"]

#: The columns ``outbox.row_values`` fills, in the order of the INSERTs.
COLUMNS = (
    "key",
    "channel",
    "provider",
    "recipient",
    "payload",
    "payload_hash",
    "on_unknown",
    "status",
    "attempts",
    "max_attempts",
    "needs_lookup",
    "next_attempt_at",
    "message_type",
    "priority",
    "expires_at",
    "created_at",
    "updated_at",
)
#: The columns ``row_values`` leaves out, as a new row has them (so that the returned message
#: is complete and reading it never loads anything).
_NEW_ROW = dict(
    budget_start=0,
    lease_expires_at=None,
    last_error_code=None,
    last_error=None,
    provider_ref=None,
    sent_at=None,
)
_PAYLOAD = COLUMNS.index("payload")
_PG_INSERT = (
    f"INSERT INTO {messages_table.name} ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)
_CURSOR = "delivery.insert_one.cursor"


def insert_one(session: Session, values: dict[str, Any]) -> Message | None:
    """Insert the row; the new message (attached to ``session`` as if loaded from it), or None
    if its key exists."""
    conn = session.connection(bind_arguments={"mapper": Message})
    dialect = conn.dialect
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        new_id = _execute_pg(conn, values)
    elif dialect.name in ("postgresql", "sqlite"):
        new_id = conn.execute(_core_statement(dialect.name), values).scalar()
    else:  # pragma: no cover - look first, then add
        if session.scalars(select(Message.id).where(Message.key == values["key"])).first():
            return None
        added = Message(**values)
        session.add(added)
        session.flush()
        return added
    if new_id is None:
        return None
    message: Message = class_mapper(Message).class_manager.new_instance()  # configured
    state = message.__dict__  # the ORM's loading fills it the same way
    state.update(values)
    state.update(_NEW_ROW)
    state["id"] = new_id
    make_transient_to_detached(message)  # its state is the row's: nothing to flush
    session.add(message)
    return message


def _execute_pg(conn: Connection, values: dict[str, Any]) -> int | None:
    params = [values[name] for name in COLUMNS]
    serialize = getattr(conn.dialect, "_json_serializer", None) or json.dumps
    params[_PAYLOAD] = serialize(params[_PAYLOAD])
    cursor = _cursor(conn)
    conn._cursor_execute(cursor, _PG_INSERT, params)
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def _cursor(conn: Connection) -> Any:
    """A cursor of this connection's database connection, made once and kept with it (the
    pool's per-connection ``info`` is emptied when the connection is replaced)."""
    proxied = conn.connection
    dbapi = proxied.dbapi_connection
    kept = proxied.info.get(_CURSOR)
    if kept is not None and kept[0] is dbapi and not kept[1].closed:
        return kept[1]
    cursor = proxied.cursor()
    proxied.info[_CURSOR] = (dbapi, cursor)
    return cursor


@functools.cache
def _core_statement(dialect: str) -> Any:
    """One Core ``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING id`` per dialect, built
    once: its compiled form is cached, and no ORM entity is loaded from its answer."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    m = messages_table
    return insert(m).on_conflict_do_nothing(index_elements=[m.c.key]).returning(m.c.id)

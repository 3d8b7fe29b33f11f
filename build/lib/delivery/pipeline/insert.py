"""The outbox's INSERTs of validated rows (``outbox.row_values``), in the caller's transaction:
``insert_one`` for ``enqueue``, ``insert_chunk`` for ``enqueue_many``.

Each is one statement, ``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING``, so that a repeated
key never breaks the caller's transaction. On PostgreSQL through psycopg its text is built once
and run on the session's own connection by SQLAlchemy's cursor-level execution: the
``before/after_cursor_execute`` events, echo, ``hide_parameters`` and error wrapping apply as
for any statement, without compiling or building a result per call; the cursor is kept per
database connection, and psycopg prepares the statement on the server after a few uses. A
chunk is arrays, sent in binary (``%b``: psycopg's text arrays quote every element in Python)
and unnested by the server: one per column, except that a column with one value in all the
chunk's rows is sent as that value and a column equal to an earlier one reuses its array
(``_shape``). Elsewhere they are cached Core statements.

The returned ``Message`` is built the way the ORM builds a loaded one (its state filled with
the row, its identity key set) and added to the session: nothing to flush, nothing to load.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from sqlalchemy import Connection, String, Text, bindparam, cast, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, class_mapper, make_transient_to_detached

from delivery.pipeline.models import Message, messages_table

__all__ = ["COLUMNS", "insert_chunk", "insert_one", "overlapped", "send_chunk"]

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
    f"INSERT INTO {messages_table.name} ({', '.join(COLUMNS)}, budget_start) "
    f"VALUES ({', '.join(['%s'] * len(COLUMNS))}, 0) "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)
_CURSOR = "delivery.insert_one.cursor"


def insert_one(session: Session, values: dict[str, Any]) -> Message | None:
    """Insert the row; the new message (attached to ``session`` as if loaded from it), or None
    if its key exists."""
    conn = session.connection(bind_arguments={"mapper": Message})
    dialect = conn.dialect
    if _psycopg(conn):
        cursor = _cursor(conn)
        conn._cursor_execute(cursor, _PG_INSERT, _pg_params(conn, values))
        row = cursor.fetchone()
        new_id = None if row is None else row[0]
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


def insert_chunk(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert ``rows`` in one statement; the new ones' key -> id (a key already in the
    outbox, or earlier in ``rows``, is not among them)."""
    return send_chunk(session, rows)()


def send_chunk(session: Session, rows: list[dict[str, Any]]) -> Callable[[], dict[str, int]]:
    """Send ``insert_chunk``'s statement; the function returned reads its answer. Inside
    ``overlapped`` the database runs the statement while the caller goes on until then."""
    conn = session.connection(bind_arguments={"mapper": Message})
    dialect = conn.dialect.name
    if _psycopg(conn):
        arrays = [[row[name] for row in rows] for name in COLUMNS]
        serialize = _serializer(conn)
        arrays[_PAYLOAD] = [serialize(payload) for payload in arrays[_PAYLOAD]]
        shape, params = _shape(arrays)
        cursor: Any = conn.connection.cursor()  # its own: the answer is read later
        conn._cursor_execute(cursor, _pg_chunk(shape), params)

        def answer() -> dict[str, int]:
            with cursor:
                return dict(cursor.fetchall())

        return answer
    if dialect == "postgresql":  # another driver: the same statement, built by SQLAlchemy
        named = {f"a_{name}": [row[name] for row in rows] for name in COLUMNS}
        named["a_payload"] = [_serializer(conn)(payload) for payload in named["a_payload"]]
        found = {key: message_id for key, message_id in conn.execute(_core_chunk(), named)}
        return lambda: found
    if dialect != "sqlite":  # pragma: no cover - other databases are not supported
        raise NotImplementedError(f"enqueue_many does not support {dialect}")
    stmt = (
        sqlite.insert(messages_table)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(messages_table.c.key, messages_table.c.id)
    )
    found = {key: message_id for key, message_id in conn.execute(stmt)}
    return lambda: found


@contextlib.contextmanager
def overlapped(session: Session) -> Iterator[None]:
    """psycopg's pipeline mode on the session's connection (PostgreSQL through psycopg with
    libpq >= 14; elsewhere nothing): a statement ``send_chunk`` sends inside runs on the server
    while Python goes on; leaving waits for it. Run only pure Python inside (no other SQL)."""
    conn = session.connection(bind_arguments={"mapper": Message})
    if not _psycopg(conn) or not psycopg.Pipeline.is_supported():
        yield
        return
    dbapi: Any = conn.connection.dbapi_connection
    with dbapi.pipeline():
        yield


def _psycopg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def _pg_params(conn: Connection, values: dict[str, Any]) -> list[Any]:
    """``_PG_INSERT``'s parameters for one row: its values in ``COLUMNS`` order, the payload
    serialized."""
    params = [values[name] for name in COLUMNS]
    params[_PAYLOAD] = _serializer(conn)(params[_PAYLOAD])
    return params


def _serializer(conn: Connection) -> Callable[[Any], str]:
    """The engine's JSON serializer (``create_engine(json_serializer=...)``), as the JSON
    column would use it."""
    serialize: Callable[[Any], str] = getattr(conn.dialect, "_json_serializer", None) or json.dumps
    return serialize


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


#: A column of ``_shape``: one value for every row (sent once), or its own array.
_ONE, _OWN = -1, -2


def _shape(arrays: list[list[Any]]) -> tuple[tuple[int, ...], list[Any]]:
    """How ``_pg_chunk`` sends each column of a chunk, and its parameters in that order.

    A column with one value in every row (a campaign's channel, provider, policy, status,
    attempts, type, priority: most of them) is sent as that value, once; a column equal to an
    earlier one of the same SQL type (``created_at``, ``updated_at`` and ``next_attempt_at``
    of messages due now) refers to that one's array; the rest are arrays. psycopg builds a
    binary array element by element in Python: this sends about a third of them. The key is
    always an array (it is what ``RETURNING`` answers with)."""
    shape: list[int] = []
    ones: list[Any] = []
    own: list[list[Any]] = []
    size = len(arrays[0])
    for index, column in enumerate(arrays):
        first = column[0]
        if index != _KEY and column.count(first) == size:
            shape.append(_ONE)
            ones.append(first)
            continue
        same = next(
            (
                earlier
                for earlier, how in enumerate(shape)
                if how == _OWN
                and _KINDS[earlier] == _KINDS[index]
                and arrays[earlier][0] == first
                and arrays[earlier] == column
            ),
            None,
        )
        if same is None:
            shape.append(_OWN)
            own.append(column)
        else:
            shape.append(same)
    return tuple(shape), ones + own  # the statement names the single values first


def _column_kinds() -> tuple[str, ...]:
    """The SQL type each of ``COLUMNS`` is sent as: the model's, strings unbounded (the
    INSERT checks lengths: a cast would cut them), the payload as text (cast to JSON)."""
    dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
    columns = [messages_table.c[name] for name in COLUMNS]
    return tuple(
        "TEXT" if isinstance(c.type, String) or c.name == "payload" else c.type.compile(dialect)
        for c in columns
    )


_KINDS = _column_kinds()
_KEY = COLUMNS.index("key")


@functools.lru_cache(maxsize=64)
def _pg_chunk(shape: tuple[int, ...]) -> str:
    """``INSERT .. SELECT .. FROM unnest(%b::type[], ..) ON CONFLICT (key) DO NOTHING
    RETURNING key, id`` for a chunk of this ``_shape``: a single value is ``%b::type`` in the
    select list, an array a column of ``unnest``; ``budget_start`` is 0 as in a new row."""
    picked = []
    for index, how in enumerate(shape):
        source = COLUMNS[how if how >= 0 else index]
        value = f"%b::{_KINDS[index]}" if how == _ONE else f"v.{source}"
        picked.append(f"{value}::JSON" if index == _PAYLOAD else value)
    arrayed = [index for index, how in enumerate(shape) if how == _OWN]
    arrays = ", ".join(f"%b::{_KINDS[index]}[]" for index in arrayed)
    names = ", ".join(COLUMNS[index] for index in arrayed)
    return (
        f"INSERT INTO {messages_table.name} ({', '.join(COLUMNS)}, budget_start) "
        f"SELECT {', '.join(picked)}, 0 FROM unnest({arrays}) AS v({names}) "
        "ON CONFLICT (key) DO NOTHING RETURNING key, id"
    )


@functools.cache
def _core_chunk() -> Any:
    """``_pg_chunk`` built by SQLAlchemy, for a PostgreSQL driver other than psycopg."""
    m = messages_table.c
    kinds = {name: m[name].type for name in COLUMNS}
    kinds["payload"] = Text()  # sent as JSON text, cast back below
    arrays = [bindparam(f"a_{name}", type_=ARRAY(kinds[name])) for name in COLUMNS]
    source = func.unnest(*arrays).table_valued(*COLUMNS).render_derived(name="v")
    picked = [
        cast(source.c[name], m[name].type) if name == "payload" else source.c[name]
        for name in COLUMNS
    ]
    return (
        postgresql.insert(messages_table)
        .from_select(list(COLUMNS), select(*picked))
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(m.key, m.id)
    )


@functools.cache
def _core_statement(dialect: str) -> Any:
    """One Core ``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING id`` per dialect, built
    once: its compiled form is cached, and no ORM entity is loaded from its answer."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    m = messages_table
    return insert(m).on_conflict_do_nothing(index_elements=[m.c.key]).returning(m.c.id)

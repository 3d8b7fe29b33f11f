"""The outbox's INSERTs of validated rows (``outbox.row_values``), in the caller's transaction:
``insert_one`` for ``enqueue``, ``insert_chunk`` for ``enqueue_many``.

Each is one ``INSERT .. ON CONFLICT DO NOTHING RETURNING``, so that a repeated key never
breaks the caller's transaction (the conflict is the key's unique index, or on a partitioned
outbox the keys table's, through its trigger: ``delivery.runtime.partitions``; hence no
conflict target), run with SQLAlchemy's public execution: events, echo,
``hide_parameters`` and error wrapping apply as for any statement. ``insert_one``'s Core
statement is compiled once per dialect (``compiled_insert``), each value going through its
column type's bind processing, and the ``Message`` it returns is attached to the session as a
loaded one: nothing to flush, nothing to load. On PostgreSQL through psycopg a chunk is
arrays unnested by the server (``_shape``), sent in binary (``%b``: psycopg's text arrays
quote every element in Python); with another PostgreSQL driver it is the same statement
built by SQLAlchemy; on SQLite a multi-row ``VALUES``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sqlalchemy import Dialect, String, bindparam, cast, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, make_transient_to_detached

from delivery.core.models import Message, messages_table

__all__ = [
    "COLUMNS",
    "CompiledInsert",
    "compiled_insert",
    "insert_chunk",
    "insert_one",
    "insert_statement",
]

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
    "lease_expires_at",
    "message_type",
    "priority",
    "expires_at",
    "created_at",
    "updated_at",
    "traceparent",
)
#: The columns ``row_values`` leaves out, as a new row has them (so that the returned message
#: is complete and reading it never loads anything).
_NEW_ROW = dict(
    budget_start=0,
    pinned=False,
    last_error_code=None,
    last_error=None,
    provider_ref=None,
    sent_at=None,
)
_PAYLOAD = COLUMNS.index("payload")


def insert_one(session: Session, values: dict[str, Any]) -> Message | None:
    """Insert the row; the new message (attached to ``session`` as if loaded from it), or None
    if its key exists."""
    conn = session.connection(bind_arguments={"mapper": Message})
    dialect = conn.dialect
    if dialect.name not in ("postgresql", "sqlite"):  # pragma: no cover - look first, then add
        if session.scalars(select(Message.id).where(Message.key == values["key"])).first():
            return None
        added = Message(**values)
        session.add(added)
        session.flush()
        return added
    statement = compiled_insert(dialect)
    new_id = conn.exec_driver_sql(statement.sql, statement.parameters(values)).scalar()
    if new_id is None:
        return None
    message = Message(**values, **_NEW_ROW, id=new_id)
    make_transient_to_detached(message)  # its state is the row's: nothing to flush
    session.add(message)
    return message


class CompiledInsert(NamedTuple):
    """``insert_statement`` as SQLAlchemy compiles it for one dialect, and how a row's values
    become its parameters: each through its column type's bind processing, in the order (or
    under the names) of the dialect's paramstyle."""

    sql: str
    names: tuple[str, ...]
    positional: bool
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]

    def parameters(self, values: Mapping[str, Any]) -> Any:
        """The statement's parameters for a row (``row_values``)."""
        bound = {**values, "budget_start": 0}
        for name, process in self.processors:
            bound[name] = process(bound[name])
        if self.positional:
            return tuple([bound[name] for name in self.names])
        return bound


@functools.lru_cache(maxsize=32)
def compiled_insert(dialect: Dialect) -> CompiledInsert:
    """``insert_statement`` compiled once per dialect (an engine's: its ``json_serializer``
    is part of the payload's processing), every column of ``COLUMNS`` and ``budget_start``
    bound."""
    names = (*COLUMNS, "budget_start")
    stmt = insert_statement(dialect.name).values({name: None for name in names})
    compiled = stmt.compile(dialect=dialect)
    order = compiled.positiontup
    found = [(name, _processor(name, dialect)) for name in names]
    processors = tuple((name, process) for name, process in found if process is not None)
    return CompiledInsert(compiled.string, tuple(order or names), order is not None, processors)


def insert_chunk(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert ``rows`` in one statement; the new ones' key -> id (a key already in the
    outbox, or earlier in ``rows``, is not among them)."""
    conn = session.connection(bind_arguments={"mapper": Message})
    dialect = conn.dialect.name
    if dialect == "postgresql" and conn.dialect.driver == "psycopg":
        arrays = [[row[name] for row in rows] for name in COLUMNS]
        process = _processor("payload", conn.dialect)  # psycopg: wrapped for its JSON dumper
        shape, params = _shape(arrays, {_PAYLOAD: process} if process is not None else {})
        return {
            key: new_id for key, new_id in conn.exec_driver_sql(_pg_chunk(shape), tuple(params))
        }
    if dialect == "postgresql":  # another driver: the same statement, built by SQLAlchemy
        named = {f"a_{name}": [row[name] for row in rows] for name in COLUMNS}
        return {key: new_id for key, new_id in conn.execute(_core_chunk(), named)}
    if dialect != "sqlite":  # pragma: no cover - other databases are not supported
        raise NotImplementedError(f"enqueue_many does not support {dialect}")
    stmt = (
        sqlite.insert(messages_table)
        .values(rows)
        .on_conflict_do_nothing()
        .returning(messages_table.c.key, messages_table.c.id)
    )
    return {key: new_id for key, new_id in conn.execute(stmt)}


def _processor(name: str, dialect: Dialect) -> Callable[[Any], Any] | None:
    """The column's own bind processing on ``dialect`` (the payload's: the engine's
    ``json_serializer``), or None when it has none."""
    return messages_table.c[name].type.dialect_impl(dialect).bind_processor(dialect)


#: A column of ``_shape``: one value for every row (sent once), or its own array.
_ONE, _OWN = -1, -2


def _shape(
    arrays: list[list[Any]], convert: dict[int, Callable[[Any], Any]]
) -> tuple[tuple[int, ...], list[Any]]:
    """How ``_pg_chunk`` sends each column of a chunk, and its parameters in that order (the
    values of a column in ``convert`` passed through its function once shaped).

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
        to = convert.get(index)
        if index != _KEY and column.count(first) == size:
            shape.append(_ONE)
            ones.append(first if to is None else to(first))
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
            own.append(column if to is None else [to(value) for value in column])
        else:
            shape.append(same)
    return tuple(shape), ones + own  # the statement names the single values first


def _column_kinds() -> tuple[str, ...]:
    """The SQL type each of ``COLUMNS`` is sent as: the model's, strings unbounded (the
    INSERT checks lengths: a cast would cut them)."""
    dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
    columns = [messages_table.c[name] for name in COLUMNS]
    return tuple("TEXT" if isinstance(c.type, String) else c.type.compile(dialect) for c in columns)


_KINDS = _column_kinds()
_KEY = COLUMNS.index("key")


@functools.lru_cache(maxsize=64)
def _pg_chunk(shape: tuple[int, ...]) -> str:
    """``INSERT .. SELECT .. FROM unnest(%b::type[], ..) ON CONFLICT DO NOTHING
    RETURNING key, id`` for a chunk of this ``_shape``: a single value is ``%b::type`` in the
    select list, an array a column of ``unnest``; ``budget_start`` is 0 as in a new row."""
    picked = []
    for index, how in enumerate(shape):
        source = COLUMNS[how if how >= 0 else index]
        picked.append(f"%b::{_KINDS[index]}" if how == _ONE else f"v.{source}")
    arrayed = [index for index, how in enumerate(shape) if how == _OWN]
    arrays = ", ".join(f"%b::{_KINDS[index]}[]" for index in arrayed)
    names = ", ".join(COLUMNS[index] for index in arrayed)
    return (
        f"INSERT INTO {messages_table.name} ({', '.join(COLUMNS)}, budget_start) "
        f"SELECT {', '.join(picked)}, 0 FROM unnest({arrays}) AS v({names}) "
        "ON CONFLICT DO NOTHING RETURNING key, id"
    )


@functools.cache
def _core_chunk() -> Any:
    """``_pg_chunk`` built by SQLAlchemy, for a PostgreSQL driver other than psycopg."""
    m = messages_table.c
    arrays = [bindparam(f"a_{name}", type_=ARRAY(m[name].type)) for name in COLUMNS]
    source = func.unnest(*arrays).table_valued(*COLUMNS).render_derived(name="v")
    picked = [  # a driver may send the payloads' array as text: cast back
        cast(source.c[name], m[name].type) if name == "payload" else source.c[name]
        for name in COLUMNS
    ]
    return (
        postgresql.insert(messages_table)
        .from_select(list(COLUMNS), select(*picked))
        .on_conflict_do_nothing()
        .returning(m.key, m.id)
    )


@functools.cache
def insert_statement(dialect: str) -> Any:
    """``insert_one``'s Core ``INSERT .. ON CONFLICT DO NOTHING RETURNING id`` for
    ``dialect`` (``postgresql`` or ``sqlite``), built once: its compiled form is cached, and
    no ORM entity is loaded from its answer."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    m = messages_table
    return insert(m).on_conflict_do_nothing().returning(m.c.id)

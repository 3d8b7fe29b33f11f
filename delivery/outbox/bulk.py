"""``enqueue_many``: a campaign's messages in the caller's transaction, one statement per chunk.

Each message is validated exactly as ``enqueue`` validates it (``outbox.row_values``), then
written ``CHUNK`` at a time (``insert.insert_chunk``) as it is read from the iterable: 100,000
of them never exist at once as ORM objects. The next chunk is validated on a thread of its own
while the database inserts the one before; the caller's iterable is read on the caller's
thread, between statements, so a generator that queries through the same session is fine.

The semantics are ``enqueue``'s, message by message: a key already there with the same
payload is that message; with another payload, or twice in the input with two payloads,
``IdempotencyConflict``. ``InvalidMessage``'s ``field`` names the message and the argument
(``messages[3].to``). Either error writes nothing: the call runs in a savepoint, rolled back,
and the caller's transaction stays usable. Never commits; the nudge publishes the first due
messages after the commit, as with ``enqueue``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery.config.settings import Settings
from delivery.core.models import messages_table
from delivery.core.status import Status
from delivery.errors import IdempotencyConflict, InvalidMessage
from delivery.outbox.enqueue import (
    EnqueueArgs,
    claim_for_nudge,
    claim_of,
    nudge_later,
    row_values,
)
from delivery.outbox.insert import insert_chunk
from delivery.relay.claims import Claim
from delivery.runtime.current import get_settings

__all__ = ["CHUNK", "Enqueued", "enqueue_many"]

#: Messages per INSERT statement.
CHUNK = 1000
_ARGUMENTS = frozenset(EnqueueArgs.__annotations__)
_DISPATCHED = Status.DISPATCHED.value


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What ``enqueue_many`` did: ``created`` new messages, ``existing`` keys that were
    already there with the same payload (or repeated in the input)."""

    created: int
    existing: int


def _chunks(messages: Iterable[Mapping[str, Any]]) -> Iterator[list[tuple[int, Mapping[str, Any]]]]:
    numbered = enumerate(messages)
    while chunk := list(itertools.islice(numbered, CHUNK)):
        yield chunk


def _row(settings: Settings, index: int, spec: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise InvalidMessage(f"messages[{index}]", f"must be a mapping, not {type(spec).__name__}")
    unknown = sorted(spec.keys() - _ARGUMENTS)
    if unknown:
        raise InvalidMessage(f"messages[{index}].{unknown[0]}", "not an argument of enqueue")
    for required in ("to", "payload"):
        if required not in spec:
            raise InvalidMessage(f"messages[{index}].{required}", "is required")
    try:
        return row_values(settings, spec)
    except InvalidMessage as exc:
        raise InvalidMessage(f"messages[{index}].{exc.field}", exc.problem) from None


def enqueue_many(
    session: Session,
    messages: Iterable[EnqueueArgs] | Iterable[Mapping[str, Any]],
    *,
    settings: Settings | None = None,
) -> Enqueued:
    """Add every message of ``messages`` (each ``enqueue``'s keyword arguments) to
    ``session``'s transaction, ``CHUNK`` per statement; never commits. See the module
    docstring for conflicts and errors (nothing written on either)."""
    settings = settings or get_settings()
    created = existing = 0
    claims: dict[str, Claim] = {}
    # rolled back, and the error raised, on any failure; the next chunk is validated on a
    # thread of its own (started at the second chunk) while the database inserts this one
    with session.begin_nested(), ThreadPoolExecutor(1, "delivery-enqueue-many") as validating:
        chunks = _chunks(messages)
        rows = _rows(settings, next(chunks, []))
        while rows:
            upcoming = next(chunks, [])  # read from the caller's iterable between statements
            later = validating.submit(_rows, settings, upcoming) if upcoming else None
            claimed = claim_for_nudge(session, settings, rows, held=len(claims))
            new = insert_chunk(session, rows)
            created += len(new)
            existing += len(rows) - len(new)
            _check_conflicts(session, rows, new)
            if claimed:  # the rows marked and written (a key repeated in rows: once)
                for row in rows:
                    key = row["key"]
                    if row["status"] == _DISPATCHED and key in new and key not in claims:
                        claims[key] = claim_of(row, new[key])
            rows = later.result() if later is not None else []
    nudge_later(session, list(claims.values()))
    return Enqueued(created, existing)


def _rows(settings: Settings, chunk: list[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    return [_row(settings, index, spec) for index, spec in chunk]


def _check_conflicts(session: Session, rows: list[dict[str, Any]], new: dict[str, int]) -> None:
    """Every row not inserted must match the payload stored under its key."""
    mine: dict[str, str] = {}
    for row in rows:  # the same key twice in this chunk, new or not
        seen = mine.setdefault(row["key"], row["payload_hash"])
        if seen != row["payload_hash"]:
            raise IdempotencyConflict(row["key"], new.get(row["key"], 0))
    others = {row["key"]: row["payload_hash"] for row in rows if row["key"] not in new}
    if not others:
        return
    m = messages_table.c
    stored = session.execute(
        select(m.key, m.id, m.payload_hash).where(m.key.in_(list(others)))
    ).all()
    for key, message_id, digest in stored:
        if digest != others[key]:
            raise IdempotencyConflict(key, message_id)

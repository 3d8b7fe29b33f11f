"""Search the outbox: the console's message list, one keyset page at a time.

``parse_filter`` turns untrusted strings (a query string) into a ``MessageFilter``, raising
``InvalidFilter`` with the offending field; ``search`` returns one ``Page`` of messages, newest
(highest id) first, and the ``before`` id of the next page. Every page is one query that an
index answers without reading the table in full, whatever its size (``tests/test_console_plan``
shows the plans on PostgreSQL):

- no filter, time range, type: the primary key, walked backwards from ``before`` (on an
  outbox partitioned by day, a time range reads only its days: ``partitions.first_id``);
- ``key``: the key's index (``uq_delivery_messages_key``; ``ix_delivery_messages_key`` on an
  outbox partitioned by day), exact or a prefix (``order-42*``): on PostgreSQL it is in
  ``varchar_pattern_ops`` (``LIKE 'x%'`` under any collation), on SQLite a range in its
  binary order;
- ``status``, ``provider``, ``code``: ``ix_delivery_messages_{status,provider,code}_id`` (the
  code's holds only rows with a code: ``last_error_code = :code`` implies it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, fields

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from delivery.core.models import Message
from delivery.core.status import Status
from delivery.errors import InvalidFilter
from delivery.runtime import partitions

__all__ = ["FILTER_FIELDS", "MessageFilter", "Page", "matching_ids", "parse_filter", "search"]

_MAX_ID = 2**63 - 1
PAGE_MAX = 200


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """What to look for; ``None`` means any. ``key`` ending in ``*`` is a prefix."""

    key: str | None = None
    id: int | None = None
    status: Status | None = None
    provider: str | None = None
    type: str | None = None
    code: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def query_params(self) -> dict[str, str]:
        """The filter as query-string values (for links to the next page)."""
        values = {name: getattr(self, name) for name in FILTER_FIELDS}
        return {
            name: value.isoformat() if isinstance(value, dt.datetime) else str(value)
            for name, value in values.items()
            if value is not None
        }

    @property
    def prefix(self) -> str | None:
        """The key prefix when ``key`` ends in ``*``."""
        return self.key[:-1] if self.key is not None and self.key.endswith("*") else None


FILTER_FIELDS = tuple(f.name for f in fields(MessageFilter))


@dataclass(frozen=True, slots=True)
class Page:
    """One page of messages, newest first; ``next_before`` is the ``before`` of the next page
    (``None`` on the last one)."""

    messages: list[Message]
    next_before: int | None


def _text(field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidFilter(field, f"longer than {limit} characters")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidFilter(field, "contains a control character")
    return value


def _int(field: str, value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) > _MAX_ID:
        raise InvalidFilter(field, f"{value[:40]!r} is not a message id (a positive integer)")
    return int(value)


def _time(field: str, value: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidFilter(
            field, f"{value[:40]!r} is not an ISO-8601 time (2026-12-01T10:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def parse_filter(params: Mapping[str, str]) -> MessageFilter:
    """A ``MessageFilter`` from query-string values; empty values mean any. Raises
    ``InvalidFilter`` naming the field on a bad value (unknown status, malformed id or time,
    a value too long or with a control character, ``since`` after ``until``)."""
    values = {name: params[name].strip() for name in FILTER_FIELDS if params.get(name, "").strip()}
    status = None
    if "status" in values:
        try:
            status = Status(values["status"])
        except ValueError:
            known = ", ".join(s.value for s in Status)
            raise InvalidFilter(
                "status", f"{values['status'][:40]!r} is not a status ({known})"
            ) from None
    key = _text("key", values["key"], 256) if "key" in values else None
    if key is not None and "*" in key[:-1]:
        raise InvalidFilter("key", "only a trailing * (prefix search) is allowed")
    if key == "*":
        key = None
    found = MessageFilter(
        key=key,
        id=_int("id", values["id"]) if "id" in values else None,
        status=status,
        provider=_text("provider", values["provider"], 64) if "provider" in values else None,
        type=_text("type", values["type"], 32) if "type" in values else None,
        code=_text("code", values["code"], 64) if "code" in values else None,
        since=_time("since", values["since"]) if "since" in values else None,
        until=_time("until", values["until"]) if "until" in values else None,
    )
    if found.since and found.until and found.since > found.until:
        raise InvalidFilter("since", "is after until")
    return found


def _prefix_bound(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def page_query(
    session: Session, flt: MessageFilter, *, before: int | None, limit: int
) -> Select[Message]:
    """The one SELECT of a page (``search`` runs it; a test explains it)."""
    query = select(Message)
    if flt.prefix is not None:
        prefix = flt.prefix
        if session.get_bind().dialect.name == "postgresql":
            escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(Message.key.like(escaped + "%", escape="\\"))
        elif prefix:
            query = query.where(Message.key >= prefix, Message.key < _prefix_bound(prefix))
    elif flt.key is not None:
        query = query.where(Message.key == flt.key)
    if flt.id is not None:
        query = query.where(Message.id == flt.id)
    if flt.status is not None:
        query = query.where(Message.status == flt.status.value)
    if flt.provider is not None:
        query = query.where(Message.provider == flt.provider)
    if flt.type is not None:
        query = query.where(Message.message_type == flt.type)
    if flt.code is not None:
        query = query.where(Message.last_error_code == flt.code)
    if flt.since is not None:
        query = query.where(Message.created_at >= flt.since)
        floor = partitions.first_id(session.connection(), flt.since)
        if floor is not None:  # partitioned by day: only the days since are read
            query = query.where(Message.id >= floor)
    if flt.until is not None:
        query = query.where(Message.created_at < flt.until)
    if before is not None:
        query = query.where(Message.id < before)
    return query.order_by(Message.id.desc()).limit(limit)


def search(
    session: Session, flt: MessageFilter, *, before: int | None = None, limit: int = 50
) -> Page:
    """One page of matching messages, newest first (``before``: an id from ``next_before``)."""
    limit = max(1, min(limit, PAGE_MAX))
    rows = list(session.scalars(page_query(session, flt, before=before, limit=limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, rows[-1].id if more and rows else None)


def matching_ids(session: Session, flt: MessageFilter, *, limit: int = 100_000) -> list[int]:
    """The ids of every message ``flt`` matches (newest first, at most ``limit``): what a
    bulk repair will touch, counted before it runs."""
    query = page_query(session, flt, before=None, limit=limit).with_only_columns(Message.id)
    return list(session.scalars(query))

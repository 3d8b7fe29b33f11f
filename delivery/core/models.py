"""The outbox schema: one row per logical message, one per attempt, one per receipt; the
suppression list.

The migrations in ``delivery/migrations`` create exactly these tables; a test checks that
the two agree.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Attempt",
    "AuditEntry",
    "Base",
    "Message",
    "Receipt",
    "Suppression",
    "UTCDateTime",
    "attempts_table",
    "messages_table",
    "receipts_table",
    "suppressions_table",
    "utcnow",
]

Id = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Message(Base):
    """One logical message. ``key`` is its idempotency key, sent on every attempt."""

    __tablename__ = "delivery_messages"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255))
    channel: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str] = mapped_column(String(64))
    recipient: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    payload_hash: Mapped[str] = mapped_column(String(64))
    on_unknown: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    #: ``attempts`` when this life began (0; a redrive sets it): the budget of every life is
    #: ``max_attempts - budget_start``, and ``attempts`` itself never goes back (the fence).
    budget_start: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    needs_lookup: Mapped[bool] = mapped_column(Boolean, default=False)
    #: An attempt on its current ``provider`` may have taken effect: it never moves to another
    #: provider (docs/concepts.md, "Failover"); False again only when a lookup there answers
    #: that the provider has nothing for its key.
    pinned: Mapped[bool] = mapped_column(Boolean, server_default=false())  # a new row: false
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    provider_ref: Mapped[str | None] = mapped_column(String(255), nullable=True)
    message_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    priority: Mapped[str] = mapped_column(String(16), default="normal", server_default="normal")
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: The W3C ``traceparent`` of the span that called ``enqueue``, when traces are recorded
    #: (``delivery.observability.tracing``): the message's spans join that trace.
    traceparent: Mapped[str | None] = mapped_column(String(55), nullable=True)

    __table_args__ = (
        # Unique: ``enqueue``'s ON CONFLICT (key). ``varchar_pattern_ops`` (PostgreSQL) has
        # ``=`` too, so this one index also answers the console's key prefix (LIKE 'x%') under
        # any collation. SQLite: the table's unique constraint of this name.
        Index(
            "uq_delivery_messages_key",
            "key",
            unique=True,
            postgresql_ops={"key": "varchar_pattern_ops"},
        ),
        # The relay's claim reads only this small partial index, however many final rows.
        Index(
            "ix_delivery_messages_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
            sqlite_where=text("status = 'pending'"),
        ),
        Index(
            "ix_delivery_messages_lease",
            "lease_expires_at",
            postgresql_where=text("status IN ('dispatched', 'sending')"),
            sqlite_where=text("status IN ('dispatched', 'sending')"),
        ),
        Index("ix_delivery_messages_status", "status", "updated_at"),
        # The console's keyset pages: newest first within a status, a provider, an error code.
        Index("ix_delivery_messages_status_id", "status", "id"),
        Index("ix_delivery_messages_provider_id", "provider", "id"),
        # Only rows with a code: ``last_error_code = :code`` implies it, and a new message
        # (or one that never failed) writes no entry here.
        Index(
            "ix_delivery_messages_code_id",
            "last_error_code",
            "id",
            postgresql_where=text("last_error_code IS NOT NULL"),
            sqlite_where=text("last_error_code IS NOT NULL"),
        ),
    )

    def __repr__(self) -> str:
        return f"<Message {self.id} {self.key!r} {self.status}>"


class Attempt(Base):
    """One call to the provider (a send or a lookup) and how it ended."""

    __tablename__ = "delivery_attempts"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(
        Id, ForeignKey("delivery_messages.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    #: The provider called (NULL on rows from before failover: their message's ``provider``).
    provider: Mapped[str | None] = mapped_column(String(64), nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    outcome: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        # The console's charts read attempts by time (provider error rate per minute).
        Index("ix_delivery_attempts_started_at", "started_at"),
    )


class Receipt(Base):
    """One delivery receipt a provider called back with (``delivery.receipts``), stored before
    it is acknowledged. ``event`` is the provider's id of the callback (a retried callback
    repeats it: one row per provider and event). ``effect``: what it did to its message,
    ``moved`` (the status changed), ``kept`` (a duplicate, a status no higher than the
    message's, or a message in a state receipts do not move) or ``waiting`` (a final receipt
    for a message whose worker has not yet recorded it ``sent``; the sweeper applies it)."""

    __tablename__ = "delivery_receipts"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(
        Id, ForeignKey("delivery_messages.id", ondelete="CASCADE"), index=True
    )
    provider: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    provider_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    effect: Mapped[str] = mapped_column(String(16))

    __table_args__ = (
        Index("uq_delivery_receipts_provider", "provider", "event", unique=True),
        # The console's delivery rates and receipt lag read the receipts of a recent window.
        Index("ix_delivery_receipts_received_at", "received_at"),
        # The sweeper's look for receipts that wait: only those rows are in it.
        Index(
            "ix_delivery_receipts_waiting",
            "id",
            postgresql_where=text("effect = 'waiting'"),
            sqlite_where=text("effect = 'waiting'"),
        ),
    )


class Suppression(Base):
    """A recipient that must not be sent to on a channel (``delivery.outbox.suppression``).
    The recipient is kept only as a keyed hash (HMAC-SHA256 with the deployment's
    suppression secret), so a copy of the table names nobody; ``source`` says who put it
    there (``receipt:PROVIDER EVENT``, or an operator's actor)."""

    __tablename__ = "delivery_suppressions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(32))
    recipient_hash: Mapped[str] = mapped_column(String(64))
    code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("uq_delivery_suppressions_channel", "channel", "recipient_hash", unique=True),
    )


class AuditEntry(Base):
    """One operator action (console, CLI, Django admin): who, when, what, on which message,
    from which status to which. ``message_id`` is not a foreign key: the record outlives a
    pruned message until ``prune`` removes it by age."""

    __tablename__ = "delivery_audit"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    message_id: Mapped[int | None] = mapped_column(Id, nullable=True, index=True)
    message_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    from_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


#: The Core tables, for the hot paths (relay, sender, sweeper) that skip the ORM.
messages_table = cast(Table, Message.__table__)
attempts_table = cast(Table, Attempt.__table__)
receipts_table = cast(Table, Receipt.__table__)
suppressions_table = cast(Table, Suppression.__table__)

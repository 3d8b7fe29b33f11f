"""The suppression list: recipients a channel must not send to, kept as keyed hashes.

A recipient goes on the list when a provider's receipt says it can never be reached there (an
unsubscribe such as Twilio's 21610 STOP, an unreachable or landline number, an email hard
bounce or complaint: each receipt protocol's ``SUPPRESSING_CODES``), or when an operator adds
it. A message to a listed recipient ends ``suppressed`` at its worker, before any provider
call, unless its message type says ``suppress = false``.

No recipient is stored in clear: the list holds ``HMAC-SHA256(secret, "channel:recipient")``,
keyed with the secret in the environment variable ``[delivery] suppression_secret_env`` names
(default ``DELIVERY_SUPPRESSION_SECRET``), so a copy of the table names nobody. Without that
secret there is no list: nothing is added, nothing is suppressed.

``Suppressions`` is one process's handle on the list, with its key. With a list, each task
asks it once for all its messages (one indexed statement) before any is sent; without one,
never.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, delete, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from delivery.config.settings import Settings
from delivery.core.models import suppressions_table, utcnow

__all__ = ["Suppressions", "recipient_hash"]


def recipient_hash(key: bytes, channel: str, recipient: str) -> str:
    """The keyed hash a recipient of ``channel`` is listed under."""
    return hmac.new(key, f"{channel}:{recipient}".encode(), hashlib.sha256).hexdigest()


class Suppressions:
    """The suppression list as one process uses it (the module docstring)."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        secret = env.get(settings.suppression_secret_env, "")
        self.key: bytes | None = secret.encode() if secret.strip() else None

    def active(self) -> bool:
        """Whether there is a list (a secret to key it)."""
        return self.key is not None

    def hash(self, channel: str, recipient: str) -> str | None:
        """The recipient's keyed hash, or None when there is no list (no secret)."""
        return None if self.key is None else recipient_hash(self.key, channel, recipient)

    def add(
        self, conn: Connection, channel: str, recipient: str, *, code: str | None, source: str
    ) -> bool:
        """List ``recipient`` on ``channel`` (in the caller's transaction); False if it was
        listed already or there is no list."""
        digest = self.hash(channel, recipient)
        if digest is None:
            return False
        build = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        statement = build(suppressions_table).values(
            channel=channel,
            recipient_hash=digest,
            code=code,
            source=source[:255],
            created_at=utcnow(),
        )
        # RETURNING, not rowcount: on PostgreSQL SQLAlchemy adds its own RETURNING to a
        # one-row insert and the rowcount is then -1, conflict or not.
        inserted = statement.on_conflict_do_nothing().returning(suppressions_table.c.id)
        return conn.execute(inserted).first() is not None

    def lift(self, conn: Connection, channel: str, recipient: str) -> bool:
        """Take ``recipient`` off ``channel``'s list; False if it was not on it."""
        digest = self.hash(channel, recipient)
        if digest is None:
            return False
        s = suppressions_table.c
        statement = delete(suppressions_table).where(
            s.channel == channel, s.recipient_hash == digest
        )
        return bool(conn.execute(statement).rowcount)

    def listed(self, conn: Connection, recipients: Iterable[tuple[str, str]]) -> set[int]:
        """Which of ``recipients`` ((channel, recipient) pairs, in order) are listed, by
        their place; one statement (none without a list)."""
        pairs: Sequence[tuple[str, str]] = list(recipients)
        if self.key is None or not pairs:
            return set()
        hashes = [(channel, recipient_hash(self.key, channel, to)) for channel, to in pairs]
        s = suppressions_table.c
        query = select(s.channel, s.recipient_hash).where(
            tuple_(s.channel, s.recipient_hash).in_(sorted(set(hashes)))
        )
        found = {(channel, digest) for channel, digest in conn.execute(query)}
        return {place for place, pair in enumerate(hashes) if pair in found}

    def entries(self, conn: Connection, *, limit: int = 100) -> list[Any]:
        """The newest entries (channel, hash, code, source, created_at)."""
        s = suppressions_table.c
        query = select(s.channel, s.recipient_hash, s.code, s.source, s.created_at)
        return list(conn.execute(query.order_by(s.id.desc()).limit(limit)))

"""The audit of operator actions: one ``delivery_audit`` row per action, whoever made it.

Repairs (``redrive``, ``resolve``, ``cancel``), a recipient's reveal and a breaker's reset are
recorded with the ``actor`` that made them: a console user (``console:ann``), the CLI
(``cli:$USER``), the Django admin (``admin:<username>``), or ``library`` when code calls
``delivery.ops`` without naming one. A row is written in the caller's transaction, so a repair
that rolls back leaves no audit row and a committed one always has its row.
"""

from __future__ import annotations

import datetime as dt
import getpass
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from delivery.core.models import AuditEntry, Message, utcnow
from delivery.ops.inspect import find, message_dict

__all__ = [
    "DEFAULT_ACTOR",
    "AuditRow",
    "cli_actor",
    "entries",
    "prune_audit_batch",
    "record",
    "reveal",
]

DEFAULT_ACTOR = "library"
"""The actor of an ops call that names none."""

_ACTOR_MAX = 128
_DETAIL_MAX = 2000


def cli_actor() -> str:
    """``cli:$USER`` (the login name of the process running the ``delivery`` command)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}"[:_ACTOR_MAX]


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    message: Message | None = None,
    from_status: str | None = None,
    to_status: str | None = None,
    detail: str | None = None,
    at: dt.datetime | None = None,
) -> AuditEntry:
    """Add one audit row to the session (the caller commits). ``detail`` must hold no
    recipient or payload: it is shown to every console viewer."""
    entry = AuditEntry(
        at=at or utcnow(),
        actor=(actor or DEFAULT_ACTOR)[:_ACTOR_MAX],
        action=action[:32],
        message_id=None if message is None else message.id,
        message_key=None if message is None else message.key,
        from_status=from_status,
        to_status=to_status,
        detail=None if detail is None else detail[:_DETAIL_MAX],
    )
    session.add(entry)
    session.flush()
    return entry


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One audit row, ready to render or to dump as JSON (``as_dict``)."""

    id: int
    at: dt.datetime
    actor: str
    action: str
    message_id: int | None
    message_key: str | None
    from_status: str | None
    to_status: str | None
    detail: str | None

    def as_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__}
        data["at"] = self.at.isoformat()
        return data


def _row(entry: AuditEntry) -> AuditRow:
    return AuditRow(**{name: getattr(entry, name) for name in AuditRow.__slots__})


def entries(
    session: Session,
    *,
    message_id: int | None = None,
    actor: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[AuditRow]:
    """Audit rows newest first: all of them, or one message's, or one actor's; ``before`` an
    id for the next page (keyset, on the primary key or ``ix_delivery_audit_message_id``)."""
    query = select(AuditEntry)
    if message_id is not None:
        query = query.where(AuditEntry.message_id == message_id)
    if actor is not None:
        query = query.where(AuditEntry.actor == actor)
    if before is not None:
        query = query.where(AuditEntry.id < before)
    query = query.order_by(AuditEntry.id.desc()).limit(limit)
    return [_row(entry) for entry in session.scalars(query)]


def prune_audit_batch(session: Session, cutoff: dt.datetime, *, limit: int = 1000) -> int:
    """Delete up to ``limit`` audit rows older than ``cutoff``; call until it returns 0."""
    ids: Sequence[int] = list(
        session.scalars(
            select(AuditEntry.id).where(AuditEntry.at < cutoff).order_by(AuditEntry.id).limit(limit)
        )
    )
    if not ids:
        return 0
    done = session.execute(
        delete(AuditEntry)
        .where(AuditEntry.id.in_(ids))
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], done).rowcount


def reveal(session: Session, ref: str, *, actor: str) -> dict[str, Any]:
    """The message named by ``ref`` with its recipient and payload unmasked, and an audit row
    (``reveal``) saying who saw them. The caller commits (the row is the point)."""
    message = find(session, ref)
    record(session, actor=actor, action="reveal", message=message, detail="recipient and payload")
    return message_dict(message, reveal=True)

"""``enqueue``: write a message into the caller's own transaction (guarantee G1).

``row_values`` validates a message (its route from ``routing``, the recipient, payload, key and
time from ``validation``) into its row; ``insert.insert_one`` writes it with one statement
(``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING``) so that a repeated key never breaks the
caller's transaction; ``enqueue`` never commits.
After the caller commits, the post-commit nudge (installed by the Celery app with
``set_nudge``) claims and publishes the new rows at once; the beat relay is the safety net.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Required, TypedDict

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from delivery.config.settings import Settings
from delivery.errors import IdempotencyConflict
from delivery.pipeline.insert import insert_one
from delivery.pipeline.models import Message, utcnow
from delivery.pipeline.routing import route
from delivery.pipeline.status import Status
from delivery.pipeline.validation import (
    check_key,
    check_recipient,
    check_send_at,
    checked_payload,
    payload_digest,
)
from delivery.runtime.current import get_settings

__all__ = ["EnqueueArgs", "enqueue", "nudge_later", "row_values", "set_nudge"]

log = logging.getLogger("delivery.outbox")
Nudge = Callable[[Engine, list[int]], None]
_NUDGE_KEY = "delivery.nudge"
_nudge: Nudge | None = None
_PENDING = Status.PENDING.value


class EnqueueArgs(TypedDict, total=False):
    """The keyword arguments of one message, as ``enqueue`` takes them: one item of
    ``enqueue_many``, and ``delivery.contrib.django.enqueue``'s own keywords (a test pins them
    to ``enqueue``'s signature)."""

    channel: str | None
    to: Required[str]
    payload: Required[dict[str, Any]]
    key: str | None
    provider: str | None
    on_unknown: str | None
    max_attempts: int | None
    send_at: Any
    type: str | None


def nudge_later(session: Session, ids: list[int]) -> None:
    """Have these new, due message ids published right after ``session`` commits."""
    if ids:
        session.info.setdefault(_NUDGE_KEY, []).extend(ids)


def set_nudge(nudge: Nudge | None) -> None:
    """Install the function called with the new message ids after the caller's commit."""
    global _nudge
    _nudge = nudge


def enqueue(
    session: Session,
    *,
    channel: str | None = None,
    to: str,
    payload: dict[str, Any],
    key: str | None = None,
    provider: str | None = None,
    on_unknown: str | None = None,
    max_attempts: int | None = None,
    send_at: Any = None,
    type: str | None = None,
    settings: Settings | None = None,
) -> Message:
    """Add one message to ``session``'s transaction and return it; never commits.

    Same ``key`` and same payload returns the existing message; same key with another
    payload raises ``IdempotencyConflict``. Bad input raises ``InvalidMessage`` naming the
    field. In both cases nothing is written and the caller's transaction stays usable.

    ``type`` names a message type of the configuration (``otp``, ``marketing``): its
    channel, provider, policy, attempts, priority and time-to-live are the defaults.
    """
    spec: EnqueueArgs = {
        "channel": channel,
        "to": to,
        "payload": payload,
        "key": key,
        "provider": provider,
        "on_unknown": on_unknown,
        "max_attempts": max_attempts,
        "send_at": send_at,
        "type": type,
    }
    values = row_values(settings or get_settings(), spec)
    message = insert_one(session, values)
    if message is None:
        existing = session.scalars(select(Message).where(Message.key == values["key"])).one()
        if existing.payload_hash != values["payload_hash"]:
            raise IdempotencyConflict(values["key"], existing.id)
        return existing
    if values["next_attempt_at"] <= values["created_at"]:
        nudge_later(session, [message.id])
    return message


def row_values(settings: Settings, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one message, given as ``enqueue``'s keyword arguments (``to`` and ``payload``
    present), as ``enqueue`` does (``InvalidMessage`` naming the field) and return its row:
    every column ``insert_one`` writes, the key minted if none was given."""
    get = spec.get
    where = route(settings, spec)
    channel = where.channel
    recipient = check_recipient(channel, spec["to"])
    if where.check_recipient is not None:
        where.check_recipient(recipient)
    body, body_json = checked_payload(channel, spec["payload"], settings.max_payload_bytes)
    key = get("key")
    key = str(uuid.uuid4()) if key is None else check_key(key)
    now = utcnow()
    due = check_send_at(get("send_at"), now)
    return {
        "key": key,
        "channel": channel,
        "provider": where.provider,
        "recipient": recipient,
        "payload": body,
        "payload_hash": payload_digest(channel, recipient, body_json),
        "on_unknown": where.on_unknown,
        "status": _PENDING,
        "attempts": 0,
        "max_attempts": where.max_attempts,
        "needs_lookup": False,
        "next_attempt_at": due,
        "message_type": where.message_type,
        "priority": where.priority,
        "expires_at": due + where.ttl if where.ttl is not None else None,
        "created_at": now,
        "updated_at": now,
    }


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    ids = session.info.pop(_NUDGE_KEY, None)
    if not ids or _nudge is None:
        return
    try:
        bind = session.get_bind()
        _nudge(bind if isinstance(bind, Engine) else bind.engine, ids)
    except Exception:  # the commit happened; the beat relay will publish these rows
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_NUDGE_KEY, None)

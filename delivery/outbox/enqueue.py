"""``enqueue``: write a message into the caller's own transaction (guarantee G1); it never
commits. ``row_values`` validates a message into its row (``routing``, ``validation``) and
``insert.insert_one`` writes it.

The post-commit nudge (its publisher installed by the Celery app with ``set_nudge``) publishes
a transaction's new rows right after its commit. A row due now, written through a session
bound to an engine (whose commit is the transaction's), is written already claimed:
``dispatched`` with the lease the relay's claim would give it, up to ``NUDGE_MAX`` rows per
transaction; the others, and rows due later, are ``pending`` and the relay's. A failed
publish puts the rows back to ``pending`` at once (``transitions.relay.release``); if the
process dies first, the sweeper does when their lease passes (docs/concepts.md, "How a
message travels").
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Required, TypedDict

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from delivery.config.settings import Settings
from delivery.core.models import Message, utcnow
from delivery.core.status import Status
from delivery.errors import IdempotencyConflict
from delivery.observability import tracing
from delivery.observability.events import emit_moved
from delivery.outbox.insert import insert_one
from delivery.outbox.routing import route
from delivery.outbox.validation import (
    check_key,
    check_recipient,
    check_send_at,
    checked_payload,
    payload_digest,
)
from delivery.relay.claims import Claim, Publisher
from delivery.runtime.current import get_settings
from delivery.transitions.relay import release

__all__ = [
    "NUDGE_MAX",
    "EnqueueArgs",
    "claim_for_nudge",
    "claim_of",
    "enqueue",
    "nudge_later",
    "publish_claimed",
    "row_values",
    "set_nudge",
    "take_claims",
]

log = logging.getLogger("delivery.outbox")
#: At most this many rows of one transaction are written claimed for the nudge; the beat
#: relay publishes the rest within ``relay_interval``.
NUDGE_MAX = 500
_NUDGE_KEY = "delivery.nudge"
_nudge: Publisher | None = None
_PENDING = Status.PENDING.value
_DISPATCHED = Status.DISPATCHED.value


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


def set_nudge(nudge: Publisher | None) -> None:
    """Install the publisher the nudge hands a transaction's claimed rows to after its commit
    (``None``: no nudge; every row is written ``pending`` for the relay)."""
    global _nudge
    _nudge = nudge


def claim_for_nudge(
    session: Session, settings: Settings, rows: Sequence[dict[str, Any]], *, held: int = 0
) -> int:
    """Mark those of ``rows`` (``row_values``) that are due now claimed for the nudge
    (``dispatched``, leased ``dispatch_lease`` from their ``created_at``) while ``session``'s
    transaction has fewer than ``NUDGE_MAX`` (``held`` more are the caller's, not passed to
    ``nudge_later`` yet), if a nudge is installed and ``session`` is bound to an engine; return
    how many it marked. The caller passes the new ones to ``nudge_later``."""
    room = NUDGE_MAX - held - len(session.info.get(_NUDGE_KEY, ()))
    if room <= 0 or _nudge is None or not isinstance(session.get_bind(mapper=Message), Engine):
        return 0
    lease = dt.timedelta(seconds=settings.dispatch_lease)
    marked = 0
    for values in rows:
        if marked >= room:
            break
        if values["next_attempt_at"] <= values["created_at"]:
            values["status"] = _DISPATCHED
            values["lease_expires_at"] = values["created_at"] + lease
            marked += 1
    return marked


def nudge_later(session: Session, claims: Sequence[Claim]) -> None:
    """Have these rows, written claimed (``claim_for_nudge``), published right after
    ``session`` commits."""
    if claims:
        session.info.setdefault(_NUDGE_KEY, []).extend(claims)


def take_claims(session: Session) -> list[Claim]:
    """The rows ``session`` has written claimed so far, handed over to the caller (an
    integration that commits the transaction itself and then calls ``publish_claimed``)."""
    claims: list[Claim] = session.info.pop(_NUDGE_KEY, [])
    return claims


def publish_claimed(engine: Engine, claims: Sequence[Claim]) -> None:
    """After the commit: publish the rows written claimed. Never raises: if the publish
    fails (or no nudge is installed any more) they are put back to ``pending`` for the relay;
    if that fails too, the sweeper does it when their lease passes."""
    if not claims:
        return
    for c in claims:
        emit_moved(c, Status.PENDING, Status.DISPATCHED)
    try:
        if _nudge is None:
            raise RuntimeError("no nudge is installed any more")
        _nudge(claims)
        return
    except Exception:
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)
    try:
        with engine.begin() as conn:
            release(conn, claims)  # emits each row's dispatched -> pending
    except Exception:
        log.warning("could not give the messages back; their lease will", exc_info=True)


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
    settings = settings or get_settings()
    values = row_values(settings, spec)
    claimed = claim_for_nudge(session, settings, (values,))
    message = insert_one(session, values)
    if message is None:
        existing = session.scalars(select(Message).where(Message.key == values["key"])).one()
        if existing.payload_hash != values["payload_hash"]:
            raise IdempotencyConflict(values["key"], existing.id)
        return existing
    if claimed:
        nudge_later(session, [claim_of(values, message.id)])
    return message


def claim_of(values: Mapping[str, Any], message_id: int) -> Claim:
    """The relay's ``Claim`` of a row written claimed (``values`` as inserted)."""
    return Claim(
        message_id, values["key"], values["priority"], values["provider"], 0, values["traceparent"]
    )


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
        "lease_expires_at": None,
        "message_type": where.message_type,
        "priority": where.priority,
        "expires_at": due + where.ttl if where.ttl is not None else None,
        "created_at": now,
        "updated_at": now,
        "traceparent": tracing.traceparent(),  # None unless traces are recorded
    }


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    claims = take_claims(session)
    if not claims:
        return
    try:
        bind = session.get_bind(mapper=Message)
        engine = bind if isinstance(bind, Engine) else bind.engine
    except Exception:  # the commit happened; the lease gives the rows back to the relay
        log.warning("post-commit nudge failed; the relay will publish the messages", exc_info=True)
        return
    publish_claimed(engine, claims)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_NUDGE_KEY, None)

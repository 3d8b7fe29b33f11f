"""``enqueue``: write a message into the caller's own transaction (guarantee G1).

The row is inserted with one statement (``INSERT .. ON CONFLICT (key) DO NOTHING RETURNING``)
so that a repeated key never breaks the caller's transaction; ``enqueue`` never commits.
After the caller commits, the post-commit nudge (installed by the Celery app with
``set_nudge``) claims and publishes the new rows at once; the beat relay is the safety net.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any, Required, TypedDict

from sqlalchemy import Engine, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from delivery.config.settings import ChannelConfig, MessageType, ProviderConfig, Settings
from delivery.errors import IdempotencyConflict, InvalidMessage
from delivery.pipeline.models import Message, utcnow
from delivery.pipeline.policies import UnknownPolicy
from delivery.pipeline.status import Status
from delivery.pipeline.validation import (
    check_key,
    check_payload,
    check_recipient,
    check_send_at,
    payload_hash,
)
from delivery.providers.registry import adapter_for
from delivery.runtime.current import get_settings

__all__ = ["EnqueueArgs", "enqueue", "nudge_later", "row_values", "set_nudge"]

log = logging.getLogger("delivery.outbox")
Nudge = Callable[[Engine, list[int]], None]
_NUDGE_KEY = "delivery.nudge"
_nudge: Nudge | None = None


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
    settings = settings or get_settings()
    values = row_values(
        settings,
        channel=channel,
        to=to,
        payload=payload,
        key=key,
        provider=provider,
        on_unknown=on_unknown,
        max_attempts=max_attempts,
        send_at=send_at,
        type=type,
    )
    key, digest, due, now = (
        values["key"],
        values["payload_hash"],
        values["next_attempt_at"],
        values["created_at"],
    )
    message = _insert(session, values)
    if message is None:
        existing = session.scalars(select(Message).where(Message.key == key)).one()
        if existing.payload_hash != digest:
            raise IdempotencyConflict(key, existing.id)
        return existing
    if due <= now:
        nudge_later(session, [message.id])
    return message


def row_values(
    settings: Settings,
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
) -> dict[str, Any]:
    """Validate one message as ``enqueue`` does (``InvalidMessage`` naming the field) and
    return its row: every column, the key minted if none was given."""
    kind = None
    if type is not None:
        kind = settings.types.get(type) if isinstance(type, str) else None
        if kind is None:
            known = ", ".join(sorted(settings.types)) or "none configured"
            raise InvalidMessage("type", f"{type!r} is not a configured message type ({known})")
        channel = kind.channel if channel is None else channel
    channel_config = settings.channel(channel) if isinstance(channel, str) else None
    if channel_config is None:
        raise InvalidMessage(
            "channel",
            f"{channel!r} is not a configured channel ({', '.join(sorted(settings.channels))})",
        )
    assert channel is not None
    provider = provider or (kind and kind.provider) or channel_config.provider
    if provider not in settings.providers:
        raise InvalidMessage("provider", f"{provider!r} is not a configured provider")
    policy = _policy(on_unknown, kind, channel_config, settings.providers[provider])
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
    ):
        raise InvalidMessage("max_attempts", f"must be an integer >= 1, not {max_attempts!r}")
    attempts = (
        max_attempts
        or (kind and kind.max_attempts)
        or channel_config.max_attempts
        or settings.max_attempts
    )
    recipient = check_recipient(channel, to)
    provider_config = settings.providers[provider]
    adapter_for(provider_config.kind).check_recipient(provider_config, recipient)
    body = check_payload(channel, payload, settings.max_payload_bytes)
    key = str(uuid.uuid4()) if key is None else check_key(key)
    now = utcnow()
    due = check_send_at(send_at, now)
    digest = payload_hash(channel, recipient, body)

    values = dict(
        key=key,
        channel=channel,
        provider=provider,
        recipient=recipient,
        payload=body,
        payload_hash=digest,
        on_unknown=policy.value,
        status=Status.PENDING.value,
        attempts=0,
        max_attempts=attempts,
        needs_lookup=False,
        next_attempt_at=due,
        message_type=kind.name if kind else None,
        priority=kind.priority if kind else "normal",
        expires_at=due + dt.timedelta(seconds=kind.ttl) if kind and kind.ttl else None,
        created_at=now,
        updated_at=now,
    )
    return values


def _policy(
    on_unknown: str | None,
    kind: MessageType | None,
    channel: ChannelConfig,
    provider: ProviderConfig,
) -> UnknownPolicy:
    """Explicit argument, else the type's, else the channel's (or, for a provider other than
    the channel's, that provider kind's own default: Twilio has no keys, so ``lookup``)."""
    if on_unknown is None:
        if kind is not None and kind.on_unknown is not None:
            return kind.on_unknown
        if provider.name == channel.provider:
            return channel.on_unknown
        return adapter_for(provider.kind).default_on_unknown
    try:
        policy = UnknownPolicy(on_unknown)
    except ValueError:
        choices = ", ".join(p.value for p in UnknownPolicy)
        raise InvalidMessage("on_unknown", f"{on_unknown!r} is not one of {choices}") from None
    if policy is UnknownPolicy.LOOKUP and not adapter_for(provider.kind).supports_lookup:
        raise InvalidMessage(
            "on_unknown", f"provider {provider.name!r} ({provider.kind}) cannot look messages up"
        )
    return policy


def _insert(session: Session, values: dict[str, Any]) -> Message | None:
    dialect = session.get_bind().dialect.name
    stmt: Any
    if dialect == "postgresql":
        stmt = postgresql.insert(Message).on_conflict_do_nothing(index_elements=["key"])
    elif dialect == "sqlite":
        stmt = sqlite.insert(Message).on_conflict_do_nothing(index_elements=["key"])
    else:  # pragma: no cover - other databases: look first, then add
        if session.scalars(select(Message.id).where(Message.key == values["key"])).first():
            return None
        message = Message(**values)
        session.add(message)
        session.flush()
        return message
    return session.scalars(stmt.values(values).returning(Message)).first()


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

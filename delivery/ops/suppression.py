"""The suppression list for ops: list it, add a recipient, lift one; every change audited.

The list holds keyed hashes only (``delivery.guards.suppression``): a listing shows each
entry's channel, the first characters of its hash, its code and its source, never a
recipient; adding or lifting takes the recipient, checks it and puts it in the form messages
carry it (``enqueue``'s rules), and hashes it the same way a worker does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from delivery.config.settings import CHANNELS
from delivery.errors import ConfigError, InvalidMessage
from delivery.guards.suppression import Suppressions
from delivery.ops.audit import record
from delivery.outbox.validation import check_recipient

__all__ = ["SuppressionRow", "lift", "suppress", "suppressions"]

_SHOWN = 12  # hex characters of a hash shown: enough to tell entries apart


@dataclass(frozen=True, slots=True)
class SuppressionRow:
    channel: str
    hash: str
    code: str | None
    source: str
    created_at: dt.datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "hash": self.hash,
            "code": self.code,
            "source": self.source,
            "created_at": self.created_at.isoformat(),
        }


def _ready(lists: Suppressions, channel: str, recipient: str) -> str:
    """``recipient`` as messages to ``channel`` carry it (``enqueue``'s canonical form: an
    email's domain in lower case, ...), which is what a worker hashes; ``InvalidMessage``
    naming ``recipient`` (never echoing it) when it is not one."""
    if lists.key is None:
        raise ConfigError(
            "delivery.suppression_secret_env", "its environment variable is unset: no list"
        )
    if channel not in CHANNELS:
        raise InvalidMessage("channel", f"{channel!r} is not one of {', '.join(CHANNELS)}")
    try:
        return check_recipient(channel, recipient)
    except InvalidMessage as exc:
        raise InvalidMessage("recipient", f"{exc.problem} (for channel {channel})") from None


def suppressions(
    session: Session, lists: Suppressions, *, limit: int = 100
) -> list[SuppressionRow]:
    """The newest entries of the list."""
    return [
        SuppressionRow(channel, digest[:_SHOWN], code, source, created_at)
        for channel, digest, code, source, created_at in lists.entries(
            session.connection(), limit=limit
        )
    ]


def suppress(
    session: Session, lists: Suppressions, channel: str, recipient: str, *, actor: str
) -> bool:
    """Put ``recipient`` on ``channel``'s list (audited); False if it was on it already."""
    recipient = _ready(lists, channel, recipient)
    added = lists.add(session.connection(), channel, recipient, code=None, source=actor)
    if added:
        shown = (lists.hash(channel, recipient) or "")[:_SHOWN]
        record(session, actor=actor, action="suppress", detail=f"{channel} {shown}")
    return added


def lift(
    session: Session, lists: Suppressions, channel: str, recipient: str, *, actor: str
) -> bool:
    """Take ``recipient`` off ``channel``'s list (audited); False if it was not on it."""
    recipient = _ready(lists, channel, recipient)
    lifted = lists.lift(session.connection(), channel, recipient)
    if lifted:
        shown = (lists.hash(channel, recipient) or "")[:_SHOWN]
        record(session, actor=actor, action="lift", detail=f"{channel} {shown}")
    return lifted

"""Observation hooks: every state change of a message is a frozen ``Transition``.

By default each transition is logged as one JSON line on the ``delivery.events`` logger, with
the recipient masked. ``add_hook`` registers more observers (metrics); a failing hook is
logged and isolated, never allowed to break a send.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["Transition", "add_hook", "emit", "mask", "remove_hook"]

log = logging.getLogger("delivery.events")


@dataclass(frozen=True, slots=True)
class Transition:
    message_id: int
    key: str
    provider: str
    from_status: str
    to_status: str
    attempt: int
    outcome: str | None = None
    code: str | None = None
    delay: float | None = None
    enqueued_at: dt.datetime | None = None  # on ``sent``: for the enqueue -> accept latency


Hook = Callable[[Transition], None]
_hooks: list[Hook] = []


def add_hook(hook: Hook) -> None:
    _hooks.append(hook)


def remove_hook(hook: Hook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


def mask(recipient: str) -> str:
    """``+15551234567`` -> ``+1*******567``; ``ann@example.com`` -> ``a**@example.com``."""
    if "@" in recipient:
        user, _, domain = recipient.partition("@")
        return f"{user[:1]}{'*' * max(len(user) - 1, 1)}@{domain}"
    return f"{recipient[:2]}{'*' * max(len(recipient) - 5, 1)}{recipient[-3:]}"


def emit(transition: Transition) -> None:
    if log.isEnabledFor(logging.INFO):
        fields = {k: v for k, v in asdict(transition).items() if v is not None}
        log.info(json.dumps({"event": "transition", **fields}, default=str))
    for hook in list(_hooks):
        try:
            hook(transition)
        except Exception:
            log.exception("delivery hook %r failed", hook)

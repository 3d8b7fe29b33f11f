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
from typing import Any, Generic, TypeVar

__all__ = ["Hooks", "Transition", "add_hook", "emit", "emit_moved", "mask", "remove_hook"]

log = logging.getLogger("delivery.events")
T = TypeVar("T")


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


class Hooks(Generic[T]):
    """The observers of one kind of event. ``call`` passes the event to each in turn; a hook
    that raises is logged on ``log`` (as ``"{what} {hook!r} failed"``) and isolated: it never
    breaks a send, nor keeps the next hook from its event."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log, self._what = log, what
        self._hooks: list[Callable[[T], None]] = []

    def add(self, hook: Callable[[T], None]) -> None:
        self._hooks.append(hook)

    def remove(self, hook: Callable[[T], None]) -> None:
        if hook in self._hooks:
            self._hooks.remove(hook)

    def call(self, event: T) -> None:
        for hook in list(self._hooks):
            try:
                hook(event)
            except Exception:
                self._log.exception("%s %r failed", self._what, hook)


Hook = Callable[[Transition], None]
_hooks: Hooks[Transition] = Hooks(log, "delivery hook")


def add_hook(hook: Hook) -> None:
    _hooks.add(hook)


def remove_hook(hook: Hook) -> None:
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
    _hooks.call(transition)


def emit_moved(
    row: Any, from_status: str, to_status: str, outcome: str | None = None, code: str | None = None
) -> None:
    """``emit`` the move of ``row``, anything with the moved message's ``id``, ``key``,
    ``provider`` and ``attempts`` (a ``RETURNING`` row, a relay's claim)."""
    emit(
        Transition(
            row.id, row.key, row.provider, from_status, to_status, row.attempts, outcome, code
        )
    )

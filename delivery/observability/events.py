"""Observation hooks: every state change of a message is a frozen ``Transition``.

By default each transition is logged as one JSON line on the ``delivery.events`` logger, with
the recipient masked. ``add_hook`` registers more observers (metrics); a failing hook is
logged and isolated, never allowed to break a send.

Outcome hooks tell the app how a message ended: ``add_outcome_hook`` registers a function
called with an ``Outcome`` (the message's id, key and type, the status, the code; never the
recipient) when a message reaches one of ``OUTCOME_STATUSES``, once the change is committed
and never when it is rolled back. A transition to one of them is held in the current scope
instead: ``tell_outcomes_after()``, opened *outside* the transaction (``with
tell_outcomes_after(), engine.begin() as conn:``), calls the outcome hooks with what it held
when its block ends normally (the commit has returned), and drops them when it raises. For an
autocommit connection each statement has committed when it returns: the same scope around
the ``with ....connect()`` block is right. A caller whose commit comes later, elsewhere (an
operator's repair in a ``Session``: ``delivery.transitions.repair``), holds them with
``held_outcomes()`` and passes them to ``tell_outcomes`` once that commit happened. An
outcome emitted with no scope open is a bug of ours: it is logged at ERROR on
``delivery.outcomes`` and its hooks are not called (there is no commit to wait for).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from delivery.observability import tracing

__all__ = [
    "OUTCOME_STATUSES",
    "Hooks",
    "Outcome",
    "Transition",
    "add_hook",
    "add_outcome_hook",
    "emit",
    "emit_moved",
    "held_outcomes",
    "mask",
    "remove_hook",
    "remove_outcome_hook",
    "tell_outcomes",
    "tell_outcomes_after",
]

log = logging.getLogger("delivery.events")
outcome_log = logging.getLogger("delivery.outcomes")
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
    #: The message's type (``enqueue(type=...)``), set by the transitions that can end in one
    #: of ``OUTCOME_STATUSES``; None for a message without one.
    message_type: str | None = None
    #: A failover (``delivery.transitions.failover.fail_over``; ``code``: its reason): the provider
    #: it moved to from ``provider``, and the message's channel.
    to_provider: str | None = None
    channel: str | None = None
    #: The message's stored W3C trace context (``delivery.observability.tracing``), when the
    #: row it moved was read with it.
    traceparent: str | None = None


#: The statuses the app is told of (``add_outcome_hook``): how a message ended for its
#: recipient. ``sent`` is not one: a receipt may still come.
OUTCOME_STATUSES = frozenset({"delivered", "undelivered", "suppressed", "dead"})


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a message ended, as the app is told (``add_outcome_hook``), after the commit: its
    ``message_id``, idempotency ``key`` and ``message_type`` (None without one), the
    ``status`` it reached (one of ``OUTCOME_STATUSES``) and the provider's or our ``code``
    (``SUPPRESSED``, ``PROVIDER_NOT_CONFIGURED``, a receipt's code), if any. Never the
    recipient nor the payload."""

    message_id: int
    key: str
    message_type: str | None
    status: str
    code: str | None


class Hooks(Generic[T]):
    """The observers of one kind of event. ``call`` passes the event to each in turn; a hook
    that raises is logged on ``log`` (as ``"{what} {hook!r} failed"``) and isolated: it never
    breaks a send, nor keeps the next hook from its event."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log, self._what = log, what
        self._hooks: list[Callable[[T], None]] = []

    def add(self, hook: Callable[[T], None]) -> None:
        self._hooks.append(hook)

    def __contains__(self, hook: object) -> bool:
        return hook in self._hooks

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


OutcomeHook = Callable[[Outcome], None]
_outcome_hooks: Hooks[Outcome] = Hooks(outcome_log, "outcome hook")
#: The outcomes held until the commit of the block that made them (``tell_outcomes_after``).
_held: ContextVar[list[Outcome] | None] = ContextVar("delivery_outcomes", default=None)


def add_outcome_hook(hook: OutcomeHook) -> None:
    """Call ``hook`` with an ``Outcome`` each time a message reaches one of
    ``OUTCOME_STATUSES``, after the change is committed (never on a rollback), in the process
    that made it (a worker, the receipt receiver, ...: ``[delivery] outcome_hooks`` registers
    it there). A hook added twice is called once; one that raises is logged, never breaks
    anything, and the next hook still runs."""
    if hook not in _outcome_hooks:
        _outcome_hooks.add(hook)


def remove_outcome_hook(hook: OutcomeHook) -> None:
    _outcome_hooks.remove(hook)


@contextmanager
def held_outcomes() -> Iterator[list[Outcome]]:
    """A scope that holds the outcomes emitted in it, in the list it yields, and tells no
    hook: for a caller that tells them (``tell_outcomes``) once its own commit happened."""
    held: list[Outcome] = []
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


@contextmanager
def tell_outcomes_after() -> Iterator[None]:
    """Hold the outcomes emitted in the block; tell the outcome hooks once it ended normally,
    drop them if it raised. Open it outside the transaction, so that its commit comes first:
    ``with tell_outcomes_after(), engine.begin() as conn:``."""
    with held_outcomes() as held:
        yield
    tell_outcomes(held)


def tell_outcomes(outcomes: Iterable[Outcome]) -> None:
    """Call every outcome hook with each of ``outcomes`` (committed: the caller knows)."""
    for outcome in outcomes:
        _outcome_hooks.call(outcome)


def _hold(transition: Transition) -> None:
    status = str(transition.to_status)
    held = _held.get()
    if held is None:
        outcome_log.error(
            "outcome %s of message %s emitted outside tell_outcomes_after(): its hooks are "
            "not called",
            status,
            transition.message_id,
        )
        return
    held.append(
        Outcome(
            transition.message_id, transition.key, transition.message_type, status, transition.code
        )
    )


def mask(recipient: str) -> str:
    """``+15551234567`` -> ``+1*******567``; ``ann@example.com`` -> ``a**@example.com``."""
    if "@" in recipient:
        user, _, domain = recipient.partition("@")
        return f"{user[:1]}{'*' * max(len(user) - 1, 1)}@{domain}"
    return f"{recipient[:2]}{'*' * max(len(recipient) - 5, 1)}{recipient[-3:]}"


def emit(transition: Transition) -> None:
    if log.isEnabledFor(logging.INFO):
        fields = {k: v for k, v in asdict(transition).items() if v is not None}
        fields.pop("traceparent", None)
        if tracing.active():  # the ids of the span this change is an event of
            fields |= tracing.log_ids(transition.message_id, transition.traceparent)
        log.info(json.dumps({"event": "transition", **fields}, default=str))
    _hooks.call(transition)
    tracing.on_transition(transition)  # a span event, when traces are recorded
    if transition.to_status in OUTCOME_STATUSES:
        _hold(transition)


def emit_moved(
    row: Any, from_status: str, to_status: str, outcome: str | None = None, code: str | None = None
) -> None:
    """``emit`` the move of ``row``, anything with the moved message's ``id``, ``key``,
    ``provider`` and ``attempts`` (a ``RETURNING`` row, a relay's claim), and its
    ``message_type`` when it has one."""
    moved = (from_status, to_status, row.attempts, outcome, code)
    kind = getattr(row, "message_type", None)
    parent = getattr(row, "traceparent", None)
    emit(Transition(row.id, row.key, row.provider, *moved, message_type=kind, traceparent=parent))

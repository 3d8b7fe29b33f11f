"""Failover: when a message moves to the next provider of its route, and to which
(docs/concepts.md, "Failover"). The rule, in one place:

1. **Only while nothing can have taken effect.** The message is not ``pinned`` (no attempt on
   its current provider may have taken effect: each one so far ended with an answer that
   proves it created nothing, ``outcomes.created_nothing``, or a lookup there answered that
   the provider has nothing for the key since), and the call that just failed, if any,
   created nothing either. An ``unknown`` attempt on a provider without a lookup pins the
   message there for good: it is only ever sent again there, with the same key, or goes to
   its ``on_unknown`` policy.
2. **Only when its provider turns it away.** Its provider's breaker is open (it refuses the
   message, or opened on the call that just failed: an outage, no request made), or its next
   try there (the rate limit's wait, the backoff or Retry-After) would come later than
   ``failover_after`` seconds after its enqueue (``Settings.route``: the type's, else the
   channel's; ``"never"``: it always waits for its own provider, breaker or not).
3. **To the first usable provider of its route**, in order, other than the current one: one
   whose breaker is not open (an open one is skipped, as the first was). None usable: it
   stays and waits where it is.

The key travels unchanged (each provider dedupes its own); the move itself is
``delivery.transitions.failover.fail_over``, fenced like every other.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any, Literal

from delivery.config.settings import Settings

__all__ = ["BreakerState", "Reason", "redrive_provider", "target"]

#: Why a message failed over (``delivery_failovers_total``'s ``reason``): its provider's
#: breaker turned it away; its rate limit, or a 429 and its Retry-After, would make it wait;
#: or its answers that created nothing (a 503, a refused connection) and their backoff would.
Reason = Literal["circuit_open", "rate_limited", "unavailable"]
#: A provider's breaker state by name (``CircuitBreaker.status().state``).
BreakerState = Callable[[str], str]


def target(
    settings: Settings, message: Any, next_try: dt.datetime | None, breaker_state: BreakerState
) -> str | None:
    """The provider ``message`` moves to now, or None: it stays on its own. ``message``: the
    ``Sending`` of a call that just failed with an answer that created nothing, or a row its
    worker has not called for (its breaker or rate limit turned it away), with its
    ``provider``, ``pinned``, ``channel``, ``message_type`` and ``created_at`` (``Sending``:
    ``enqueued_at``); ``next_try``: when it could next be tried on its current provider, or
    None when that provider's breaker is open."""
    if message.pinned:
        return None
    route = settings.route(message.channel, message.message_type)
    if message.provider not in route.providers or math.isinf(route.failover_after):
        return None
    enqueued = getattr(message, "enqueued_at", None) or message.created_at
    if next_try is not None and next_try <= enqueued + dt.timedelta(seconds=route.failover_after):
        return None
    others = [name for name in route.providers if name != message.provider]
    return _first(settings, others, lambda name: breaker_state(name) != "open")


def redrive_provider(settings: Settings, message: Any, breaker_state: BreakerState) -> str | None:
    """The provider a redriven ``dead`` message goes to: the first of its route whose breaker
    is closed (``breaker_state(name)``), its own included; None: it keeps its provider (it
    is ``pinned``, has no route, or no breaker of its route is closed)."""
    if message.pinned:
        return None
    route = settings.route(message.channel, message.message_type)
    if message.provider not in route.providers:
        return None
    return _first(settings, route.providers, lambda n: breaker_state(n) in ("closed", "disabled"))


def _first(
    settings: Settings, names: list[str] | tuple[str, ...], usable: Callable[[str], bool]
) -> str | None:
    """The first of ``names`` that is configured and ``usable``."""
    return next((name for name in names if name in settings.providers and usable(name)), None)

"""Calling an adapter: whatever it does, the sender gets one bounded outcome back.

``send`` and ``lookup`` are the only way the pipeline calls an adapter. They keep what
``Provider`` promises even when an adapter breaks it, so no row is ever left in ``sending`` by
an adapter bug: what an adapter's raise or stray return value becomes is in docs/providers.md,
"What a provider answers is bounded" (and ``from_exception``). The exception's text is never
kept or logged (it may name the recipient): the ``delivery.providers`` logger says which
adapter raised which type, where.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, cast

import httpx

from delivery.core import outcomes
from delivery.providers.base import Envelope, Provider

__all__ = ["ADAPTER_BAD_OUTCOME", "ADAPTER_ERROR", "from_exception", "lookup", "send"]

log = logging.getLogger("delivery.providers")

ADAPTER_ERROR = "ADAPTER_ERROR"
ADAPTER_BAD_OUTCOME = "ADAPTER_BAD_OUTCOME"
_Failed = outcomes.Retryable | outcomes.Permanent | outcomes.Unknown


def send(provider: Provider, envelope: Envelope) -> outcomes.Outcome:
    """``provider.send(envelope)`` as one bounded outcome (the table in the docstring)."""
    outcome = _call(provider, "send", envelope, outcomes.Outcome)
    return outcomes.bounded(cast(outcomes.Outcome, outcome), envelope.to)


def lookup(provider: Provider, envelope: Envelope) -> outcomes.LookupOutcome:
    """``provider.lookup(envelope)`` as one bounded lookup outcome."""
    found = _call(provider, "lookup", envelope, outcomes.LookupOutcome)
    if isinstance(found, _Failed):  # it raised, or returned something else
        found = outcomes.LookupFailed(found.code, found.reason, found.http_status)
    return outcomes.bounded(cast(outcomes.LookupOutcome, found), envelope.to)


def from_exception(exc: Exception) -> _Failed:
    """The outcome of an exception raised by an adapter (the table in the docstring)."""
    if isinstance(exc, httpx.HTTPError):
        return outcomes.classify_exception(exc)
    if isinstance(exc, httpx.InvalidURL):
        return outcomes.Permanent(
            "CLIENT_InvalidURL", "the request could not be built: invalid URL"
        )
    return outcomes.Unknown(
        ADAPTER_ERROR,
        f"the adapter raised {type(exc).__name__}; the request may have been sent",
    )


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _call(provider: Provider, what: str, envelope: Envelope, expected: Any) -> object:
    """``provider.<what>(envelope)`` if it returns an ``expected``; else the ``Outcome`` of
    what it raised or returned instead, logged (its type and place, never its text)."""
    name = getattr(provider, "name", "?")
    try:
        value = getattr(provider, what)(envelope)
    except Exception as exc:
        if not isinstance(exc, httpx.HTTPError):  # transport errors are outcomes, not bugs
            log.warning(
                "provider %s: %s raised %s at %s (key %s); recorded as an outcome",
                name,
                what,
                type(exc).__name__,
                _where(exc),
                envelope.key,
            )
        return from_exception(exc)
    if isinstance(value, expected):
        return value
    log.warning(
        "provider %s: %s returned %s, not an outcome (key %s)",
        name,
        what,
        type(value).__name__,
        envelope.key,
    )
    return outcomes.Unknown(ADAPTER_BAD_OUTCOME, f"{what} returned {type(value).__name__}")

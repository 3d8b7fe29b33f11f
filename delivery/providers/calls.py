"""Calling an adapter: whatever it does, the sender gets one bounded outcome back.

``send`` and ``lookup`` are the only way the pipeline calls an adapter. They guarantee what
``Provider`` promises even when an adapter breaks it, so no row is ever left in ``sending``
by an adapter bug:

- returns an outcome: that outcome, with the message's recipient masked in code and reason;
- raises ``httpx.HTTPError``: ``classify_exception`` (connect errors retryable, later ones
  unknown);
- raises ``httpx.InvalidURL``: ``Permanent`` ``CLIENT_InvalidURL`` (never built, never sent);
- raises anything else: ``Unknown`` ``ADAPTER_ERROR``. It may have written the request, so
  the message's unknown policy decides (``retry`` sends again with the same key);
- returns anything else: ``Unknown`` ``ADAPTER_BAD_OUTCOME``.

A lookup that raises or returns garbage is ``LookupFailed`` with the same codes (looked up
again later). The exception's text is never kept or logged (it may name the recipient): the
``delivery.providers`` logger says which adapter raised which type, where.
"""

from __future__ import annotations

import logging
import traceback

import httpx

from delivery.core import outcomes
from delivery.providers.base import Envelope, Provider

__all__ = ["ADAPTER_BAD_OUTCOME", "ADAPTER_ERROR", "from_exception", "lookup", "send"]

log = logging.getLogger("delivery.providers")

ADAPTER_ERROR = "ADAPTER_ERROR"
ADAPTER_BAD_OUTCOME = "ADAPTER_BAD_OUTCOME"


def send(provider: Provider, envelope: Envelope) -> outcomes.Outcome:
    """``provider.send(envelope)`` as one bounded outcome (the table in the docstring)."""
    try:
        outcome: object = provider.send(envelope)
    except Exception as exc:
        _log(provider, "send", envelope, exc)
        outcome = from_exception(exc)
    if not isinstance(outcome, outcomes.Outcome):
        _log_bad(provider, "send", envelope, outcome)
        outcome = outcomes.Unknown(ADAPTER_BAD_OUTCOME, f"send returned {type(outcome).__name__}")
    return outcomes.bounded(outcome, envelope.to)


def lookup(provider: Provider, envelope: Envelope) -> outcomes.LookupOutcome:
    """``provider.lookup(envelope)`` as one bounded lookup outcome."""
    try:
        found: object = provider.lookup(envelope)
    except Exception as exc:
        _log(provider, "lookup", envelope, exc)
        failed = from_exception(exc)
        found = outcomes.LookupFailed(failed.code, failed.reason, failed.http_status)
    if not isinstance(found, outcomes.LookupOutcome):
        _log_bad(provider, "lookup", envelope, found)
        found = outcomes.LookupFailed(
            ADAPTER_BAD_OUTCOME, f"lookup returned {type(found).__name__}"
        )
    return outcomes.bounded(found, envelope.to)


def from_exception(exc: Exception) -> outcomes.Retryable | outcomes.Permanent | outcomes.Unknown:
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


def _log(provider: Provider, what: str, envelope: Envelope, exc: Exception) -> None:
    if not isinstance(exc, httpx.HTTPError):  # transport errors are outcomes, not bugs
        log.warning(
            "provider %s: %s raised %s at %s (key %s); recorded as an outcome",
            getattr(provider, "name", "?"),
            what,
            type(exc).__name__,
            _where(exc),
            envelope.key,
        )


def _log_bad(provider: Provider, what: str, envelope: Envelope, value: object) -> None:
    log.warning(
        "provider %s: %s returned %s, not an outcome (key %s)",
        getattr(provider, "name", "?"),
        what,
        type(value).__name__,
        envelope.key,
    )

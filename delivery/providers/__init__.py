"""Providers: the adapters that speak to an SMS, email or webhook service over HTTP.

- ``base``: what an adapter is (``Provider``: ``send``, ``lookup``, ``close``) and what it is
  given (``Envelope``); ``client``: the base of the built-in adapters, one ``httpx.Client``
  each, reading answers with a body limit and a deadline; ``calls``: how the pipeline calls
  any adapter (whatever it returns or raises becomes one bounded outcome).
- ``registry``: a provider's ``kind`` resolved to its adapter (built in, an entry point in the
  group ``delivery.providers``, or a dotted path) and the adapter's declared settings.
- ``http`` (the reference protocol, spoken by the stub), ``twilio``, ``pigeon``, ``webhook``:
  one module per wire protocol, each with its outcome table in its docstring (Twilio's codes
  and statuses in ``twilio_contract``); ``secrets``: the worker's start-up check that every
  provider's secrets are set; ``egress``: where a webhook may connect (the SSRF guard).

What an adapter author needs is re-exported here (``__all__``).

May import: ``delivery.errors``, ``delivery.config.settings``, ``delivery.core.outcomes``
and ``delivery.core.policies``; nothing that sends, stores or schedules.
"""

from __future__ import annotations

from delivery.config.settings import ProviderConfig, Timeouts
from delivery.core.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    LookupOutcome,
    Outcome,
    Permanent,
    Retryable,
    Unknown,
    classify_exception,
    classify_response,
    parse_retry_after,
)
from delivery.providers.base import Envelope, Provider
from delivery.providers.http import HttpProvider
from delivery.providers.pigeon import PigeonProvider
from delivery.providers.registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    Adapter,
    AdapterFactory,
    adapter_for,
    build_provider,
)
from delivery.providers.twilio import TwilioProvider
from delivery.providers.webhook import WebhookProvider

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "Absent",
    "Adapter",
    "AdapterFactory",
    "Delivered",
    "Envelope",
    "Found",
    "HttpProvider",
    "LookupFailed",
    "LookupOutcome",
    "Outcome",
    "Permanent",
    "PigeonProvider",
    "Provider",
    "ProviderConfig",
    "Retryable",
    "Timeouts",
    "TwilioProvider",
    "Unknown",
    "WebhookProvider",
    "adapter_for",
    "build_provider",
    "classify_exception",
    "classify_response",
    "parse_retry_after",
]

"""What a provider adapter is: ``send`` and ``lookup`` returning outcome values.

An adapter class is called with its ``ProviderConfig``; what it may declare besides (its own
config keys, its default unknown policy, ...) is listed in ``delivery.providers.registry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from delivery.core.outcomes import LookupOutcome, Outcome

__all__ = ["Envelope", "Provider"]


@dataclass(frozen=True, slots=True)
class Envelope:
    """The part of a message an adapter needs. ``key`` goes out on every attempt."""

    key: str
    channel: str
    to: str
    payload: dict[str, Any]


class Provider(Protocol):
    """An adapter maps its provider's answers onto outcomes in one place and never raises
    for a provider's answer or a network error."""

    name: str

    def send(self, envelope: Envelope) -> Outcome: ...

    def lookup(self, envelope: Envelope) -> LookupOutcome: ...

    def close(self) -> None: ...

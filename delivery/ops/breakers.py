"""The circuit breakers as ops see them: one row per configured provider, and a reset that is
audited. The CLI (``delivery breaker``) and the console share these.

States are spelled as the README writes them: ``closed``, ``open``, ``half-open`` (and
``unknown`` when the shared store cannot be read).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from delivery.guards.breaker import Breakers
from delivery.ops.audit import record

__all__ = ["BreakerRow", "breaker_rows", "reset_breaker", "state_name"]


def state_name(state: str) -> str:
    """``half_open`` -> ``half-open``; other states as they are."""
    return state.replace("_", "-")


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """One provider's breaker: its state, failures and calls in the window, the rule that
    opens it (``failure_rate`` of at least ``minimum_calls``), and the next probe."""

    provider: str
    state: str
    failures: int
    calls: int
    failure_rate: float
    minimum_calls: int
    window: float
    next_probe_at: dt.datetime | None
    probe_in_flight: bool

    def as_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__}
        data["next_probe_at"] = (
            None if self.next_probe_at is None else self.next_probe_at.isoformat()
        )
        return data


def breaker_rows(breakers: Breakers) -> list[BreakerRow]:
    """Every configured provider's breaker, in configuration order."""
    rows: list[BreakerRow] = []
    for name, provider in breakers.settings.providers.items():
        status = breakers.get(name).status()
        probe = status.next_probe_at
        rows.append(
            BreakerRow(
                name,
                state_name(status.state),
                status.failures,
                status.calls,
                provider.breaker.failure_rate,
                provider.breaker.minimum_calls,
                provider.breaker.window,
                None if probe is None else dt.datetime.fromtimestamp(probe, dt.UTC),
                status.probe_in_flight,
            )
        )
    return rows


def reset_breaker(session: Session, breakers: Breakers, provider: str, *, actor: str) -> str:
    """Close ``provider``'s breaker and forget its failures; record who did it (the caller
    commits). Returns the state it was in. ``KeyError`` for an unknown provider."""
    if provider not in breakers.settings.providers:
        raise KeyError(provider)
    before = state_name(breakers.get(provider).reset())
    record(
        session,
        actor=actor,
        action="breaker_reset",
        detail=f"breaker {provider}: {before} -> closed",
    )
    return before

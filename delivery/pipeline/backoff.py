"""Backoff between attempts: one pure function."""

from __future__ import annotations

import random

from delivery.config.settings import Backoff

__all__ = ["compute_backoff"]


def compute_backoff(
    attempt: int,
    policy: Backoff,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 attempts were made).

    Full jitter: ``U(0, min(cap, base * 2**attempt))``. A provider's Retry-After wins: the
    delay is then exactly ``retry_after`` (never earlier, and not capped: the provider knows
    best; a long wait goes back to the outbox instead of the broker).
    """
    if retry_after is not None:
        return max(0.0, retry_after)
    ceiling = min(policy.cap, policy.base * 2.0 ** min(max(attempt, 0), 62))
    return (rng or random).uniform(0.0, ceiling)

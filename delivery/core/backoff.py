"""Backoff between attempts: one pure function."""

from __future__ import annotations

import math
import random

from delivery.config.settings import Backoff
from delivery.core.bounds import MAX_RETRY_AFTER

__all__ = ["MAX_BACKOFF", "compute_backoff"]

#: No delay is ever longer than this (a week): a datetime ``now + delay`` cannot overflow.
MAX_BACKOFF = 7 * 86400.0


def compute_backoff(
    attempt: int,
    policy: Backoff,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 attempts were made).

    Full jitter: ``U(0, min(cap, base * 2**attempt))``. A provider's Retry-After wins: the
    delay is then exactly ``retry_after`` (never earlier, and not capped by ``cap``: the
    provider knows best; a long wait goes back to the outbox instead of the broker), clamped
    to ``0 .. MAX_RETRY_AFTER`` (one day). Whatever the inputs, the result is a finite
    number in ``0 .. MAX_BACKOFF``; a NaN Retry-After is ignored.
    """
    if retry_after is not None and not math.isnan(retry_after):
        return min(max(0.0, retry_after), MAX_RETRY_AFTER)
    ceiling = min(policy.cap, policy.base * 2.0 ** min(max(attempt, 0), 62), MAX_BACKOFF)
    if not ceiling > 0.0:  # NaN or negative settings: no wait rather than a broken one
        return 0.0
    return min((rng or random).uniform(0.0, ceiling), MAX_BACKOFF)

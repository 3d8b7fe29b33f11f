"""Relay back-pressure: how many more tasks the relay may publish to each broker queue now.

A message waiting in a broker queue is held by no worker; the relay renews its lease while it
waits (``delivery.sending.leases.renew_queued``), so a long wait costs no second publish, but
it is a message that can no longer be cancelled, reordered or sent in due order. So the relay
keeps each queue short enough to drain well within a ``dispatch_lease`` (which also bounds how
long a queued task waits if the relay stops renewing: beat down, broker depth unknown), and
leaves the rest ``pending`` in the outbox, where a message is cheap, cancellable and ordered by
due time (the same design as Oban's and Sidekiq's fetchers).

``Backpressure.rooms`` takes each queue's depth (asked of the broker before a relay pass) and
estimates how fast workers take from it: ``taken = depth before + published since - depth
now`` over the time between two passes, smoothed (EWMA, ``SMOOTHING``). A queue may hold
``max(floor, rate * dispatch_lease * SHARE)`` tasks: at the measured rate, the last of them
is taken after half the lease. ``floor`` (default ``relay_batch``) keeps a new or idle queue
moving while there is no rate yet. A queue whose depth is unknown (the broker did not say) is
not limited. Pure arithmetic over the numbers it is given; the broker is asked in
``delivery.worker``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["SHARE", "SMOOTHING", "Backpressure"]

#: The share of ``dispatch_lease`` a task may wait in its queue at the measured rate.
SHARE = 0.5
#: Weight of the newest rate measurement in the moving average.
SMOOTHING = 0.3


@dataclass
class Backpressure:
    """Per queue, the room left for new tasks. Not thread-safe: one relay loop owns it."""

    lease: float
    floor: int
    _depth: dict[str, int] = field(default_factory=dict)
    _at: dict[str, float] = field(default_factory=dict)
    _rate: dict[str, float] = field(default_factory=dict)
    _published: dict[str, int] = field(default_factory=dict)

    def limit(self, queue: str) -> int:
        """How many tasks ``queue`` may hold at its measured rate."""
        rate = self._rate.get(queue, 0.0)
        return max(self.floor, int(rate * self.lease * SHARE))

    def rooms(self, depths: Mapping[str, int | None], now: float) -> dict[str, int | None]:
        """Room per queue (``None``: not limited) given each queue's ``depth`` at ``now``
        (monotonic seconds); resets the counts of published tasks."""
        rooms: dict[str, int | None] = {}
        for queue, depth in depths.items():
            if depth is None:
                rooms[queue] = None
                self._depth.pop(queue, None)
                continue
            before, at = self._depth.get(queue), self._at.get(queue)
            if before is not None and at is not None and now > at:
                taken = max(0, before + self._published.get(queue, 0) - depth)
                measured = taken / (now - at)
                old = self._rate.get(queue)
                self._rate[queue] = measured if old is None else old + SMOOTHING * (measured - old)
            self._depth[queue], self._at[queue] = depth, now
            self._published[queue] = 0
            rooms[queue] = max(0, self.limit(queue) - depth)
        return rooms

    def published(self, queue: str, count: int) -> None:
        """``count`` tasks were published to ``queue`` since the last ``rooms``."""
        self._published[queue] = self._published.get(queue, 0) + count

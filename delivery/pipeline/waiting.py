"""Which of the relay's tasks still wait in their broker queue (issue 12 §2).

A task waiting in a broker queue is held by no worker, so nothing but the relay's
``dispatch_lease`` keeps the sweeper from taking its row for lost. Rather than a lease long
enough for the longest wait (which is also how long a task a worker received in its last
instant before being killed stays lost), the relay renews the leases of the tasks it knows
are still queued, on every pass, and ``dispatch_lease`` only has to cover the moment between
the relay's last look at a queue and the worker's first renewal (``tasks/leases.py``).

Queues are first in, first out (a Redis list, a RabbitMQ queue): when a queue holds ``depth``
tasks, they are the last ``depth`` ones published to it. ``Waiting`` remembers, per queue,
the ids the relay published in order and, given the depths the broker reports, keeps only the
newest ``depth``. Tasks the relay did not publish (a post-commit nudge, a worker's countdown
retry, RabbitMQ's redelivery of a killed worker's tasks) count in the depth but not in the
list, so the relay may renew a few rows a worker has already taken: a row then comes back a
``dispatch_lease`` after those tasks leave the queue, never sooner than it should. A queue
whose depth is unknown is forgotten: its rows keep the lease they have. Pure bookkeeping over
the numbers it is given; one relay loop owns it (not thread-safe).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Waiting"]


@dataclass
class Waiting:
    """Per queue, the ids of the relay's tasks that may still be in it, oldest first."""

    _queued: dict[str, deque[int]] = field(default_factory=dict)

    def published(self, queue: str, ids: Iterable[int]) -> None:
        """The relay published tasks for ``ids`` to ``queue``, in this order."""
        self._queued.setdefault(queue, deque()).extend(ids)

    def observe(self, depths: Mapping[str, int | None]) -> list[int]:
        """Given each queue's depth now, forget the tasks that have left it; return the ids
        whose tasks are still waiting (at most ``depth`` per queue, the newest)."""
        waiting: list[int] = []
        for queue, depth in depths.items():
            ids = self._queued.get(queue)
            if ids is None:
                continue
            if depth is None:
                ids.clear()
                continue
            while len(ids) > depth:
                ids.popleft()
            waiting.extend(ids)
        return waiting

"""What a worker's task does: one attempt at each message it carries, on one path whether it
carries one message (``delivery.deliver``) or a batch of them (``delivery.deliver_batch``);
a message alone is a batch of one.

``deliver_many`` takes ``(id, key)`` pairs, what the tasks carry:

1. One SELECT reads every row and the database's clock (``delivery.pipeline.clock``). A
   message that is not there, not ``key``'s, or not ``dispatched`` (a duplicate or late task)
   is skipped; a pair repeated in the batch is skipped the second time.
2. Each other message makes its attempt (``delivery.pipeline.attempt``: checks, rate limit,
   circuit breaker, the take committed before the request leaves, the call) on this
   process's send pool, ``send_concurrency`` in flight; a message alone runs on the task's
   own thread. The breaker is asked by each send when its thread starts it, so a send that
   has not left when the breaker opens is parked, not sent, however long the batch.
3. ``settle.after_sends`` applies the outcomes: every delivery of the batch in one statement
   with its attempt rows, each other outcome in its own transaction.

The answer is a ``Result`` per pair, whose ``action`` is one of the closed set ``Action``
(``delivery.pipeline.transitions``). A batch that fails midway leaves each message where a
message alone would be: ``dispatched`` (not yet taken: the redelivered task, or the relay
after its lease, gives it to a worker again) or ``sending`` (taken: its worker stops renewing
the lease, and the sweeper hands it to its ``on_unknown`` policy ``hold_lease`` s later).
Nothing is lost; a second effect is only the provider's to dedupe.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from sqlalchemy import Row, bindparam, select

from delivery.pipeline.attempt import Clock, attempt
from delivery.pipeline.clock import read_with_clock
from delivery.pipeline.models import messages_table
from delivery.pipeline.settle import Sent, after_sends
from delivery.pipeline.status import Status
from delivery.pipeline.transitions import Action, Result
from delivery.runtime.service import Service

__all__ = ["ROW", "Action", "Result", "deliver", "deliver_many", "send_pool"]

_NO_SUCH = Result(Action.SKIP, reason="no such message")
_REPEATED = Result(Action.SKIP, reason="repeated in its batch")

_COLUMNS = (
    "id",
    "key",
    "channel",
    "provider",
    "recipient",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "needs_lookup",
    "on_unknown",
    "next_attempt_at",
    "lease_expires_at",
    "expires_at",
    "message_type",
    "created_at",
)

#: What one attempt reads of its message.
ROW = select(*(messages_table.c[name] for name in _COLUMNS))
#: A task's rows, one statement object for every task (``read_with_clock`` keeps it).
_ROWS_BY_IDS = ROW.where(messages_table.c.id.in_(bindparam("ids", expanding=True)))

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def send_pool(size: int) -> ThreadPoolExecutor:
    """This process's pool of send threads (``size`` of them; made again after a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max(size, 1), thread_name_prefix="delivery-send")
            _pool_pid = os.getpid()
        return _pool


def _attempts(
    service: Service, rows: Sequence[Row[Any]], clock: Clock
) -> Iterator[list[tuple[int, Result | Sent]]]:
    """Make the attempts at ``rows`` on the send pool (inline, one after the other, when there
    is only one or no pool) and yield their answers as they come, a group at a time: what
    finished while the last group was settled. An attempt that raised is raised once every
    other has finished (and been settled)."""
    if len(rows) <= 1 or service.settings.send_concurrency <= 1:
        for row in rows:
            yield [_attempt(service, row, clock)]
        return
    pool = send_pool(service.settings.send_concurrency)
    running = {pool.submit(_attempt, service, row, clock) for row in rows}
    error: BaseException | None = None
    while running:
        done, running = wait(running, return_when=FIRST_COMPLETED)
        group = []
        for future in done:
            if future.exception() is None:
                group.append(future.result())
            else:
                error = error or future.exception()
        yield group
    if error is not None:
        raise error


def deliver(service: Service, message_id: int, key: str) -> Result:
    """One attempt at message ``message_id`` (if it is still ``key``'s and due): a batch of
    one, and what its task does next."""
    return deliver_many(service, [(message_id, key)])[0]


def deliver_many(
    service: Service,
    pairs: Sequence[tuple[int, str]],
    *,
    on_read: Callable[[Mapping[int, int]], object] | None = None,
) -> list[Result]:
    """One attempt at each message of ``pairs`` (id, key); the ``Result`` of each, in order.
    ``on_read`` is called with each found message's attempt count once the rows are read,
    before anything is sent."""
    ids = sorted({message_id for message_id, _ in pairs})
    with service.autocommit.connect() as conn:
        rows, now = read_with_clock(conn, _ROWS_BY_IDS, {"ids": ids})
    clock = Clock(now, time.monotonic())
    by_id = {row.id: row for row in rows}
    if on_read is not None:
        on_read({row.id: row.attempts for row in rows})
    results: dict[int, Result] = {}
    ready: list[Row[Any]] = []
    first: dict[int, str] = {}
    for message_id, key in pairs:
        first.setdefault(message_id, key)
    for message_id, key in first.items():
        row = by_id.get(message_id)
        if row is None or row.key != key:
            results[message_id] = _NO_SUCH
        elif row.status != Status.DISPATCHED:
            reason = f"message is {row.status}"
            results[message_id] = Result(Action.SKIP, status=row.status, reason=reason)
        else:
            ready.append(row)
    for answers in _attempts(service, ready, clock):
        # Settled as they come: a taken row waits in ``sending`` for its own call only, never
        # for the whole batch (its lease covers the call: delivery.pipeline.leases).
        results.update((i, a) for i, a in answers if isinstance(a, Result))
        results.update(after_sends(service, [a for _, a in answers if isinstance(a, Sent)]))
    answered: set[int] = set()
    out: list[Result] = []
    for message_id, _ in pairs:
        out.append(_REPEATED if message_id in answered else results[message_id])
        answered.add(message_id)
    return out


def _attempt(service: Service, row: Row[Any], clock: Clock) -> tuple[int, Result | Sent]:
    return row.id, attempt(service, row, clock)

"""What a worker's task does: one attempt at each message it carries, on one path whether it
carries one message (``delivery.deliver``) or a batch of them (``delivery.deliver_batch``);
a message alone is a batch of one (docs/concepts.md, "A backlog travels in batches").

``deliver_many`` reads every row of its ``(id, key)`` pairs and the database's clock in one
SELECT (a message that is not there, not ``key``'s or not ``dispatched`` is skipped), makes
each other message's attempt (``delivery.sending.attempt``) on this process's send pool, and
settles the outcomes together (``settle.after_sends``). The answer is a ``Result`` per pair.
A batch that fails midway leaves each message where a message alone would be: ``dispatched``
(not yet taken) or ``sending`` (taken: the sweeper hands it to its ``on_unknown`` policy
``hold_lease`` s after its worker stops renewing the lease).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Any

from sqlalchemy import Row, bindparam, select

from delivery.core.clock import read_with_clock
from delivery.core.models import messages_table
from delivery.core.status import Status
from delivery.observability import tracing
from delivery.runtime.service import Service
from delivery.sending.attempt import (
    Clock,
    Entry,
    Taken,
    admit,
    call,
    check,
    entry_id,
    suppress,
    suppressed,
)
from delivery.sending.settle import Sent, after_sends
from delivery.transitions import Action, Result

__all__ = ["ROW", "Action", "Result", "Slots", "deliver", "deliver_many", "send_pool"]

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
    "pinned",
    "on_unknown",
    "next_attempt_at",
    "lease_expires_at",
    "expires_at",
    "message_type",
    "created_at",
    "traceparent",
)

#: What one attempt reads of its message.
ROW = select(*(messages_table.c[name] for name in _COLUMNS))
#: A task's rows, one statement object for every task (``read_with_clock`` keeps it).
_ROWS_BY_IDS = ROW.where(messages_table.c.id.in_(bindparam("ids", expanding=True)))


class Slots:
    """This process's free send slots, one per send thread, shared by every task of the
    process: taken a wave at a time (``take``: at least ``least`` at once, so that tasks
    running side by side do not each hold a few idle slots and send in waves of one or two),
    freed one per finished send (``release``)."""

    def __init__(self, size: int) -> None:
        self.size, self._free = size, size
        self._changed = threading.Condition()
        self._wanted: list[int] = []  # the ``least`` of each task waiting in ``take``

    def take(self, least: int, most: int, timeout: float | None) -> int:
        """Up to ``most`` slots once at least ``least`` are free (waiting up to ``timeout`` s,
        for good if None): how many were taken, 0 if ``least`` were not free in time."""
        with self._changed:
            if self._free < least:
                if timeout == 0:
                    return 0
                self._wanted.append(least)
                try:
                    if not self._changed.wait_for(lambda: self._free >= least, timeout):
                        return 0
                finally:
                    self._wanted.remove(least)
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def release(self, count: int = 1) -> None:
        """Free ``count`` slots; the waiting tasks are woken only once one of them has enough."""
        if count:
            with self._changed:
                self._free = min(self.size, self._free + count)
                if self._wanted and self._free >= min(self._wanted):
                    self._changed.notify_all()


_pool: ThreadPoolExecutor | None = None
_slots: Slots | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def send_pool(size: int) -> tuple[ThreadPoolExecutor, Slots]:
    """This process's pool of send threads (``size`` of them; made again after a fork) and its
    free send slots, one per thread, shared by every task of the process."""
    global _pool, _slots, _pool_pid
    with _pool_lock:
        if _pool is None or _slots is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max(size, 1), thread_name_prefix="delivery-send")
            _slots = Slots(max(size, 1))
            _pool_pid = os.getpid()
        return _pool, _slots


def _attempts(service: Service, rows: Sequence[Row[Any]], clock: Clock) -> dict[int, Result]:
    """Make the attempts at ``rows``; the ``Result`` of each, by id.

    Each row is checked (``attempt.suppressed``, ``attempt.check``); the others are admitted
    (breaker, take) only as send slots free up, in waves of at least half the pool's slots (or
    all it still needs), so
    a permit never outlives the moment its request leaves by more than a statement. A message
    alone, or every message when there is no pool, is sent on the task's own thread. The calls
    made are settled together, at the end or once the first has waited ``hold_lease / 2`` s
    (a taken row waits in ``sending`` within its lease however long the batch). An attempt
    that raised is raised once every other has finished and been settled."""
    results: dict[int, Result] = {}
    todo: list[Entry] = []
    listed = suppressed(service, rows)
    for row in rows:
        checked = suppress(service, row) if row.id in listed else check(service, row, clock)
        if checked is None:
            todo.append(row)
        else:
            results[row.id] = checked
    made = _Made(service, results)

    def admit_wave(size: int) -> list[Taken]:
        nonlocal todo
        wave, todo = todo[:size], todo[size:]
        admitted = admit(service, wave, clock, todo)
        results.update(admitted.results)
        if admitted.results or admitted.ahead:
            done, ahead = admitted.results, admitted.ahead
            todo = [ahead.get(entry_id(e), e) for e in todo if entry_id(e) not in done]
        return admitted.sends

    if len(rows) <= 1 or service.settings.send_concurrency <= 1:
        while todo:
            made.add([(t.row.id, call(service, t)) for t in admit_wave(1)])
            made.settle()
        return results
    pool, slots = send_pool(service.settings.send_concurrency)
    # The calls answer on a queue of the task's own (not ``concurrent.futures.wait``, whose
    # waiter on every future in flight cost more than the send's own bookkeeping).
    answers: SimpleQueue[tuple[int, Result | Sent] | BaseException] = SimpleQueue()
    running = 0
    error: BaseException | None = None
    enough = max(1, min(service.settings.send_concurrency // 2, slots.size))
    while todo or running:
        # With calls of its own in flight the task waits for them (below); with none, for slots.
        least, wait_for = min(len(todo), enough), 0 if running else made.wait(None)
        free = slots.take(least, len(todo), wait_for) if todo else 0
        if free:
            try:
                sends = admit_wave(free)
            except BaseException:
                slots.release(free)
                raise
            slots.release(free - len(sends))
            for t in sends:
                pool.submit(_call, service, slots, t, answers)
            running += len(sends)
        if running:
            try:
                answer = answers.get(timeout=made.wait(0.05 if todo else None))
            except Empty:
                answer = None
            while answer is not None:
                running -= 1
                if isinstance(answer, BaseException):
                    error = error or answer
                else:
                    made.add([answer])
                answer = answers.get_nowait() if not answers.empty() else None
        if made.due():
            made.settle()
    made.settle()
    if error is not None:
        raise error
    return results


class _Made:
    """The calls made and not yet settled; settled together into ``results``."""

    def __init__(self, service: Service, results: dict[int, Result]) -> None:
        self.service, self.results = service, results
        self.calls: list[Sent] = []
        self.limit = service.settings.hold_lease / 2

    def add(self, answers: Sequence[tuple[int, Result | Sent]]) -> None:
        for message_id, answer in answers:
            if isinstance(answer, Sent):
                self.calls.append(answer)
            else:  # settled by its lookup, whose move ended its span (if the fence let it)
                self.results[message_id] = answer
                tracing.end_attempts([message_id])

    def wait(self, poll: float | None) -> float | None:
        """How long the loop may wait before the oldest call must be settled (``poll`` at most)."""
        if not self.calls:
            return poll
        oldest = min(c.started for c in self.calls)
        left = max(0.0, oldest + self.limit - time.perf_counter())
        return left if poll is None else min(left, poll)

    def due(self) -> bool:
        return bool(self.calls) and self.wait(None) == 0.0

    def settle(self) -> None:
        if self.calls:
            self.results |= after_sends(self.service, self.calls)
            # Each move ended its attempt's span; one the fence refused ends here.
            tracing.end_attempts(call.msg.id for call in self.calls)
            self.calls = []


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
    first: dict[int, int] = {}  # each message id's first place in pairs
    for place, (message_id, _) in enumerate(pairs):
        first.setdefault(message_id, place)
    for message_id, place in first.items():
        row, key = by_id.get(message_id), pairs[place][1]
        if row is None or row.key != key:
            results[message_id] = _NO_SUCH
        elif row.status != Status.DISPATCHED:
            reason = f"message is {row.status}"
            results[message_id] = Result(Action.SKIP, status=row.status, reason=reason)
        else:
            ready.append(row)
    results |= _attempts(service, ready, clock)
    return [results[m] if first[m] == place else _REPEATED for place, (m, _) in enumerate(pairs)]


def _call(
    service: Service,
    slots: Slots,
    taken: Taken,
    answers: SimpleQueue[tuple[int, Result | Sent] | BaseException],
) -> None:
    """``attempt.call`` on a send thread; its answer (or what it raised) goes on ``answers``."""
    try:
        answers.put((taken.row.id, call(service, taken)))
    except BaseException as exc:
        answers.put(exc)
    finally:
        slots.release()

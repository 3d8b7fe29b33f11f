"""Group commit: the receipts that arrive together are stored together, in one transaction.

Each request's thread hands its receipt to ``GroupCommit.submit`` and waits. One writer
thread takes every receipt waiting (up to ``limit``), stores them with one call of ``store``
(one transaction: one round of statements and one commit for them all, instead of one each),
and hands each thread its result. A batch that fails for a reason of its own, not because the
database is away, is stored again one receipt at a time, so that one bad receipt never costs
the others their answer; when the database is away, every receipt of the batch gets the
error at once (the receiver answers 503).

The writer thread starts with the first receipt (and again in a forked child, where it did
not survive the fork).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["AWAY", "GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")

AWAY = (OperationalError, InterfaceError, PoolTimeout)
"""The errors that say the database is away or too slow, not that a receipt is bad."""


class _Waiting(Generic[T, R]):
    """One item and, once its batch is stored, its result or error: handed to the thread that
    waits through a lock held until then. A ``concurrent.futures.Future`` does the same
    through a ``Condition`` (a lock, a waiter lock and a list): with 32 threads handing over
    items, 59 µs of CPU per item against 38 µs this way (2026-12-06; the receiver spends
    about 350-500 µs per receipt)."""

    __slots__ = ("error", "item", "ready", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.ready = threading.Lock()
        self.ready.acquire()  # released by the writer, once result or error is set

    def set(self, result: R | None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.ready.release()


class GroupCommit(Generic[T, R]):
    """Stores items through ``store`` (the items of one batch -> their results, in order) from
    one writer thread, in batches of at most ``limit``."""

    def __init__(self, store: Callable[[Sequence[T]], Sequence[R]], limit: int = 64) -> None:
        self._store, self._limit = store, limit
        self._queue: queue.SimpleQueue[_Waiting[T, R]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid = 0

    def submit(self, item: T, timeout: float) -> R:
        """``item``'s result once its batch is stored; raises what storing it raised, or
        ``TimeoutError`` after ``timeout`` seconds (it may still be stored later)."""
        self._start()
        waiting: _Waiting[T, R] = _Waiting(item)
        self._queue.put(waiting)
        if not waiting.ready.acquire(timeout=timeout):
            raise TimeoutError(f"not stored within {timeout} s")
        if waiting.error is not None:
            raise waiting.error
        return waiting.result  # type: ignore[return-value]  # set, as no error was

    def _start(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                threading.Thread(target=self._write, name="receipts-writer", daemon=True).start()
                self._pid = os.getpid()

    def _write(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self._limit:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write_batch(batch)

    def _write_batch(self, batch: list[_Waiting[T, R]]) -> None:
        try:
            results = self._store([waiting.item for waiting in batch])
        except AWAY as exc:
            for waiting in batch:
                waiting.set(None, exc)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].set(None, exc)
            else:
                for one in batch:
                    self._write_batch([one])
        else:
            for waiting, result in zip(batch, results, strict=True):
                waiting.set(result)

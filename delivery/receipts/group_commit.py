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
from concurrent.futures import Future
from typing import Generic, TypeVar

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["AWAY", "GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")

AWAY = (OperationalError, InterfaceError, PoolTimeout)
"""The errors that say the database is away or too slow, not that a receipt is bad."""


class GroupCommit(Generic[T, R]):
    """Stores items through ``store`` (the items of one batch -> their results, in order) from
    one writer thread, in batches of at most ``limit``."""

    def __init__(self, store: Callable[[Sequence[T]], Sequence[R]], limit: int = 64) -> None:
        self._store, self._limit = store, limit
        self._queue: queue.SimpleQueue[tuple[T, Future[R]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid = 0

    def submit(self, item: T, timeout: float) -> R:
        """``item``'s result once its batch is stored; raises what storing it raised, or
        ``TimeoutError`` after ``timeout`` seconds (it may still be stored later)."""
        self._start()
        done: Future[R] = Future()
        self._queue.put((item, done))
        return done.result(timeout)

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

    def _write_batch(self, batch: list[tuple[T, Future[R]]]) -> None:
        try:
            results = self._store([item for item, _ in batch])
        except AWAY as exc:
            for _, done in batch:
                done.set_exception(exc)
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
            else:
                for one in batch:
                    self._write_batch([one])
        else:
            for (_, done), result in zip(batch, results, strict=True):
                done.set_result(result)

"""The receiver's group commit (``delivery.receipts.group_commit``): receipts in flight at once
are stored by one call; a bad one fails alone; a database that is away fails the batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from delivery.receipts.group_commit import GroupCommit


class Store:
    """A ``store`` that waits until ``release`` is set, so that a batch builds up behind the
    first call; it remembers each batch and fails on the items named in ``bad``."""

    def __init__(self, bad: set[int] | None = None, away: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.bad, self.away = bad or set(), away

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.entered.set()
        self.release.wait(10)
        self.batches.append(list(items))
        if self.away:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        if self.bad & set(items):
            raise IntegrityError("INSERT", {}, Exception("bad row"))
        return [item * 10 for item in items]


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def submit_all(commits: GroupCommit[int, int], items: Sequence[int]) -> dict[int, object]:
    """Submit each of ``items`` from a thread of its own; each one's result or exception."""
    results: dict[int, object] = {}

    def one(item: int) -> None:
        try:
            results[item] = commits.submit(item, timeout=10)
        except Exception as exc:
            results[item] = exc

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    return results


def behind_a_first(store: Store, commits: GroupCommit[int, int], n: int) -> dict[int, object]:
    """Submit 0, and once the writer holds it in ``store``, 1..n, which queue up behind it;
    then let ``store`` go on. What each of 0..n got."""
    results: dict[int, object] = {}
    first = threading.Thread(target=lambda: results.update(submit_all(commits, [0])))
    first.start()
    assert store.entered.wait(10)  # the writer took 0 and waits in store
    rest = threading.Thread(target=lambda: results.update(submit_all(commits, range(1, n + 1))))
    rest.start()
    until(lambda: commits._queue.qsize() >= n)
    store.release.set()
    for thread in (first, rest):
        thread.join(15)
    return results


def test_receipts_in_flight_at_once_are_stored_by_one_call() -> None:
    store = Store()
    results = behind_a_first(store, GroupCommit(store, limit=64), 20)
    assert len(store.batches) == 2 and store.batches[0] == [0]
    assert sorted(store.batches[1]) == list(range(1, 21))
    assert results == {item: item * 10 for item in range(21)}


def test_a_batch_is_never_larger_than_its_limit() -> None:
    store = Store()
    results = behind_a_first(store, GroupCommit(store, limit=4), 10)
    assert max(len(batch) for batch in store.batches) == 4
    assert results == {item: item * 10 for item in range(11)}


def test_a_bad_receipt_fails_alone() -> None:
    """The batch with a bad item fails; each of its items is stored again alone, so only the
    bad one gets the error."""
    store = Store(bad={3})
    store.release.set()
    commits = GroupCommit(store)
    results = submit_all(commits, range(1, 9))
    assert isinstance(results.pop(3), IntegrityError)
    assert results == {item: item * 10 for item in range(1, 9) if item != 3}
    assert [3] in store.batches


def test_a_database_that_is_away_fails_the_whole_batch_at_once() -> None:
    """No receipt of the batch is tried again alone (each would wait out the database again):
    every one gets the error, and the receiver answers 503."""
    store = Store(away=True)
    results = behind_a_first(store, GroupCommit(store), 5)
    assert all(isinstance(result, OperationalError) for result in results.values())
    assert sorted(results) == [0, 1, 2, 3, 4, 5]
    assert len(store.batches) == 2  # [0], then the five together: none tried alone


def test_a_request_that_waits_too_long_gets_a_timeout() -> None:
    store = Store()
    commits = GroupCommit(store)
    with pytest.raises(TimeoutError):
        commits.submit(1, timeout=0.2)
    store.release.set()

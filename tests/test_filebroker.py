"""The embedded default's file broker (tasks.filebroker): a consumer never sees a half-written
message, and with several publishers and consumers every message is taken exactly once."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from delivery.worker.filebroker import TRANSPORT, WRITING, options


def _connection(folder: Path) -> Connection:
    return Connection("filesystem://", transport=TRANSPORT, transport_options=options(folder, 0.01))


def test_a_message_being_written_is_invisible_to_consumers(tmp_path: Path) -> None:
    """The transport's own half-written file (what kombu's transport left visible under its final
    name) is skipped: the consumer finds nothing rather than failing on an empty payload."""
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs")
        (tmp_path / f"{WRITING}1_abc.jobs.msg").write_bytes(b"")
        with pytest.raises(Empty):
            queue.get(block=False)
        assert queue.qsize() == 0
        queue.put({"n": 1})
        assert queue.get(timeout=5).payload == {"n": 1}
        queue.close()


def _publish(folder: str, start: int, count: int) -> None:
    with _connection(Path(folder)) as conn:
        queue = conn.SimpleQueue("jobs")
        for n in range(start, start + count):
            queue.put({"n": n})
        queue.close()


def _consume(folder: str, seen: multiprocessing.Queue, done: Any) -> None:  # type: ignore[type-arg]
    with _connection(Path(folder)) as conn:
        queue = conn.SimpleQueue("jobs")
        while not done.is_set():  # until the test has every message: no idle-time guess
            try:
                message = queue.get(block=False)
            except Empty:
                time.sleep(0.01)
                continue
            seen.put(message.payload["n"])
            message.ack()
        queue.close()


def test_concurrent_publishers_and_consumers_take_each_message_once(tmp_path: Path) -> None:
    # Fresh interpreters, not forks of this one (its threads and connections stay here); the
    # fork server imports this module once and forks each of them from that clean process,
    # instead of six interpreters importing kombu and celery each.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    seen: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    done = ctx.Event()
    per, publishers, consumers = 300, 3, 3
    procs = [
        ctx.Process(target=_publish, args=(str(tmp_path), i * per, per)) for i in range(publishers)
    ]
    procs += [
        ctx.Process(target=_consume, args=(str(tmp_path), seen, done)) for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    taken: list[int] = []
    try:
        while len(taken) < per * publishers:
            taken.append(seen.get(timeout=120))
    finally:
        done.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    while not seen.empty():  # a message taken twice would show here
        taken.append(seen.get(timeout=5))
    assert sorted(taken) == list(range(per * publishers))
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

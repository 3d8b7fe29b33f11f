"""Batches: ``delivery.deliver_batch`` over real PostgreSQL, Redis, worker, beat and the stub
provider over HTTP; ``deliver_many``'s fences in process; how the relay splits a backlog into
tasks; the lease keeper holding every message of a batch.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.worker import state
from sqlalchemy import Engine, event, insert, select, update
from sqlalchemy.orm import Session

import delivery
import delivery.worker
from delivery.core.models import attempts_table, messages_table, utcnow
from delivery.observability import events
from delivery.relay.claims import Claim
from delivery.runtime.current import get_settings
from delivery.runtime.service import Service
from delivery.sending.sender import deliver_many
from delivery.transitions import Action
from delivery.worker.leases import held_ids
from delivery.worker.publish import batches
from tests.conftest import RUN_DIR, drained
from tests.factories import message_values

OK, DEAD, FLAKY, LOST, LOST_GIVE_UP = (
    "+12015550301",
    "+12015550302",
    "+12015550303",
    "+12015550304",
    "+12015550305",
)


def _claims(n: int, priority: str = "normal") -> list[Claim]:
    return [Claim(i, f"k{i}", priority) for i in range(n)]


def test_a_backlog_is_split_evenly_per_queue_and_a_few_messages_travel_alone() -> None:
    """120 messages at batch size 50 are three tasks of 40; fewer than 50 in a queue, or
    batch size 1, are a task per message; each queue is split on its own."""
    assert [len(c) for c in batches(_claims(120), 50)] == [40, 40, 40]
    assert [len(c) for c in batches(_claims(50), 50)] == [50]
    assert [len(c) for c in batches(_claims(49), 50)] == [1] * 49
    assert [len(c) for c in batches(_claims(1), 50)] == [1]
    assert [len(c) for c in batches(_claims(3), 1)] == [1, 1, 1]
    mixed = [*_claims(60), Claim(99, "u", "urgent")]
    split = batches(mixed, 50)
    assert sorted(len(c) for c in split) == [1, 30, 30]
    assert [c[0].key for c in split if len(c) == 1] == ["u"]
    assert sorted(c.id for chunk in batches(_claims(101), 50) for c in chunk) == list(range(101))


class _Request:
    """What the keeper reads of a Celery request: its task name and arguments."""

    def __init__(self, name: str, args: tuple[Any, ...]) -> None:
        self.name, self.args = name, args


@pytest.fixture
def held() -> Iterator[list[Any]]:
    """Requests put into the worker's state as if it had reserved them (removed after)."""
    added: list[Any] = []
    yield added
    for request in added:
        state.reserved_requests.discard(request)


def test_the_lease_keeper_holds_every_message_of_a_batch(held: list[Any]) -> None:
    """A reserved ``delivery.deliver_batch`` request holds all the ids it carries, next to a
    single ``delivery.deliver``; other tasks hold nothing."""
    requests = [
        _Request("delivery.deliver_batch", ([[11, "a"], [12, "b"]],)),
        _Request("delivery.deliver", (13, "c")),
        _Request("other", ([[14, "d"]],)),
    ]
    for request in requests:
        state.reserved_requests.add(request)
        held.append(request)
    assert {11, 12, 13} <= held_ids()
    assert 14 not in held_ids()


def _dispatched(engine: Engine, specs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    now = utcnow()
    rows = [
        message_values(
            spec.pop("key"),
            "dispatched",
            lease_expires_at=now + dt.timedelta(hours=1),
            next_attempt_at=now - dt.timedelta(seconds=1),
            **spec,
        )
        for spec in specs
    ]
    with engine.begin() as conn:
        found = conn.execute(
            insert(messages_table).returning(messages_table.c.id, messages_table.c.key), rows
        ).all()
    return [(row.id, row.key) for row in found]


@pytest.mark.integration
def test_deliver_many_takes_only_rows_still_where_it_saw_them(clean: Engine, stub: Any) -> None:
    """In one batch: ready rows are sent with one attempt row each; a row that is not
    dispatched, a wrong key and a repeated pair are skipped; nothing else is sent."""
    stub.reset()
    pairs = _dispatched(
        clean,
        [
            {"key": "many-0", "recipient": OK},
            {"key": "many-1", "recipient": OK},
            {"key": "many-settled", "recipient": OK},
        ],
    )
    with clean.begin() as conn:  # another worker got there first
        conn.execute(
            update(messages_table)
            .where(messages_table.c.key == "many-settled")
            .values(status="sent", attempts=1)
        )
    service = Service.from_settings(get_settings())
    try:
        asked = [*pairs, (pairs[0][0], "not-its-key"), pairs[1]]
        seen: dict[int, int] = {}
        results = deliver_many(service, asked, on_read=seen.update)
    finally:
        service.close()
    assert [r.action for r in results] == [
        Action.DONE,
        Action.DONE,
        Action.SKIP,
        Action.SKIP,
        Action.SKIP,
    ]
    assert seen == {pairs[0][0]: 0, pairs[1][0]: 0, pairs[2][0]: 1}
    assert stub.effects() == {"many-0": 1, "many-1": 1}
    with clean.connect() as conn:
        statuses = dict(conn.execute(select(messages_table.c.key, messages_table.c.status)).all())
        attempts = conn.execute(select(attempts_table.c.message_id)).scalars().all()
    assert statuses == {"many-0": "sent", "many-1": "sent", "many-settled": "sent"}
    assert sorted(attempts) == sorted([pairs[0][0], pairs[1][0]])


@pytest.mark.integration
def test_a_row_taken_ahead_is_given_back_when_its_call_could_outlast_its_lease(
    clean: Engine, stub: Any
) -> None:
    """A batch takes all its rows with its first wave (one UPDATE), and each row asks the
    breaker when a send slot frees up for it. A row taken ahead whose call could no longer end
    within its lease (here: one send at a time, each answered in 2.5 s; the lease keeper
    renews a row up to ``send_lease`` after its take, and the provider's whole timeout must
    fit after the call starts: here 4 s after the take at most) is given back, not sent:
    ``pending`` due at once, ``SEND_LATE``, its attempt given back (``max_attempts`` + 1),
    instead of racing the sweeper, which hands a ``sending`` row past its lease to another
    worker."""
    stub.set_faults(delay_ms=2500)
    pairs = _dispatched(clean, [{"key": f"late-{i}", "recipient": OK} for i in range(3)])
    total = get_settings().providers["stub"].timeouts.total  # the suite's: 6 s
    # No lease keeper here: hold_lease outlasts the batch, so that no sweeper takes a row.
    hold = 10.0
    settings = get_settings().with_(
        send_concurrency=1, send_lease=total + hold / 3 + 4.0, hold_lease=hold
    )
    service = Service.from_settings(settings)
    moves: dict[tuple[int, str], float] = {}

    def seen(t: events.Transition) -> None:
        moves[(t.message_id, t.to_status)] = time.monotonic()

    events.add_hook(seen)
    try:
        results = deliver_many(service, pairs)
    finally:
        events.remove_hook(seen)
        service.close()
    assert [(r.action, r.status, r.code) for r in results] == [
        (Action.DONE, "sent", None),
        (Action.DONE, "sent", None),
        (Action.PARKED, "pending", "SEND_LATE"),
    ]
    assert stub.effects() == {"late-0": 1, "late-1": 1}
    taken = [moves[(message_id, "sending")] for message_id, _ in pairs]
    assert max(taken) - min(taken) < 0.5, taken  # one take for the batch
    assert moves[(pairs[2][0], "pending")] - taken[2] >= 4.5  # given back when its turn came
    with clean.connect() as conn:
        rows = conn.execute(
            select(
                messages_table.c.key,
                messages_table.c.status,
                messages_table.c.attempts,
                messages_table.c.max_attempts,
                messages_table.c.last_error_code,
                messages_table.c.lease_expires_at,
            ).order_by(messages_table.c.id)
        ).all()
        logged = conn.execute(select(attempts_table.c.message_id)).scalars().all()
    budget = rows[0].max_attempts
    assert [tuple(row) for row in rows] == [
        ("late-0", "sent", 1, budget, None, None),
        ("late-1", "sent", 1, budget, None, None),
        ("late-2", "pending", 1, budget + 1, "SEND_LATE", None),
    ]
    assert sorted(logged) == sorted([pairs[0][0], pairs[1][0]])  # no call, no attempt row


@pytest.mark.integration
def test_batches_side_by_side_take_their_rows_once_and_send_in_waves(
    clean: Engine, stub: Any
) -> None:
    """Four batches at once in one process (a threads pool) share its 8 send slots: each
    takes all its rows in one UPDATE, and asks the breaker in waves of at least half the
    slots, taken together; only a batch's last rows may go in a smaller wave, so no batch
    holds a few idle slots and sends in waves of one or two. Every message is sent once."""
    stub.set_faults(delay_ms=30)
    pairs = _dispatched(clean, [{"key": f"side-{i}", "recipient": OK} for i in range(48)])
    service = Service.from_settings(get_settings().with_(send_concurrency=8))
    takes: list[int] = []
    waves: list[int] = []
    breaker = service.breaker("stub")
    allow_many = breaker.allow_many

    def counted(n: int) -> Any:
        waves.append(n)
        return allow_many(n)

    breaker.allow_many = counted  # type: ignore[method-assign]

    @event.listens_for(service.engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if isinstance(parameters, dict) and "b_lease" in parameters:  # the take
            takes.append(len(parameters["ids"]))

    start = threading.Barrier(4)
    answers: list[list[Any]] = [[] for _ in range(4)]

    def batch(n: int) -> None:
        start.wait()
        answers[n] = deliver_many(service, pairs[n * 12 : (n + 1) * 12])

    threads = [threading.Thread(target=batch, args=(n,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        service.close()
    assert [r.action for rs in answers for r in rs] == [Action.DONE] * 48
    assert stub.effects() == {key: 1 for _, key in pairs}
    assert takes == [12] * 4
    assert sum(waves) == 48
    assert len([n for n in waves if n < 4]) <= 4, waves  # one per batch at most


@pytest.mark.integration
def test_a_half_open_breaker_lets_one_send_of_a_batch_probe(
    clean: Engine, stub: Any, redis_client: Any
) -> None:
    """The breaker is asked for the sends that can start at once (here all five): in
    half-open one send of the batch is the probe and is made; the others are parked
    ``pending`` with ``CIRCUIT_OPEN`` and no attempt spent, as a message alone is parked (the
    probe is slow to answer: were another asked later, it would be turned away too)."""
    stub.set_faults(delay_ms=500)
    pairs = _dispatched(clean, [{"key": f"probe-{i}", "recipient": OK} for i in range(5)])
    service = Service.from_settings(get_settings())
    breaker = service.breaker("stub")
    before = breaker.status().calls
    # open, with its reset_timeout already past: the next caller finds it half-open
    redis_client.hset("delivery:breaker:{stub}", mapping={"state": "open", "open_until": 0})
    try:
        results = deliver_many(service, pairs)
        after = breaker.status()
    finally:
        service.close()
    assert sorted(r.action for r in results) == sorted([Action.DONE] + [Action.PARKED] * 4)
    assert {r.code for r in results if r.action is Action.PARKED} == {"CIRCUIT_OPEN"}
    (probe,) = [key for (_, key), r in zip(pairs, results, strict=True) if r.action is Action.DONE]
    assert stub.effects() == {probe: 1}
    assert (after.state, after.calls) == ("half_open", before)  # probes are not counted
    with clean.connect() as conn:
        rows = conn.execute(
            select(messages_table.c.key, messages_table.c.status, messages_table.c.attempts)
        ).all()
    assert sorted(rows) == sorted(
        [(probe, "sent", 1)] + [(key, "pending", 0) for _, key in pairs if key != probe]
    )


@pytest.mark.integration
def test_one_batch_with_every_outcome_ends_each_message_as_the_single_path_would(
    live: Engine, stub: Any
) -> None:
    """One commit of 64 messages goes out as batches; in them: sent, a 400 that ends dead, a
    503 retried until its attempts are spent, a lost answer retried with the same key (sent,
    one effect) and a lost answer whose policy gives up (unknown)."""
    stub.set_faults(
        rules={
            DEAD: {"status": 400, "json": {"code": 21211, "message": "Invalid To"}},
            FLAKY: {"status": 503, "body": "busy"},
            LOST: {"status": 201, "json": {"id": "msg_lost"}, "drop": True},
            LOST_GIVE_UP: {"status": 201, "json": {"id": "msg_gone"}, "drop": True},
        }
    )
    with Session(live) as session, session.begin():
        for i in range(60):
            delivery.enqueue(session, channel="sms", to=OK, payload={"body": "x"}, key=f"mix-{i}")
        delivery.enqueue(session, channel="sms", to=DEAD, payload={"body": "x"}, key="mix-dead")
        delivery.enqueue(
            session, channel="sms", to=FLAKY, payload={"body": "x"}, key="mix-503", max_attempts=3
        )
        delivery.enqueue(session, channel="sms", to=LOST, payload={"body": "x"}, key="mix-lost")
        delivery.enqueue(
            session,
            channel="sms",
            to=LOST_GIVE_UP,
            payload={"body": "x"},
            key="mix-gone",
            on_unknown="give_up",
        )
    assert drained(live, 64, timeout=90) == {"sent": 61, "dead": 2, "unknown": 1}
    with live.connect() as conn:
        rows = conn.execute(
            select(
                messages_table.c.key,
                messages_table.c.status,
                messages_table.c.attempts,
                messages_table.c.max_attempts - messages_table.c.attempts,
                messages_table.c.last_error_code,
            )
        ).all()
    by_key = {row.key: row for row in rows}
    assert by_key["mix-dead"].status == "dead" and by_key["mix-dead"].last_error_code == "21211"
    assert (by_key["mix-503"].status, by_key["mix-503"].attempts) == ("dead", 3)
    assert (by_key["mix-lost"].status, by_key["mix-lost"].attempts) == ("sent", 2)
    assert by_key["mix-gone"].status == "unknown"
    effects = stub.effects()
    assert all(effects[f"mix-{i}"] == 1 for i in range(60))
    assert effects["mix-lost"] == 1 and effects["mix-gone"] == 1
    assert "mix-dead" not in effects and "mix-503" not in effects
    log = (RUN_DIR / "worker.log").read_text(errors="replace")
    assert "delivery.deliver_batch" in log, "the commit did not go out as a batch"
    assert OK not in log and "+1201555030" not in log  # no recipient in the worker's log (G6)

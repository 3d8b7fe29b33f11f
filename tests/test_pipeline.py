"""End to end over real processes: PostgreSQL, Redis, celery worker and beat, the stub over HTTP."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import delivery
import delivery.worker
from delivery.core.models import Attempt, Message
from delivery.relay.claims import Claim
from tests.conftest import counts, drained

pytestmark = pytest.mark.integration


def enqueue_many(engine: Engine, n: int, prefix: str, **kwargs: object) -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    with Session(engine) as session, session.begin():
        for i, key in enumerate(keys):
            delivery.enqueue(
                session,
                channel="sms",
                to=f"+1201555{i % 10000:04d}",
                payload={"body": f"code {i}"},
                key=key,
                **kwargs,
            )  # type: ignore[arg-type]
    return keys


def test_rollback_sends_nothing_and_commit_sends_once(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """A rolled-back enqueue leaves no row and no effect; a committed one has exactly one."""
    with Session(live) as session:
        delivery.enqueue(
            session, channel="sms", to="+12015550100", payload={"body": "x"}, key="rolled-back"
        )
        session.rollback()
    with Session(live) as session, session.begin():
        delivery.enqueue(
            session, channel="sms", to="+12015550101", payload={"body": "y"}, key="committed"
        )
    drained(live, 1, timeout=30)
    with Session(live) as session:
        assert session.scalars(select(Message.key)).all() == ["committed"]
    assert stub.effects() == {"committed": 1}


def test_lost_responses_still_one_effect_per_key(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """With 30% of responses dropped after accept, 200 messages all end sent, once each."""
    stub.set_faults(drop_rate=0.3, seed=7)
    keys = enqueue_many(live, 200, "lost")
    assert drained(live, 200) == {"sent": 200}
    effects = stub.effects()
    assert set(effects) == set(keys)
    assert all(n == 1 for n in effects.values()), {k: n for k, n in effects.items() if n != 1}
    dropped = [r for r in stub.requests() if r["outcome"] == "dropped"]
    assert dropped, "the fault was never injected"


def test_permanent_error_is_dead_after_one_attempt(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """A 400 with code 21211 ends dead after exactly one attempt, with the code recorded."""
    stub.set_faults(
        rules={"+12015550199": {"status": 400, "json": {"code": 21211, "message": "Invalid To"}}}
    )
    with Session(live) as session, session.begin():
        delivery.enqueue(
            session, channel="sms", to="+12015550199", payload={"body": "x"}, key="bad-number"
        )
    assert drained(live, 1, timeout=30) == {"dead": 1}
    with Session(live) as session:
        message = session.scalars(select(Message)).one()
        assert (message.attempts, message.last_error_code) == (1, "21211")
        attempts = session.scalars(select(Attempt)).all()
        assert [(a.outcome, a.http_status, a.error_code) for a in attempts] == [
            ("permanent", 400, "21211")
        ]


def test_503_html_is_retried(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """Two 503s with an HTML body are retried and the third attempt is sent."""
    stub.set_faults(fail_first=2, error_status=503, error_html=True)
    enqueue_many(live, 5, "html503", provider="unguarded")  # 10 failures in a row, no breaker
    assert drained(live, 5, timeout=30) == {"sent": 5}
    with Session(live) as session:
        assert set(session.scalars(select(Message.attempts))) == {3}
        outcomes = session.execute(select(Attempt.outcome, Attempt.http_status)).all()
    assert sorted(set(outcomes)) == [("delivered", 201), ("retryable", 503)]


def test_429_retry_after_is_honoured(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """After a 429 with Retry-After: 1, no request for that key comes sooner than 1 s later."""
    stub.set_faults(fail_first=2, error_status=429, retry_after=1)
    keys = enqueue_many(live, 10, "ra429", provider="unguarded")  # 20 429s first, no breaker
    assert drained(live, 10, timeout=40) == {"sent": 10}
    by_key: dict[str, list[float]] = defaultdict(list)
    for request in stub.requests():
        by_key[request["key"]].append(request["at"])
    for key in keys:
        times = sorted(by_key[key])
        assert len(times) == 3, (key, times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 1.0, (key, gaps)


def test_lookup_policy_gives_one_effect_without_dedupe(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """A provider that ignores keys, 30% lost responses, policy lookup: one effect per key."""
    stub.set_faults(dedupe=False, drop_rate=0.3, seed=11)
    keys = enqueue_many(live, 200, "lookup", on_unknown="lookup")
    assert drained(live, 200) == {"sent": 200}
    effects = stub.effects()
    assert set(effects) == set(keys)
    assert all(n == 1 for n in effects.values())
    with Session(live) as session:
        lookups = session.scalar(
            select(text("count(*)")).select_from(Attempt).where(Attempt.kind == "lookup")
        )
    assert lookups, "no lookup was made: the fault never hit"


def test_give_up_policy_parks_unknown_with_at_most_one_effect(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """Without dedupe and with policy give_up, lost responses end unknown, never resent."""
    stub.set_faults(dedupe=False, drop_rate=0.3, seed=5)
    keys = enqueue_many(live, 100, "giveup", on_unknown="give_up")
    final = drained(live, 100)
    assert set(final) <= {"sent", "unknown"} and final.get("unknown", 0) > 0, final
    effects = stub.effects()
    assert {effects.get(k, 0) for k in keys} == {1}  # lost answers took effect, never twice


def test_task_for_a_finished_message_does_nothing(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """A duplicate deliver task for a sent message is a no-op: no second request."""
    from delivery.runtime.service import Service
    from delivery.sending.sender import deliver

    with Session(live) as session, session.begin():
        message = delivery.enqueue(
            session, channel="sms", to="+12015550150", payload={"body": "x"}, key="dup-task"
        )
        message_id = message.id
    drained(live, 1, timeout=30)
    service = Service.from_settings(delivery.get_settings())
    try:
        result = deliver(service, message_id, "dup-task")
        assert (result.action, result.status) == ("skip", "sent")
        assert deliver(service, message_id, "wrong-key").action == "skip"
    finally:
        service.close()
    assert len(stub.requests()) == 1
    assert counts(live) == {"sent": 1}


def test_commit_nudge_publishes_at_once(live: Engine, stub, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Right after commit the nudge has claimed the new rows: no wait for the beat tick."""
    from delivery.outbox import enqueue as outbox

    seen: list[list[int]] = []
    real = outbox._nudge
    assert real is not None, "importing tasks must install the nudge"

    def observed(claims: Sequence[Claim]) -> object:
        seen.append([claim.id for claim in claims])
        return real(claims)

    monkeypatch.setattr(outbox, "_nudge", observed)
    with Session(live) as session, session.begin():
        ids = [
            delivery.enqueue(
                session,
                channel="sms",
                to=f"+120155501{i:02d}",
                payload={"body": "x"},
                key=f"nudge-{i}",
            ).id
            for i in range(3)
        ]
    assert seen == [ids]
    with live.connect() as conn:
        # FOR SHARE waits for a beat relay pass that locked a row first (the nudge skips a
        # locked row: that pass is dispatching it), so a pass in flight reads as what it does.
        statuses = set(conn.scalars(text("SELECT status FROM delivery_messages FOR SHARE")))
    assert "pending" not in statuses
    assert drained(live, 3, timeout=30) == {"sent": 3}


def test_lost_retries_are_recovered_from_the_outbox(live: Engine, stub) -> None:  # type: ignore[no-untyped-def]
    """Flushing the broker while retries wait in it loses nothing: leases bring them back."""
    from tests.conftest import flush_broker, wait_until

    stub.set_faults(fail_first=1, error_status=503)
    keys = enqueue_many(live, 50, "flushed", provider="unguarded")  # 50 503s first, no breaker
    wait_until(lambda: len(stub.requests()) >= 50, timeout=30, every=0.02)
    flush_broker()
    assert drained(live, 50, timeout=60) == {"sent": 50}
    assert set(stub.effects()) == set(keys) and set(stub.effects().values()) == {1}

"""Issue 29: a PostgreSQL outbox partitioned by day (``delivery.runtime.partitions``).

Each test has a database of its own on the suite's server: converting a filled outbox while
enqueues go on (``delivery db partition``), ``delivery prune`` dropping whole days and keeping
a day that holds a message it must not delete, and two processes enqueueing one key across a
partition boundary. The state machine (``test_state_machine``) runs on a partitioned outbox
whose ids cross a boundary every few messages.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import delivery
from delivery import ops
from delivery.errors import IdempotencyConflict
from delivery.runtime import conversion, partitions
from delivery.runtime.db import upgrade
from delivery.testing.fill import fill_outbox
from tests.conftest import OWN_BROKER_URL, own_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[1]
SMS = dict(channel="sms", to="+12015550123", payload={"body": "code 1"})


@pytest.fixture
def own(pg_engine: Engine) -> Iterator[tuple[Engine, dict[str, str]]]:
    """A database of this test's own, migrated but not partitioned, and the environment of a
    ``delivery`` command on it."""
    with own_database("parts") as engine:
        upgrade(engine, partition=False)
        env = {
            **os.environ,
            "DELIVERY_DATABASE_URL": engine.url.render_as_string(hide_password=False),
            "DELIVERY_BROKER_URL": OWN_BROKER_URL,
        }
        env.pop("DELIVERY_CONFIG", None)
        yield engine, env


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "delivery.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def scalar(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.scalar(text(sql), params)


def rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), {"k": "one-key"})]


def wait_for_a_lock_wait(engine: Engine, who: str) -> None:
    """Return once a session of ``engine``'s database waits for a lock (``who``, for the
    failure's message)."""
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    )
    deadline = time.monotonic() + 30
    while not scalar(engine, waiting):
        assert time.monotonic() < deadline, f"{who} never waited"
        time.sleep(0.05)


def add_attempts(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO delivery_attempts (message_id, number, kind, provider, started_at, "
                "outcome) SELECT id, 1, 'send', provider, created_at, 'delivered' "
                "FROM delivery_messages"
            )
        )
        conn.execute(
            text(
                "INSERT INTO delivery_receipts (message_id, provider, event, status, "
                "received_at, effect) SELECT id, provider, 'ev-' || id, 'delivered', "
                "created_at, 'moved' FROM delivery_messages WHERE id % 10 = 0"
            )
        )


def test_db_partition_converts_a_filled_outbox_while_enqueues_go_on(
    own: tuple[Engine, dict[str, str]],
) -> None:
    """``delivery db partition`` on an outbox of 20,000 messages (with attempts and receipts)
    while a thread enqueues and commits without pause: no enqueue fails or waits more than
    two seconds, the swap holds the tables well under a second, every row is still there, and
    each key keeps its guarantee (same payload: the message; other payload: a conflict)."""
    engine, env = own
    with engine.begin() as conn:
        fill_outbox(conn, 20_000, dt.timedelta(seconds=30))
    add_attempts(engine)
    stop, waits, errors = threading.Event(), [], []

    def enqueue_on() -> None:
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                with Session(engine) as session, session.begin():
                    delivery.enqueue(session, key=f"live-{n}", **SMS)  # type: ignore[arg-type]
            except Exception as exc:  # pragma: no cover - the assertion shows it
                errors.append(repr(exc))
            waits.append(time.monotonic() - started)
            n += 1

    thread = threading.Thread(target=enqueue_on)
    thread.start()
    try:
        time.sleep(0.3)
        out = cli(env, "db", "partition")
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert max(waits) < 2.0, max(waits)
    held = int(out.rsplit("held the outbox for ", 1)[1].split(" ms")[0])
    assert held < 1000, out
    live = len(waits)
    with engine.connect() as conn:
        assert partitions.is_partitioned(conn)
        days = partitions.listing(conn)
    assert days[0].suffix == "p0" and len(days) == 1 + partitions.AHEAD, days
    assert scalar(engine, "SELECT count(*) FROM delivery_messages") == 20_000 + live
    assert scalar(engine, "SELECT count(*) FROM delivery_keys") == 20_000 + live
    assert scalar(engine, "SELECT count(*) FROM delivery_attempts") == 20_000
    assert scalar(engine, "SELECT count(*) FROM delivery_receipts") == 2_000
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = delivery.enqueue(session, key="live-0", **SMS)  # type: ignore[arg-type]
        last = delivery.enqueue(session, key=f"live-{live - 1}", **SMS)  # type: ignore[arg-type]
        with pytest.raises(IdempotencyConflict, match="live-0"):
            delivery.enqueue(session, key="live-0", **dict(SMS, payload={"body": "other"}))  # type: ignore[arg-type]
        new = delivery.enqueue(session, key="after-the-swap", **SMS)  # type: ignore[arg-type]
    assert first.id < last.id < new.id
    assert new.id >> 32 == partitions.day_of(dt.datetime.now(dt.UTC))
    assert scalar(engine, "SELECT count(*) FROM delivery_messages") == 20_000 + live + 1
    assert "already partitioned" in cli(env, "db", "partition")


def test_a_busy_swap_tries_again_and_a_failed_conversion_runs_again(
    own: tuple[Engine, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction holding the outbox when the swap asks for it: with one try the conversion
    fails (lock wait over 500 ms) and leaves the outbox as it was; run again, its swap tries
    again each second until that transaction ends, then converts, every row and key there."""
    engine, _ = own
    with engine.begin() as conn:
        fill_outbox(conn, 1_000, dt.timedelta(seconds=1))
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn:
            conn.execute(text("UPDATE delivery_messages SET last_error = NULL WHERE id = 1"))
            holding.set()
            release.wait(60)
            conn.commit()

    def say(step: str) -> None:
        if step.startswith("swap") and not holding.is_set():
            threading.Thread(target=hold, daemon=True).start()
            assert holding.wait(30)
        if "stayed busy" in step:
            release.set()

    monkeypatch.setattr(conversion, "_SWAP_TRIES", 1)
    with pytest.raises(OperationalError):
        conversion.partition(engine, say=say)
    release.set()
    with engine.connect() as conn:
        assert not partitions.is_partitioned(conn)
    holding.clear()
    release.clear()
    monkeypatch.setattr(conversion, "_SWAP_TRIES", 20)
    said: list[str] = []
    done = conversion.partition(engine, say=lambda step: (said.append(step), say(step)))
    assert any("stayed busy" in step for step in said) and done.pause_s < 1
    with engine.connect() as conn:
        assert partitions.is_partitioned(conn)
    assert scalar(engine, "SELECT count(*) FROM delivery_keys") == 1_000
    assert scalar(engine, "SELECT count(*) FROM delivery_messages") == 1_000


def test_prune_drops_whole_days_and_keeps_a_day_holding_a_message_it_must_not_delete(
    own: tuple[Engine, dict[str, str]],
) -> None:
    """An outbox partitioned since 20 days ago, 20,000 messages over those days: ``delivery
    prune --older-than 10d`` drops each day before the cutoff's midnight as a whole (its
    tables gone, its keys free again, deleted by beat's pass after), keeps the day holding a
    pending message and the day holding a message changed since the cutoff (named in its
    report) and deletes their other final messages one by one: exactly what ``prune``
    deletes on any outbox."""
    engine, env = own
    today = dt.datetime.now(dt.UTC).date()
    conversion.partition(engine, start=today - dt.timedelta(days=21))
    with engine.begin() as conn:
        fill_outbox(conn, 20_000, dt.timedelta(days=20) / 20_000)
        conn.execute(
            text(
                "UPDATE delivery_messages SET status = 'sent' "
                "WHERE status = 'pending' AND created_at < now() - interval '2 days'"
            )
        )
    add_attempts(engine)
    held = {15: "pending", 14: "changed"}
    with engine.begin() as conn:
        for ago, how in held.items():
            day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=ago)).date()
            status, changed = ("pending", "created_at") if how == "pending" else ("sent", "now()")
            conn.execute(
                text(
                    f"UPDATE delivery_messages SET status = '{status}', updated_at = {changed} "
                    "WHERE id = (SELECT min(id) FROM delivery_messages "
                    "WHERE id >= :low AND status = 'sent')"
                ),
                {"low": partitions.day_of(day) << 32},
            )
    cutoff = dt.datetime.combine(today - dt.timedelta(days=10), dt.time(), dt.UTC)
    finals = "('sent', 'dead', 'unknown')"
    expected = scalar(
        engine,
        f"SELECT count(*) FROM delivery_messages WHERE status IN {finals} AND updated_at < :c",
        c=cutoff,
    )
    kept_days = {
        f"p{(today - dt.timedelta(days=ago)):%Y%m%d}": {how: 1} for ago, how in held.items()
    }
    with engine.connect() as conn:
        before = partitions.listing(conn)
    space = (
        "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
        "WHERE c.relkind = 'r' AND c.relname ~ '^delivery_(messages|attempts|receipts)_p'"
    )
    total_before = scalar(engine, space)
    dry = json.loads(cli(env, "prune", "--older-than", "10d", "--dry-run", "--json"))
    assert dry["messages"] == expected and dry["days_kept"] == kept_days
    report = json.loads(cli(env, "prune", "--older-than", "10d", "--json"))
    assert report["cutoff"] == cutoff.isoformat()
    assert report["messages"] == expected and report["days_kept"] == kept_days
    gone = [day for day in before if day.ends <= cutoff and day.suffix not in kept_days]
    assert sorted(report["days_dropped"]) == sorted(day.suffix for day in gone)
    assert len(gone) >= 8
    keys_of = "SELECT count(*) FROM delivery_keys WHERE message_id >= :lo AND message_id < :hi"
    for day in gone:
        for table, _ in partitions.TABLES:
            assert scalar(engine, "SELECT to_regclass(:t)", t=f"{table}_{day.suffix}") is None
    # The dropped days' keys are left to beat (partitions.free_keys), free all the same.
    dangling = sum(scalar(engine, keys_of, lo=d.low or 0, hi=d.high) for d in gone)  # type: ignore[misc]
    assert dangling > 0
    assert scalar(engine, space) < total_before / 1.5  # type: ignore[operator]
    left = scalar(
        engine,
        f"SELECT count(*) FROM delivery_messages WHERE updated_at < :c AND status IN {finals}",
        c=cutoff,
    )
    assert left == 0
    open_before = "SELECT count(*) FROM delivery_messages WHERE status = 'pending' AND id < :c"
    assert scalar(engine, open_before, c=partitions.day_of(cutoff) << 32) == 1
    # A dropped message's key, and a key of one deleted from a kept day, are free again.
    stale = scalar(
        engine,
        "SELECT k.key FROM delivery_keys k WHERE NOT EXISTS "
        "(SELECT 1 FROM delivery_messages m WHERE m.id = k.message_id) LIMIT 1",
    )
    assert isinstance(stale, str)
    old_keys = ["order-1:receipt", "order-2:receipt", stale]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        again = [delivery.enqueue(session, key=key, **SMS) for key in old_keys]  # type: ignore[arg-type]
    assert all(m.id >> 32 == partitions.day_of(dt.datetime.now(dt.UTC)) for m in again)
    # Beat's pass frees the rest, a batch at a time; every message keeps its key.
    assert 0 < partitions.free_keys(engine, batch=1000) <= dangling
    assert all(scalar(engine, keys_of, lo=d.low or 0, hi=d.high) == 0 for d in gone)
    keyless = (
        "SELECT count(*) FROM delivery_messages m WHERE NOT EXISTS "
        "(SELECT 1 FROM delivery_keys k WHERE k.key = m.key AND k.message_id = m.id)"
    )
    assert scalar(engine, keyless) == 0
    assert partitions.free_keys(engine) == 0


def test_a_day_whose_rows_are_being_changed_is_kept_until_the_next_prune(
    own: tuple[Engine, dict[str, str]],
) -> None:
    """A transaction changing a row of an old day holds it: ``prune`` waits half a second for
    that day, keeps it (``busy``), drops the others; once the transaction ends, the next
    ``prune`` drops it."""
    engine, env = own
    today = dt.datetime.now(dt.UTC).date()
    conversion.partition(engine, start=today - dt.timedelta(days=6))
    with engine.begin() as conn:
        fill_outbox(conn, 600, dt.timedelta(days=5) / 600)
        conn.execute(text("UPDATE delivery_messages SET status = 'sent'"))
        conn.execute(text("UPDATE delivery_messages SET updated_at = created_at"))
    busy = f"p{today - dt.timedelta(days=4):%Y%m%d}"
    with engine.connect() as holder:
        holder.execute(
            text(
                f"UPDATE delivery_messages_{busy} SET last_error = NULL WHERE id = "
                f"(SELECT min(id) FROM delivery_messages_{busy})"
            )
        )
        first = json.loads(cli(env, "prune", "--older-than", "2d", "--json"))
        holder.rollback()
    assert first["days_kept"] == {busy: {"busy": 1}}
    assert busy not in first["days_dropped"] and len(first["days_dropped"]) >= 3
    second = json.loads(cli(env, "prune", "--older-than", "2d", "--json"))
    assert second["days_dropped"] == [busy] and second["days_kept"] == {}


def test_show_redrive_search_and_counts_read_across_days(
    own: tuple[Engine, dict[str, str]],
) -> None:
    """On an outbox of six days, what ops use reads every day: ``delivery show`` by id and by
    key, ``redrive`` of a dead message five days old, ``dead`` and ``stats``, and the
    console's search by key prefix and by time, page after page (keyset on the id)."""
    engine, env = own
    today = dt.datetime.now(dt.UTC).date()
    conversion.partition(engine, start=today - dt.timedelta(days=6))
    with engine.begin() as conn:
        fill_outbox(conn, 6_000, dt.timedelta(days=5) / 6_000)
    with engine.connect() as conn:
        oldest = conn.execute(
            text("SELECT id, key FROM delivery_messages WHERE status = 'dead' ORDER BY id LIMIT 1")
        ).one()
        dead = conn.scalar(text("SELECT count(*) FROM delivery_messages WHERE status = 'dead'"))
        days = {row[0] for row in conn.execute(text("SELECT id >> 32 FROM delivery_messages"))}
    assert len(days) >= 5
    by_id = json.loads(cli(env, "show", str(oldest.id), "--json"))
    by_key = json.loads(cli(env, "show", oldest.key, "--json"))
    assert by_id["id"] == by_key["id"] == oldest.id and by_id["status"] == "dead"
    assert len(json.loads(cli(env, "dead", "--json", "--limit", "1000"))) == dead
    assert sum(json.loads(cli(env, "stats", "--json")).values()) == 6_000
    assert "redriven" in cli(env, "redrive", str(oldest.id), "--json")
    status = "SELECT status FROM delivery_messages WHERE id = :i"
    assert scalar(engine, status, i=oldest.id) == "pending"
    with Session(engine) as session:
        for params in ({"key": "order-1*"}, {"since": (today - dt.timedelta(days=3)).isoformat()}):
            seen, before = [], None
            while True:
                page = ops.search(session, ops.parse_filter(params), before=before, limit=200)
                seen += [m.id for m in page.messages]
                if page.next_before is None:
                    break
                before = page.next_before
            assert seen == sorted(seen, reverse=True) and len({i >> 32 for i in seen}) >= 3
            if "key" in params:
                expected = "SELECT count(*) FROM delivery_messages WHERE key LIKE 'order-1%'"
            else:
                expected = "SELECT count(*) FROM delivery_messages WHERE created_at >= :s"
            assert len(seen) == scalar(engine, expected, s=params.get("since"))


_ENQUEUER = """
import sys
from sqlalchemy.orm import Session
import delivery
from delivery import ops
from delivery.errors import IdempotencyConflict
from delivery.runtime.db import make_engine
engine = make_engine(sys.argv[1])
key, body, then = sys.argv[2], sys.argv[3], sys.argv[4]
with Session(engine) as session:
    try:
        message = delivery.enqueue(
            session, key=key, channel="sms", to="+12015550123", payload={"body": body}
        )
    except IdempotencyConflict:
        print("conflict", flush=True)
        sys.exit(0)
    print(message.id, flush=True)
    if then == "wait":
        then = sys.stdin.readline().strip()
    session.commit() if then == "commit" else session.rollback()
print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("body", "first_ends", "second_gets"),
    [("code 1", "commit", "first"), ("other", "commit", "conflict"), ("code 1", "rollback", "own")],
)
def test_two_processes_enqueue_one_key_across_a_partition_boundary(
    own: tuple[Engine, dict[str, str]], body: str, first_ends: str, second_gets: str
) -> None:
    """Today's partition is split in two at the next id: the first process's message lands in
    the one, the second's would land in the other, where no index of a partition could see
    the first. The second waits on the keys table until the first ends; then it gets the
    first's message (same payload), ``IdempotencyConflict`` (other payload), or, the first
    rolled back, a message of its own in the second partition."""
    engine, env = own
    today = partitions.day_of(dt.datetime.now(dt.UTC))
    conversion.partition(engine, start=dt.datetime.now(dt.UTC).date())
    boundary = (today << 32) | 1000
    with engine.begin() as conn:
        for table, _ in partitions.TABLES:
            name = f"{table}_p{dt.datetime.now(dt.UTC):%Y%m%d}"
            conn.execute(text(f"DROP TABLE {name}"))
            halves = (("a", today << 32, boundary), ("b", boundary, (today + 1) << 32))
            for suffix, low, high in halves:
                conn.execute(
                    text(
                        f"CREATE TABLE {name}{suffix} PARTITION OF {table} "
                        f"FOR VALUES FROM ({low}) TO ({high})"
                    )
                )
        sequence = conn.scalar(text("SELECT pg_get_serial_sequence('delivery_messages', 'id')"))
        conn.execute(text("SELECT setval(:s, 998)"), {"s": sequence})
    url = env["DELIVERY_DATABASE_URL"]

    def start(then: str, text_body: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _ENQUEUER, url, "one-key", text_body, then],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    first = start("wait", "code 1")
    try:
        assert first.stdout is not None and first.stdin is not None
        first_id = int(first.stdout.readline())
        assert first_id < boundary
        second = start("commit", body)
        try:
            wait_for_a_lock_wait(engine, "the second enqueue")
            first.stdin.write(first_ends + "\n")
            first.stdin.flush()
            assert first.wait(30) == 0
            answer, _ = second.communicate(timeout=30)
        finally:
            second.kill()
    finally:
        first.kill()
    got = answer.split()[0]
    ids = rows(engine, "SELECT id, tableoid::regclass::text FROM delivery_messages WHERE key = :k")
    if second_gets == "first":
        assert int(got) == first_id and ids == [(first_id, ids[0][1])]
    elif second_gets == "conflict":
        assert got == "conflict" and [row[0] for row in ids] == [first_id]
    else:
        assert int(got) >= boundary and ids == [(int(got), ids[0][1])]
        assert ids[0][1].endswith("b")
    assert scalar(engine, "SELECT count(*) FROM delivery_keys WHERE key = 'one-key'") == 1


def test_an_enqueue_waiting_on_a_key_being_freed_claims_it_again(
    own: tuple[Engine, dict[str, str]],
) -> None:
    """A dropped message's key is being freed (``partitions.free_keys``: a transaction holds
    its row, then deletes it) while an enqueue of that key waits on it: the enqueue claims
    the key again, so its message is the key's, and the next enqueue of the key returns that
    message instead of inserting a second one. ``delivery db upgrade`` gave the outbox that
    trigger."""
    engine, _ = own
    conversion.partition(engine)
    with engine.begin() as conn:  # an outbox partitioned with an older trigger
        conn.execute(
            text(
                "CREATE OR REPLACE FUNCTION delivery_claim_key() RETURNS trigger "
                "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
            )
        )
    upgrade(engine)  # brings it up to date
    with engine.begin() as conn:  # the key of a message that is gone
        conn.execute(text("INSERT INTO delivery_keys (key, message_id) VALUES ('one-key', 1)"))
    got: list[int] = []

    def enqueue() -> None:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            got.append(delivery.enqueue(session, key="one-key", **SMS).id)  # type: ignore[arg-type]

    with engine.connect() as freeing:
        freeing.execute(text("SELECT 1 FROM delivery_keys WHERE key = 'one-key' FOR UPDATE"))
        waiting = threading.Thread(target=enqueue)
        waiting.start()
        wait_for_a_lock_wait(engine, "the enqueue")
        freeing.execute(text("DELETE FROM delivery_keys WHERE key = 'one-key'"))
        freeing.commit()
    waiting.join(30)
    assert len(got) == 1
    assert rows(engine, "SELECT key, message_id FROM delivery_keys WHERE key = :k") == [
        ("one-key", got[0])
    ]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert delivery.enqueue(session, key="one-key", **SMS).id == got[0]  # type: ignore[arg-type]
    assert scalar(engine, "SELECT count(*) FROM delivery_messages") == 1

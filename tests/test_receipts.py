"""Delivery receipts, received: the receipts' moves (``delivery.transitions.receipts``) and the
receiver's answers (``delivery.receipts``), on a migrated SQLite outbox; the signatures are
made by the ``standardwebhooks`` library, as a provider would make them."""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

from delivery.config.loading import settings_from_mapping
from delivery.core.models import AuditEntry, Message, Receipt
from delivery.core.status import Status
from delivery.errors import ConfigError
from delivery.receipts import MAX_BODY, Receiver, make_receiver
from delivery.receipts.standard import StandardReceipts
from delivery.relay.sweeper import sweep
from delivery.runtime.db import make_engine
from delivery.transitions.receipts import (
    RECEIPT_STATUSES,
    Effect,
    ReceiptEvent,
    record,
    record_many,
)
from tests.factories import add
from tests.fence_kit import fence_db, fence_engine

__all__ = ["fence_db", "fence_engine"]  # fixtures, used by name

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SIGNER = Webhook(SECRET)
STANDARD = StandardReceipts("stub", "providers.stub.receipt_secret_env", SECRET)


def event(key: str, status: str, name: str | None = None) -> ReceiptEvent:
    return ReceiptEvent("stub", name or f"evt_{uuid.uuid4().hex}", key, status)


def recorded(session: Session, receipts: Sequence[ReceiptEvent], together: bool = False) -> str:
    """Record ``receipts`` in order, each in its own transaction (``together``: all in one
    ``record_many``, as the receiver's group commit does); the message's status."""
    for batch in [receipts] if together else [[r] for r in receipts]:
        record_many(session.connection(), batch)
        session.commit()
    message = session.scalars(select(Message).where(Message.key == receipts[0].key)).one()
    return message.status


@pytest.fixture(params=["sqlite", "postgresql"])
def outbox(request: pytest.FixtureRequest) -> Iterator[Session]:
    """A session on a SQLite outbox, or on PostgreSQL's (where a batch's rows are written by
    one statement each, ``unnest``)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("session")
        return
    with Session(request.getfixturevalue("fence_db")) as session:
        yield session


def test_every_order_of_the_same_receipts_ends_in_the_same_status(outbox: Session) -> None:
    """A sent message given sent, undelivered, delivered and a duplicate of one of them, in
    every one of the 24 orders, one by one or in one batch, ends delivered; without the
    delivered one, undelivered; and only one row is stored per event."""
    session = outbox
    for with_delivered, together in itertools.product((True, False), (False, True)):
        for n, order in enumerate(itertools.permutations(range(4))):
            key = f"perm-{with_delivered}-{together}-{n}"
            add(session, key, "sent")
            final = event(key, "delivered" if with_delivered else "undelivered", f"f-{key}")
            pool = [event(key, "sent"), event(key, "undelivered"), final, final]
            assert recorded(session, [pool[i] for i in order], together) == (
                "delivered" if with_delivered else "undelivered"
            ), (order, together)
            stored = session.scalar(
                select(func.count()).select_from(Receipt).join(Message).where(Message.key == key)
            )
            assert stored == 3


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_run_of_receipts_ends_at_the_highest_final_one(
    session: Session, data: st.DataObject
) -> None:
    """Any sequence of receipts for one ``sent`` or ``unknown`` message (queued, sent,
    delivered, undelivered; events repeated as a provider retries them), one by one or in one
    batch, ends at the highest final status it reported (delivered over undelivered), or
    where it was; one row per event."""
    kinds = data.draw(st.lists(st.sampled_from(RECEIPT_STATUSES), min_size=1, max_size=5))
    run = data.draw(st.lists(st.integers(0, len(kinds) - 1), min_size=1, max_size=10))
    start = data.draw(st.sampled_from(["sent", "unknown"]))
    together = data.draw(st.booleans())
    key = f"any-{uuid.uuid4().hex}"
    add(session, key, start)
    events = [event(key, kind, f"{key}-{n}") for n, kind in enumerate(kinds)]
    said = {kinds[n] for n in run}
    expected = next((s for s in ("delivered", "undelivered") if s in said), start)
    assert recorded(session, [events[n] for n in run], together) == expected
    rows = session.scalar(
        select(func.count()).select_from(Receipt).join(Message).where(Message.key == key)
    )
    assert rows == len(set(run))


def test_a_batch_says_what_each_of_its_receipts_did_in_order(outbox: Session) -> None:
    """One ``record_many`` over several messages: a result per receipt in the order given
    (an unknown key, a key of another provider, a duplicate inside the batch and one stored
    before), each message's receipts applied in order, the delivery's lag measured; a
    message moved twice in the batch (sent -> undelivered -> delivered) ends where its last
    move took it, and an unknown one loses its lookup flag."""
    session = outbox
    add(session, "b-1", "sent", sent_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30))
    add(session, "b-2", "sent")
    add(session, "b-3", "unknown", needs_lookup=True)
    old = event("b-2", "sent", "old")
    record(session.connection(), old)
    dup = event("b-1", "undelivered", "dup")
    batch = [
        event("b-1", "sent"),
        dup,
        event("nobody", "delivered"),
        ReceiptEvent("other", "e-other", "b-2", "delivered"),
        old,
        dup,
        event("b-1", "delivered"),
        event("b-3", "undelivered"),
    ]
    done = record_many(session.connection(), batch)
    session.commit()
    assert [(r.effect, r.moved_from) for r in done] == [
        (Effect.KEPT, None),
        (Effect.MOVED, Status.SENT),
        (None, None),
        (None, None),
        (None, None),
        (None, None),
        (Effect.MOVED, Status.UNDELIVERED),
        (Effect.MOVED, Status.UNKNOWN),
    ]
    assert [r.message_id is None for r in done] == [False, False, True, True] + [False] * 4
    lag = done[6].lag
    assert lag is not None and 29 <= lag <= 60, lag
    assert done[1].lag is None
    statuses = dict(session.execute(select(Message.key, Message.status)).all())
    assert statuses == {"b-1": "delivered", "b-2": "sent", "b-3": "undelivered"}
    assert session.scalar(select(Message.needs_lookup).where(Message.key == "b-3")) is False
    assert session.scalar(select(func.count()).select_from(Receipt)) == 5
    effects = dict(session.execute(select(Receipt.event, Receipt.effect)).all())
    assert effects["dup"] == "moved" and effects["old"] == "kept"


def test_nothing_moves_a_message_backwards(session: Session) -> None:
    """A late sent or undelivered after delivered changes nothing, and is kept in the log."""
    add(session, "back", "sent")
    status = recorded(
        session, [event("back", "delivered"), event("back", "sent"), event("back", "undelivered")]
    )
    assert status == "delivered"
    effects = session.scalars(select(Receipt.effect).order_by(Receipt.id)).all()
    assert effects == ["moved", "kept", "kept"]


def test_a_delivered_receipt_resolves_an_unknown_message(session: Session) -> None:
    """An unknown message (its answer was lost) that the provider reports delivered is
    delivered, its lookup flag cleared; a message a receipt cannot move stays put."""
    add(session, "unk", "unknown", needs_lookup=True)
    add(session, "gone", "cancelled")
    assert recorded(session, [event("unk", "delivered")]) == "delivered"
    assert session.scalars(select(Message).where(Message.key == "unk")).one().needs_lookup is False
    assert recorded(session, [event("gone", "delivered")]) == "cancelled"


def test_a_receipt_before_the_workers_sent_waits_for_the_sweeper(
    session: Session, db_url: str
) -> None:
    """A final receipt for a message still sending is stored as waiting; once the message is
    sent, a sweeper pass applies it."""
    message = add(session, "early", "sending")
    assert recorded(session, [event("early", "delivered")]) == "sending"
    assert session.scalars(select(Receipt.effect)).one() == Effect.WAITING
    engine = make_engine(db_url)
    assert sweep(engine).receipts == 0  # still sending: it keeps waiting
    session.get(Message, message.id).status = "sent"  # type: ignore[union-attr]  # as a worker
    session.commit()
    assert sweep(engine).receipts == 1
    session.expire_all()
    assert session.get(Message, message.id).status == "delivered"  # type: ignore[union-attr]
    assert session.scalars(select(Receipt.effect)).one() == Effect.MOVED
    engine.dispose()


# The receiver, through httpx's WSGI transport.


@pytest.fixture
def receiver(db_url: str) -> Iterator[httpx.Client]:
    engine = make_engine(db_url)
    app = Receiver(
        engine, {"stub": StandardReceipts("stub", "providers.stub.receipt_secret_env", SECRET)}
    )
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://r") as client:
        yield client
    engine.dispose()


def signed(body: bytes, event_id: str | None = None, signer: Webhook = SIGNER) -> dict[str, str]:
    event_id = event_id or f"evt_{uuid.uuid4().hex}"
    now = dt.datetime.now(dt.UTC)
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signer.sign(event_id, now, body),
    }


def body(key: str, status: str = "delivered", **extra: object) -> bytes:
    fields = {"id": "msg_1", "idempotency_key": key, "status": status, "code": None}
    fields["at"] = "2026-12-06T03:00:00.123Z"
    return json.dumps({**fields, **extra}).encode()


def stored(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Receipt)) or 0


def test_a_signed_receipt_is_stored_and_moves_its_message(
    receiver: httpx.Client, session: Session
) -> None:
    """200 once stored; the same event again is 200 and stores nothing more."""
    add(session, "r-1", "sent")
    data = body("r-1")
    headers = signed(data)
    for _ in range(2):
        answer = receiver.post("/receipts/stub", content=data, headers=headers)
        assert answer.status_code == 200, answer.text
    assert stored(session) == 1
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == Status.DELIVERED


@pytest.mark.parametrize(
    "change",
    ["no signature", "wrong secret", "other body", "old timestamp", "no id"],
)
def test_a_bad_signature_is_403_and_writes_nothing(
    receiver: httpx.Client, session: Session, change: str
) -> None:
    """A missing, wrong, replayed-with-another-body or stale signature is refused."""
    add(session, "r-2", "sent")
    data = body("r-2")
    headers = signed(data)
    if change == "no signature":
        del headers["webhook-signature"]
    elif change == "wrong secret":
        headers = signed(data, signer=Webhook("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"))
    elif change == "other body":
        data = body("r-2", "undelivered")
    elif change == "old timestamp":
        then = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
        headers["webhook-timestamp"] = str(int(then.timestamp()))
        headers["webhook-signature"] = SIGNER.sign(headers["webhook-id"], then, data)
    else:
        del headers["webhook-id"]
    answer = receiver.post("/receipts/stub", content=data, headers=headers)
    assert answer.status_code == 403, answer.text
    assert stored(session) == 0


def test_a_large_body_is_413_before_it_is_read(receiver: httpx.Client, session: Session) -> None:
    """A body over MAX_BODY is refused by its length."""
    add(session, "r-3", "sent")
    data = body("r-3", note="x" * MAX_BODY)
    answer = receiver.post("/receipts/stub", content=data, headers=signed(data))
    assert answer.status_code == 413
    assert stored(session) == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"status": "lost"}, "status"),
        ({"idempotency_key": 42}, "idempotency_key"),
        ({"at": "yesterday"}, "at"),
        ({"code": ["x"]}, "code"),
    ],
)
def test_a_malformed_receipt_is_400_naming_the_field(
    receiver: httpx.Client, session: Session, fields: dict[str, object], field: str
) -> None:
    """A signed receipt with a bad field is refused, naming it, and nothing is written."""
    add(session, "r-4", "sent")
    data = body("r-4", **fields)
    answer = receiver.post("/receipts/stub", content=data, headers=signed(data))
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.text
    assert stored(session) == 0


def test_a_receipt_for_a_message_we_do_not_know_is_200_and_not_stored(
    receiver: httpx.Client, session: Session
) -> None:
    """The provider stops retrying; nothing is written."""
    data = body("nobody")
    assert receiver.post("/receipts/stub", content=data, headers=signed(data)).status_code == 200
    assert stored(session) == 0


def test_other_paths_and_methods(receiver: httpx.Client) -> None:
    """A provider without receipts is 404; anything but a POST is 405."""
    assert receiver.post("/receipts/twilio", content=b"{}").status_code == 404
    assert receiver.get("/receipts/stub").status_code == 405


def test_a_database_that_does_not_answer_is_503_with_retry_after() -> None:
    """With the database unreachable the receiver answers 503 at once, asking for a retry."""
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    app = Receiver(
        engine, {"stub": StandardReceipts("stub", "providers.stub.receipt_secret_env", SECRET)}
    )
    data = body("r-5")
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://r") as client:
        answer = client.post("/receipts/stub", content=data, headers=signed(data))
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"


def test_the_receiver_refuses_to_start_broken(db_url: str) -> None:
    """No provider with receipts, or a secret unset or not a whsec_ secret: a ConfigError
    naming the key."""
    stub: dict[str, str] = {"kind": "http", "base_url": "http://h"}
    urls = {"database_url": db_url, "broker_url": "redis://127.0.0.1:6379/0", "redis_url": None}
    with pytest.raises(ConfigError) as caught:
        make_receiver(settings_from_mapping({"providers": {"stub": stub}}, **urls), {})
    assert caught.value.key == "providers"
    stub["receipt_secret_env"] = "STUB_RECEIPTS"
    settings = settings_from_mapping({"providers": {"stub": stub}}, **urls)
    with pytest.raises(ConfigError) as caught:
        make_receiver(settings, {})
    assert caught.value.key == "providers.stub.receipt_secret_env"
    with pytest.raises(ConfigError) as caught:
        make_receiver(settings, {"STUB_RECEIPTS": "whsec_%%%"})
    assert caught.value.key == "providers.stub.receipt_secret_env"
    assert make_receiver(settings, {"STUB_RECEIPTS": SECRET}).checks.keys() == {"stub"}


def test_the_receiver_needs_no_broker(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delivery receiver`` (it faces the internet) starts with the outbox and its secret
    alone: no DELIVERY_BROKER_URL, so no broker password, in its environment."""
    from delivery.cli.receiver import serving

    config = tmp_path / "receipts.toml"
    stub = '[providers.stub]\nkind = "http"\nbase_url = "http://h"\n'
    config.write_text(stub + 'receipt_secret_env = "STUB_RECEIPTS"\n')
    monkeypatch.setenv("DELIVERY_CONFIG", str(config))
    monkeypatch.setenv("STUB_RECEIPTS", SECRET)
    monkeypatch.delenv("DELIVERY_BROKER_URL", raising=False)
    receiver = serving()
    assert receiver.checks.keys() == {"stub"}
    receiver.engine.dispose()


def test_a_receipt_that_resolves_an_unknown_message_is_audited(
    receiver: httpx.Client, session: Session
) -> None:
    """The audit names the receipt as the actor of the resolve."""
    add(session, "r-6", "unknown")
    data = body("r-6")
    assert receiver.post("/receipts/stub", content=data, headers=signed(data)).status_code == 200
    entry = session.scalars(select(AuditEntry)).one()
    assert (entry.actor, entry.action, entry.from_status, entry.to_status) == (
        "receipt:stub",
        "resolve",
        "unknown",
        "delivered",
    )


def test_show_and_the_console_page_list_the_receipts(session: Session, db_url: str) -> None:
    """``delivery show`` (table and JSON) and the console's message page show each receipt
    of the message in its timeline, with what it did; the overview, the provider's rate."""
    from click.testing import CliRunner
    from flask import Flask

    from delivery.cli import main
    from delivery.config.loading import load_settings
    from delivery.console import parse_users
    from delivery.console.app import create_app

    add(session, "seen", "sent")
    recorded(session, [event("seen", "delivered", "evt_one"), event("seen", "sent", "evt_two")])
    shown = CliRunner().invoke(main, ["show", "seen", "--json"])
    assert shown.exit_code == 0, shown.output
    found = [(r["event"], r["status"], r["effect"]) for r in json.loads(shown.output)["receipts"]]
    assert found == [("evt_one", "delivered", "moved"), ("evt_two", "sent", "kept")]
    table = CliRunner().invoke(main, ["show", "seen"], terminal_width=200).output
    assert "receipt delivered" in table and "evt_one" in table
    users = parse_users({"DELIVERY_CONSOLE_AUTH": "ann:correct-horse-battery"})
    app: Flask = create_app(settings=load_settings(), users=users)
    auth = "Basic " + base64.b64encode(b"ann:correct-horse-battery").decode()
    page = app.test_client().get("/messages/seen", headers={"Authorization": auth})
    text_ = page.get_data(as_text=True)
    assert page.status_code == 200
    assert 'class="receipt"' in text_ and "evt_one" in text_ and "evt_two" in text_
    overview = app.test_client().get("/", headers={"Authorization": auth}).get_data(as_text=True)
    assert 'class="receipt-rate"><td>stub</td>' in overview  # the last day's delivery rate


def test_the_receiver_counts_what_it_stored_and_refused(
    receiver: httpx.Client, session: Session
) -> None:
    """``GET /metrics``: stored receipts by provider and status (a repeated event once), the
    answers that stored nothing by answer, and the lag from the provider's accept to its
    delivered receipt (40 s here: the receipt's ``at`` is 40 s after ``sent_at``)."""
    accepted = dt.datetime(2026, 12, 6, 2, 59, 20, 123000, tzinfo=dt.UTC)
    add(session, "m-1", "sent", sent_at=accepted)
    data = body("m-1")
    headers = signed(data)
    for _ in range(2):
        receiver.post("/receipts/stub", content=data, headers=headers)
    receiver.post("/receipts/stub", content=data)  # no signature
    unknown = body("nobody")
    receiver.post("/receipts/stub", content=unknown, headers=signed(unknown))
    text_ = receiver.get("/metrics").text
    assert 'delivery_receipts_total{provider="stub",status="delivered"} 1.0' in text_
    assert 'delivery_receipts_refused_total{answer="403",provider="stub"} 1.0' in text_
    assert 'delivery_receipts_refused_total{answer="unknown",provider="stub"} 1.0' in text_
    assert 'delivery_receipt_lag_seconds_bucket{le="30.0",provider="stub"} 0.0' in text_
    assert 'delivery_receipt_lag_seconds_bucket{le="60.0",provider="stub"} 1.0' in text_
    assert 'delivery_receipt_lag_seconds_sum{provider="stub"} 40.0' in text_


def test_the_flask_blueprint_receives_receipts(
    session: Session, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Delivery(app).receipts_blueprint()`` registered under a prefix stores a signed
    receipt; the blueprint refuses to be built without a provider's secret."""
    from flask import Flask

    import delivery
    from delivery.contrib.flask import Delivery

    app = Flask("receipts-test")
    app.config.update(
        DELIVERY_DATABASE_URL=db_url,
        DELIVERY_NUDGE=False,
        DELIVERY_OPTIONS={
            "providers": {
                "stub": {"kind": "http", "base_url": "http://h", "receipt_secret_env": "RCPT"}
            }
        },
    )
    try:
        ext = Delivery(app)
        with pytest.raises(ConfigError) as caught:
            ext.receipts_blueprint()
        assert caught.value.key == "providers.stub.receipt_secret_env"
        monkeypatch.setenv("RCPT", SECRET)
        app.register_blueprint(ext.receipts_blueprint(), url_prefix="/hooks")
        add(session, "f-1", "sent")
        data = body("f-1")
        client = app.test_client()
        answer = client.post("/hooks/receipts/stub", data=data, headers=signed(data))
        assert answer.status_code == 200, answer.get_data(as_text=True)
        forged = client.post("/hooks/receipts/stub", data=data)
        assert forged.status_code == 403
    finally:
        # Back to the environment's settings, read again when next needed: restoring what
        # get_settings() returned here would keep this test's (its own SQLite outbox, no
        # message types) for every test after it.
        delivery.configure(None)
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == Status.DELIVERED


DJANGO = """
import django, json, sys
from django.conf import settings
settings.configure(
    ROOT_URLCONF="urls", ALLOWED_HOSTS=["testserver"], SECRET_KEY="x",
    INSTALLED_APPS=["delivery.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
sys.modules["urls"] = type(sys)("urls")
django.setup()
from django.urls import include, path
sys.modules["urls"].urlpatterns = [path("hooks/", include("delivery.contrib.django.urls"))]
from django.test import Client
body, headers = json.loads(sys.stdin.read())
answer = Client().post(
    "/hooks/receipts/stub", data=body.encode(), content_type="application/json",
    headers={k: v for k, v in headers.items() if k != "content-type"},
)
print(answer.status_code, answer.content.decode())
"""


def test_the_django_urls_receive_receipts(session: Session, db_url: str, tmp_path: Path) -> None:
    """``include("delivery.contrib.django.urls")`` in a Django project stores a signed receipt
    (and refuses a forged one) on the configured outbox; CSRF does not stand in the way."""
    config = tmp_path / "receipts.toml"
    config.write_text(
        '[providers.stub]\nkind = "http"\nbase_url = "http://h"\nreceipt_secret_env = "RCPT"\n'
    )
    env = {
        **os.environ,
        "DELIVERY_DATABASE_URL": db_url,
        "DELIVERY_CONFIG": str(config),
        "DELIVERY_NUDGE": "false",
        "RCPT": SECRET,
    }
    add(session, "d-1", "sent")
    data = body("d-1")
    for headers, expected in ((signed(data), "200"), ({}, "403")):
        done = subprocess.run(
            [sys.executable, "-c", DJANGO],
            input=json.dumps([data.decode(), headers]),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.startswith(expected), done.stdout + done.stderr
    session.expire_all()
    assert session.scalars(select(Message.status)).one() == Status.DELIVERED


def test_prune_deletes_a_delivered_message_with_its_receipts(session: Session) -> None:
    """delivered is final: ``prune`` removes the message and its receipts with it."""
    from delivery import ops

    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    add(session, "old", "sent")
    recorded(session, [event("old", "delivered")])
    session.execute(
        Message.__table__.update().values(updated_at=old)  # type: ignore[attr-defined]
    )
    session.commit()
    done = ops.prune_batch(session, dt.datetime.now(dt.UTC) - dt.timedelta(days=30))
    session.commit()
    assert done.messages == 1
    assert session.scalars(select(Receipt)).all() == []


def test_the_overview_shows_the_delivery_rate_and_receipt_lag_per_provider(
    session: Session,
) -> None:
    """Three delivered and one undelivered message of the last day: a 75% delivery rate, and
    the lag from accept to the delivered receipt; a duplicate or a kept receipt does not
    count."""
    from delivery import ops

    sent_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)
    for i in range(4):
        add(session, f"rate-{i}", "sent", sent_at=sent_at)
    events = [event(f"rate-{i}", "delivered") for i in range(3)]
    events += [event("rate-3", "undelivered"), event("rate-0", "sent"), events[0]]
    for receipt in events:
        record(session.connection(), receipt)
        session.commit()
    [rates] = ops.receipt_rates(session, dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    assert (rates.provider, rates.delivered, rates.undelivered, rates.rate) == ("stub", 3, 1, 0.75)
    assert rates.lag_p50 is not None and 29 <= rates.lag_p50 <= 60

"""The suppression list (``delivery.guards.suppression``): a receipt that says a recipient can
never be reached puts them on it; the next message to them ends ``suppressed`` at its worker
with no provider call; lifting them lets the next one through; a message type may opt out; the
table names nobody. On a SQLite outbox, the stub provider over real HTTP."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

from delivery.cli import main
from delivery.config.loading import settings_from_mapping
from delivery.config.settings import Settings
from delivery.core.models import AuditEntry, Message, Suppression
from delivery.errors import InvalidMessage
from delivery.guards.suppression import Suppressions
from delivery.ops.suppression import lift as ops_lift
from delivery.ops.suppression import suppress as ops_suppress
from delivery.outbox import enqueue as outbox
from delivery.receipts import Receiver
from delivery.receipts.standard import StandardReceipts
from delivery.relay.claims import claim
from delivery.runtime.db import upgrade
from delivery.runtime.service import Service
from delivery.sending.sender import deliver
from delivery.testing.stub_provider import StubServer

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LIST_SECRET = "a-suppression-secret-of-our-own"
NUMBER = "+12015550147"


@dataclass
class Rig:
    settings: Settings
    service: Service
    stub: StubServer


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setattr(outbox, "_nudge", None)
    monkeypatch.setenv("DELIVERY_SUPPRESSION_SECRET", LIST_SECRET)
    with StubServer().start() as stub:
        settings = settings_from_mapping(
            {
                "providers": {"stub": {"kind": "http", "base_url": stub.url}},
                "channels": {"sms": {"provider": "stub"}},
                "types": {
                    "otp": {"channel": "sms", "suppress": False},
                    "news": {"channel": "sms"},
                },
            },
            database_url=f"sqlite:///{tmp_path}/outbox.sqlite3",
            broker_url="memory://",
            redis_url=None,
        )
        service = Service.from_settings(settings)
        upgrade(service.engine)
        try:
            yield Rig(settings, service, stub)
        finally:
            service.close()
            service.engine.dispose()


def send(rig: Rig, key: str, *, to: str = NUMBER, type: str = "news") -> str:
    """Enqueue one message, claim it and make its attempt as a worker does; its status."""
    with Session(rig.service.engine) as session, session.begin():
        outbox.enqueue(
            session,
            type=type,
            to=to,
            payload={"body": "hello"},
            key=key,
            settings=rig.settings,
        )
    with rig.service.engine.begin() as conn:
        (claimed,) = claim(conn, limit=10, lease=60)
    return str(deliver(rig.service, claimed.id, claimed.key).status)


def listed(rig: Rig) -> Suppressions:
    return rig.service.suppressions


def test_a_listed_recipient_is_never_sent_to_and_a_lifted_one_is(rig: Rig) -> None:
    """Listed: the message ends suppressed with no request to the provider. Lifted: the next
    one is sent. A type with ``suppress = false`` (an OTP) is sent even while listed."""
    assert send(rig, "before") == "sent"
    with rig.service.engine.begin() as conn:
        assert listed(rig).add(conn, "sms", NUMBER, code="UNSUBSCRIBED", source="test")
    requests = len(rig.stub.requests())
    assert send(rig, "while-listed") == "suppressed"
    assert len(rig.stub.requests()) == requests  # no provider call
    assert send(rig, "otp-while-listed", type="otp") == "sent"
    assert send(rig, "someone-else", to="+12015550148") == "sent"
    with rig.service.engine.begin() as conn:
        assert listed(rig).lift(conn, "sms", NUMBER)
    assert send(rig, "after-lift") == "sent"
    with Session(rig.service.engine) as session:
        shown = session.scalars(select(Message).where(Message.key == "while-listed")).one()
        assert (shown.last_error_code, shown.attempts) == ("SUPPRESSED", 0)


def test_the_list_holds_no_recipient_in_clear(rig: Rig) -> None:
    """Every column of the table, for a listed number, is free of the number (with or without
    its +) and of its digits; the hash is keyed (another secret gives another one)."""
    with rig.service.engine.begin() as conn:
        listed(rig).add(conn, "sms", NUMBER, code="21610", source="receipt:twilio evt")
        dumped = json.dumps(
            [list(r) for r in conn.execute(text("SELECT * FROM delivery_suppressions"))],
            default=str,
        )
    assert NUMBER not in dumped and NUMBER.lstrip("+") not in dumped
    other = Suppressions(rig.settings, {"DELIVERY_SUPPRESSION_SECRET": "another"})
    assert other.hash("sms", NUMBER) != listed(rig).hash("sms", NUMBER)


def test_without_a_secret_there_is_no_list(rig: Rig) -> None:
    """No DELIVERY_SUPPRESSION_SECRET: nothing is added, nothing suppressed."""
    bare = Suppressions(rig.settings, {})
    with rig.service.engine.begin() as conn:
        assert bare.add(conn, "sms", NUMBER, code="UNSUBSCRIBED", source="test") is False
        assert bare.listed(conn, [("sms", NUMBER)]) == set()
    assert not bare.active()


def receipt(key: str, status: str, code: str | None) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {"id": "msg_1", "idempotency_key": key, "status": status, "code": code}
    ).encode()
    event, now = f"evt_{uuid.uuid4().hex}", dt.datetime.now(dt.UTC)
    return body, {
        "content-type": "application/json",
        "webhook-id": event,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(event, now, body),
    }


def test_an_unsubscribe_receipt_suppresses_the_next_message(rig: Rig) -> None:
    """An undelivered receipt with UNSUBSCRIBED lists the recipient (the source names the
    receipt), so the next message to them is suppressed; an undelivered receipt with another
    code, or a delivered one, lists nobody."""
    app = Receiver(
        rig.service.engine,
        {"stub": StandardReceipts("stub", "providers.stub.receipt_secret_env", SECRET)},
        Suppressions(rig.settings),
    )
    assert send(rig, "m-1") == "sent"
    assert send(rig, "m-2", to="+12015550148") == "sent"
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://r") as client:
        for key, status, code in (
            ("m-2", "undelivered", "NETWORK"),
            ("m-2", "delivered", "UNSUBSCRIBED"),
            ("m-1", "undelivered", "UNSUBSCRIBED"),
        ):
            body, headers = receipt(key, status, code)
            assert client.post("/receipts/stub", content=body, headers=headers).status_code == 200
    with Session(rig.service.engine) as session:
        sources = session.scalars(select(Suppression.source)).all()
    assert len(sources) == 1 and sources[0].startswith("receipt:stub evt_")
    assert send(rig, "m-3") == "suppressed"
    assert send(rig, "m-4", to="+12015550148") == "sent"


def test_the_cli_adds_lists_and_lifts_without_showing_the_recipient(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delivery suppression add|list|lift``: audited, and no output names the recipient."""
    monkeypatch.setenv("DELIVERY_DATABASE_URL", rig.settings.database_url)
    monkeypatch.delenv("DELIVERY_CONFIG", raising=False)
    runner = CliRunner()
    added = runner.invoke(main, ["suppression", "add", "sms", NUMBER])
    assert added.exit_code == 0 and added.output.strip() == "added", added.output
    shown = runner.invoke(main, ["suppression", "list", "--json"])
    [entry] = json.loads(shown.output)
    assert entry["channel"] == "sms" and entry["source"].startswith("cli:")
    lifted = runner.invoke(main, ["suppression", "lift", "sms", NUMBER])
    again = runner.invoke(main, ["suppression", "lift", "sms", NUMBER])
    assert (lifted.exit_code, again.exit_code) == (0, 1)
    for result in (added, shown, lifted, again):
        assert NUMBER.lstrip("+") not in result.output
    with Session(rig.service.engine) as session:
        actions = session.scalars(select(AuditEntry.action).order_by(AuditEntry.id)).all()
    assert actions == ["suppress", "lift"]


def test_ops_list_a_recipient_as_messages_carry_it(rig: Rig) -> None:
    """An address typed with another case in its domain is the address a message carries
    (``enqueue``'s canonical form), so it suppresses that message and lifts with any case; a
    recipient that is not one for the channel is refused naming ``recipient``, not echoing
    it, and nothing is written."""
    email = settings_from_mapping(
        {
            "providers": {"stub": {"kind": "http", "base_url": rig.stub.url}},
            "channels": {"sms": {"provider": "stub"}, "email": {"provider": "stub"}},
        },
        database_url=rig.settings.database_url,
        broker_url="memory://",
        redis_url=None,
    )
    lists = Suppressions(email)
    with Session(rig.service.engine) as session:
        assert ops_suppress(session, lists, "email", "Ann@Example.COM", actor="test")
        session.commit()
        with pytest.raises(InvalidMessage) as refused:
            ops_suppress(session, lists, "sms", "867-5309", actor="test")
        assert refused.value.field == "recipient" and "867" not in str(refused.value)
        with rig.service.engine.connect() as conn:
            assert lists.listed(conn, [("email", "Ann@example.com")]) == {0}
        assert ops_lift(session, lists, "email", "Ann@EXAMPLE.com", actor="test")
        session.commit()
        assert session.scalar(select(func.count()).select_from(Suppression)) == 0

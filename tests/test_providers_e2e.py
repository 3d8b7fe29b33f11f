"""Each adapter end to end: a real celery worker and beat, configured by a TOML file naming
the twilio, pigeon and webhook kinds, send through the stubs of those providers over HTTP.

The suite's ``pipeline`` fixture runs a worker and beat with a fixed config against the
slot's database, and its beat relays every pending row it sees. So this module starts its
own worker and beat, with an explicit environment: a database of its own beside the slot's
(``delivery_test<slot>_adapters``), a file broker in a temp folder and no Redis, so that the
two pipelines never take each other's messages.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.models import Attempt, Message
from delivery.runtime.db import make_engine, upgrade
from delivery.testing.processes import ServiceProcess, beat, worker
from tests.conftest import PG_DB, PG_SERVER, RUN_DIR, need, wait_until
from tests.factories import OUTBOX_TABLES
from tests.provider_stubs import PIGEON_503_HTML, PigeonStub, Reply, TwilioStub, WebhookReceiver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DB = f"{PG_DB}_adapters"
SID = "AC00e2e000000000000000000000000e2e"
SECRETS = {
    "E2E_TWILIO_TOKEN": "e2e-twilio-token-5ecret",
    "E2E_PIGEON_KEY": "e2e-pigeon-key-5ecret",
    "E2E_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"e2e-webhook-signing-key-5ecret!!").decode(),
}
FINAL = ("sent", "dead", "unknown", "cancelled")


@dataclass
class Adapters:
    engine: Engine
    settings: Settings
    twilio: TwilioStub
    pigeon: PigeonStub
    receiver: WebhookReceiver
    procs: list[ServiceProcess]

    def enqueue(self, **kwargs: object) -> None:
        """Enqueue due a moment from now: no post-commit nudge (it would publish to this test
        process's broker); this module's beat relays the row instead."""
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.2)
        with Session(self.engine) as session, session.begin():
            delivery.enqueue(session, settings=self.settings, send_at=soon, **kwargs)  # type: ignore[arg-type]

    def final(
        self, key: str, timeout: float = 120.0
    ) -> tuple[Message, list[tuple[str, str, str | None]]]:
        def done() -> bool:
            with self.engine.connect() as conn:
                status = conn.scalar(
                    text("SELECT status FROM delivery_messages WHERE key = :k"), {"k": key}
                )
            return status in FINAL

        wait_until(done, timeout, every=0.1)
        with Session(self.engine) as session:
            message = session.scalars(select(Message).where(Message.key == key)).one()
            attempts = session.scalars(
                select(Attempt).where(Attempt.message_id == message.id).order_by(Attempt.id)
            ).all()
            session.expunge(message)
            return message, [(a.kind, a.outcome, a.error_code) for a in attempts]

    def assert_no_secrets_logged(self) -> None:
        logs = "".join(proc.output() for proc in self.procs)
        assert "delivery.deliver" in logs, "the worker logged nothing: the check proves nothing"
        for name, value in SECRETS.items():
            assert value not in logs, f"{name} appears in a log"
        raw = base64.b64decode(SECRETS["E2E_WEBHOOK_SECRET"][6:]).decode()
        assert raw not in logs


def _database() -> Engine:
    try:
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            if not conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": DB}):
                conn.execute(text(f"CREATE DATABASE {DB}"))
        admin.dispose()
    except Exception as exc:
        need("PostgreSQL", exc)
    engine = make_engine(f"{PG_SERVER}/{DB}")
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {OUTBOX_TABLES}, alembic_version CASCADE"))
    upgrade(engine)
    return engine


@pytest.fixture(scope="module")
def adapters() -> Iterator[Adapters]:
    engine = _database()
    folder = RUN_DIR / "adapters"
    folder.mkdir(parents=True, exist_ok=True)
    twilio = TwilioStub(SID, SECRETS["E2E_TWILIO_TOKEN"]).start()
    pigeon = PigeonStub(SECRETS["E2E_PIGEON_KEY"]).start()
    receiver = WebhookReceiver(SECRETS["E2E_WEBHOOK_SECRET"]).start()
    config = folder / "delivery.toml"
    config.write_text(f"""
[delivery]
relay_interval = 0.2
sweep_interval = 0.5
dispatch_lease = 10
send_lease = 8

[backoff]
base = 0.05
cap = 0.3

[timeouts]
connect = 1
write = 1
read = 2
pool = 1

[providers.twilio]
kind = "twilio"
base_url = "{twilio.url}"
account_sid = "{SID}"
auth_token_env = "E2E_TWILIO_TOKEN"
from_number = "+15005550006"

[providers.pigeon]
kind = "pigeon"
base_url = "{pigeon.url}"
api_key_env = "E2E_PIGEON_KEY"
timeouts = {{ read = 2 }}      # pigeon's own default (45 s) would outlast send_lease here

[providers.hooks]
kind = "webhook"
secret_env = "E2E_WEBHOOK_SECRET"
allow_networks = ["127.0.0.1/32"]   # the receiver is on loopback: allowlisted, as documented

[channels.sms]
provider = "twilio"            # no on_unknown: the twilio kind's default, lookup

[channels.email]
provider = "pigeon"

[channels.webhook]
provider = "hooks"
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELIVERY_")}
    env.update(
        SECRETS,
        DELIVERY_DATABASE_URL=f"{PG_SERVER}/{DB}",
        DELIVERY_BROKER_URL="filesystem://",
        DELIVERY_HOME=str(folder / "home"),
        DELIVERY_CONFIG=str(config),
    )
    settings = load_settings(env)
    procs: list[ServiceProcess] = []
    try:
        procs.append(
            worker(folder / "worker.log", env=env, cwd=ROOT, concurrency=4, name="adapters").start()
        )
        procs.append(beat(folder / "beat.log", folder / "beat-schedule", env=env, cwd=ROOT).start())
        yield Adapters(engine, settings, twilio, pigeon, receiver, procs)
    finally:
        for proc in procs:
            proc.stop()
        for stub in (twilio, pigeon, receiver):
            stub.stop()
        engine.dispose()


def test_twilio_lost_answer_is_looked_up_not_sent_twice(adapters: Adapters) -> None:
    """Twilio creates the SMS but the answer is lost: the sms channel's default policy (the
    twilio kind's: lookup) finds it by the list query and marks it sent; one SMS exists."""
    adapters.twilio.push(Reply(drop=True))
    to = "+12015550142"
    adapters.enqueue(channel="sms", to=to, payload={"body": "Your code is 557100"}, key="e2e-otp")
    message, attempts = adapters.final("e2e-otp")
    sms = adapters.twilio.sends_to(to)
    assert (message.status, message.on_unknown) == ("sent", "lookup")
    assert len(sms) == 1 and message.provider_ref == sms[0]["sid"]
    assert attempts == [
        ("send", "unknown", "NETWORK_RemoteProtocolError"),
        ("lookup", "found", None),
    ]
    assert len(adapters.twilio.sent("POST")) == 1 and len(adapters.twilio.sent("GET")) == 1
    adapters.assert_no_secrets_logged()


def test_twilio_lost_answer_then_undelivered_ends_dead_with_twilios_code(
    adapters: Adapters,
) -> None:
    """The answer is lost, and Twilio later reports the SMS undelivered with 30005 (unknown
    handset): the lookup finds it, the message ends dead with 30005, and nothing is resent."""
    adapters.twilio.push(Reply(drop=True))
    to = "+12015550143"
    adapters.twilio.reports[to] = ("undelivered", 30005)
    adapters.enqueue(channel="sms", to=to, payload={"body": "Your code is 557101"}, key="e2e-dead")
    message, attempts = adapters.final("e2e-dead")
    assert (message.status, message.last_error_code) == ("dead", "30005")
    assert attempts == [
        ("send", "unknown", "NETWORK_RemoteProtocolError"),
        ("lookup", "undeliverable", "30005"),
    ]
    assert len(adapters.twilio.sends_to(to)) == 1
    assert to not in (message.last_error or "")


def test_pigeon_deploy_and_lost_answer_is_one_email(adapters: Adapters) -> None:
    """A deploy's HTML 503, then an answer lost after pigeon sent the email: the worker retries
    with the same Idempotency-Key and gets the first emailId back; one email."""
    adapters.pigeon.push(
        Reply(503, body=PIGEON_503_HTML, content_type="text/html"), Reply(drop=True)
    )
    payload = {"subject": "Your receipt", "template": {"id": 7, "data": {"order": "42"}}}
    adapters.enqueue(channel="email", to="ann@example.com", payload=payload, key="e2e-receipt")
    message, attempts = adapters.final("e2e-receipt")
    assert (message.status, message.on_unknown) == ("sent", "retry")
    assert adapters.pigeon.effects == {"e2e-receipt": 1}
    requests = adapters.pigeon.sent()
    assert [r.headers["idempotency-key"] for r in requests] == ["e2e-receipt"] * 3
    assert message.provider_ref == "1001"
    assert attempts == [
        ("send", "retryable", "HTTP_503"),
        ("send", "unknown", "NETWORK_RemoteProtocolError"),
        ("send", "delivered", None),
    ]
    adapters.assert_no_secrets_logged()


def test_webhook_retried_until_verified_and_stop_header_ends_dead(adapters: Adapters) -> None:
    """A webhook answered 503 is resent with the same webhook-id and delivered with a signature
    the receiver verifies (no provider reference); a receiver's Webhook-Stop-Retries makes
    another dead after one attempt."""
    receiver = adapters.receiver
    receiver.push(Reply(503), path="/hooks/a")
    receiver.push(Reply(422, headers={"Webhook-Stop-Retries": "true"}), path="/hooks/b")
    body = {"event": "order.paid", "order": 42}
    adapters.enqueue(
        channel="webhook", to=f"{receiver.url}/hooks/a", payload=body, key="e2e-hook-a"
    )
    adapters.enqueue(
        channel="webhook", to=f"{receiver.url}/hooks/b", payload=body, key="e2e-hook-b"
    )
    a, a_attempts = adapters.final("e2e-hook-a")
    b, b_attempts = adapters.final("e2e-hook-b")
    assert (a.status, a.provider_ref) == ("sent", None)
    assert a_attempts == [("send", "retryable", "HTTP_503"), ("send", "delivered", None)]
    assert receiver.receipts == {"e2e-hook-a": 1} and receiver.verified == [True]
    ids = [r.headers["webhook-id"] for r in receiver.sent() if r.path == "/hooks/a"]
    assert ids == ["e2e-hook-a", "e2e-hook-a"]
    assert (b.status, b.attempts, b.last_error_code) == ("dead", 1, "RECEIVER_STOPPED")
    assert b_attempts == [("send", "permanent", "RECEIVER_STOPPED")]
    adapters.assert_no_secrets_logged()

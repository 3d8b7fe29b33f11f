"""Delivery receipts end to end: a worker, beat, the stub provider and ``delivery receiver``
as real processes. The stub calls back with signed receipts, delayed, duplicated, out of
order and sometimes never, while the worker sends; every message ends where the stub's
receipts say, no receipt is lost, and none moves a message backwards.

The rig has its own database, stub and broker (this slot's shared-state Redis db), so that no
other worker of the suite takes its messages.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.models import Message, Receipt
from delivery.outbox import enqueue as outbox
from delivery.outbox.bulk import enqueue_many
from delivery.testing.processes import ServiceProcess, beat, start_all, stop_all, stub_provider
from delivery.testing.processes import worker as worker_process
from delivery.testing.stub_provider import StubClient
from tests.conftest import free_port, own_outbox, wait_until
from tests.factories import empty_outbox

pytestmark = pytest.mark.integration

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGES = 500
RECEIVER = [sys.executable, "-m", "delivery.cli", "receiver", "--processes", "2"]
UNREACHABLE = {f"+1201555{i:04d}" for i in range(0, MESSAGES, 10)}  # every tenth recipient

TOML = """
[delivery]
relay_interval = 0.2
sweep_interval = 0.5

[providers.stub]
kind = "http"
base_url = "http://127.0.0.1:{port}"
receipt_secret_env = "DELIVERY_TEST_RECEIPTS"

[channels.sms]
provider = "stub"
"""


class Rig:
    def __init__(self, engine: Engine, settings: Settings, stub: StubClient, url: str) -> None:
        self.engine, self.settings, self.stub, self.receiver_url = engine, settings, stub, url


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, redis_client: Any) -> Iterator[Rig]:
    run = tmp_path_factory.mktemp("receipts")
    port, receiver_port = free_port(), free_port()
    config = run / "receipts.toml"
    config.write_text(TOML.format(port=port))
    redis_client.flushdb()
    procs: list[ServiceProcess] = []
    with own_outbox("receipts", run, config) as (engine, env):
        env["DELIVERY_TEST_RECEIPTS"] = SECRET
        receiver = ServiceProcess(
            "receiver",
            [*RECEIVER, "--port", str(receiver_port)],
            log=run / "receiver.log",
            ready="delivery receiver on",
            env=env,
        )
        try:
            procs = start_all(
                [
                    stub_provider(run / "stub.log", port),
                    receiver,
                    worker_process(run / "worker.log", env=env, concurrency=4, name="receipts"),
                    beat(run / "beat.log", run / "beat-schedule", env=env),
                ]
            )
            with StubClient(f"http://127.0.0.1:{port}") as stub:
                url = f"http://127.0.0.1:{receiver_port}/receipts/stub"
                yield Rig(engine, load_settings(env), stub, url)
        finally:
            stop_all(procs[::-1])
            redis_client.flushdb()


def statuses(engine: Engine) -> dict[str, str]:
    with Session(engine) as session:
        return {key: status for key, status in session.execute(select(Message.key, Message.status))}


def test_receipts_delayed_duplicated_reordered_and_lost_end_where_the_provider_said(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 messages; the stub reports every tenth recipient undelivered (30003), duplicates
    30% of its callbacks, sends each message's callbacks final first, 300 ms late, and sends
    none for 10% of the messages. Every message ends as the stub's own log of what it called
    back says (delivered, undelivered, or sent when it never called), each callback it got a
    200 for is stored once, and none moved a message backwards."""
    monkeypatch.setattr(outbox, "_nudge", None)  # it would publish to the suite's broker
    with rig.engine.begin() as conn:
        empty_outbox(conn)
    rig.stub.reset()
    rig.stub.set_receipts(
        url=rig.receiver_url,
        secret=SECRET,
        rules={to: {"status": "undelivered", "code": "30003"} for to in UNREACHABLE},
        delay_ms=300,
        duplicate_rate=0.3,
        reorder=True,
        never_rate=0.1,
        seed=7,
        retry_ms=100,
    )
    with Session(rig.engine) as session, session.begin():
        enqueue_many(
            session,
            [
                {
                    "channel": "sms",
                    "to": f"+1201555{i:04d}",
                    "payload": {"body": f"code {i}"},
                    "key": f"rcpt-{i}",
                }
                for i in range(MESSAGES)
            ],
            settings=rig.settings,
        )

    def said() -> dict[str, str]:
        """Each key's final status by the stub's log of callbacks (all answered)."""
        final: dict[str, str] = {}
        for entry in rig.stub.receipts()["sent"]:
            if entry["status"] in ("delivered", "undelivered"):
                final[entry["key"]] = entry["status"]
        return final

    def settled() -> bool:
        """Every message sent, every callback made (none queued), and each status as said."""
        if len(rig.stub.effects()) < MESSAGES or rig.stub.receipts()["queued"]:
            return False
        final, now = said(), statuses(rig.engine)
        return now == {key: final.get(key, "sent") for key in now}

    wait_until(settled, timeout=90, every=0.5)
    log = rig.stub.receipts()["sent"]
    assert {e["answer"] for e in log} == {200}, Counter(e["answer"] for e in log)
    final = said()
    ends = Counter(statuses(rig.engine).values())
    assert ends["undelivered"] == sum(1 for s in final.values() if s == "undelivered") > 0
    assert ends["delivered"] == sum(1 for s in final.values() if s == "delivered") > 0
    assert 0 < ends["sent"] == MESSAGES - len(final)  # never called back: still sent
    with Session(rig.engine) as session:
        stored = session.execute(select(Receipt.event, Receipt.effect)).all()
        undelivered = session.scalars(
            select(Message.recipient).where(Message.status == "undelivered")
        ).all()
    assert len(stored) == len({e["event"] for e in log})  # each callback once, duplicates not
    assert set(undelivered) <= UNREACHABLE
    effects = Counter(effect for _, effect in stored)
    assert effects.keys() == {"moved", "kept"}  # none left waiting; late ones kept
    assert any(e["duplicate"] for e in log)
    assert rig.stub.effects() == {f"rcpt-{i}": 1 for i in range(MESSAGES)}
    # Two receiver processes: /metrics, served by either, counts what both stored.
    metrics = rig.receiver_url.replace("/receipts/stub", "/metrics")
    for _ in range(4):  # a connection each: the processes take turns accepting
        lines = httpx.get(metrics, timeout=10).text.splitlines()
        counted = [float(x.split()[-1]) for x in lines if x.startswith("delivery_receipts_total{")]
        assert sum(counted) == len(stored)

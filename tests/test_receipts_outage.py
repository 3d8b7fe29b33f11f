"""The receipt receiver while its PostgreSQL stops: it answers 503 with ``Retry-After`` instead
of holding the provider's connections, never answers 200 for a receipt it did not store, and
every receipt the provider got a 200 for is in the outbox after the restart. On the private
cluster (``tests/chaos_cluster.py``), whose PostgreSQL may be stopped; the receiver and the
stub provider are real processes, and the stub retries a refused callback as a provider does.
"""

from __future__ import annotations

import sys
import threading
import time

import httpx
import pytest
from sqlalchemy import insert, select

from delivery.core.models import Receipt, messages_table
from delivery.testing.processes import ServiceProcess
from tests.chaos_cluster import Cluster, free_port
from tests.factories import message_values

pytestmark = pytest.mark.integration

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGES = 150
DOWN = 3.0  # seconds PostgreSQL is stopped, in the middle of the callbacks


def test_the_receiver_sheds_load_while_postgres_is_down_and_loses_no_receipt(
    cluster: Cluster,
) -> None:
    """150 accepted messages, their receipts called back while PostgreSQL stops for 3 s: some
    callbacks are refused (503) and retried by the provider, none is acknowledged and lost,
    and every message ends delivered."""
    cluster.reset("redis")
    config = cluster.dir / "receipts.toml"
    config.write_text(
        f'[providers.stub]\nkind = "http"\nbase_url = "{cluster.proxy.url}"\n'
        'receipt_secret_env = "RCPT"\n\n[channels.sms]\nprovider = "stub"\n'
    )
    keys = [f"out-{i}" for i in range(MESSAGES)]
    with cluster.db.begin() as conn:
        conn.execute(
            insert(messages_table),
            [
                message_values(key, "sent", recipient=f"+1201555{i:04d}")
                for i, key in enumerate(keys)
            ],
        )
    port = free_port()
    receiver = ServiceProcess(
        "receiver",
        [sys.executable, "-m", "delivery.cli", "receiver", "--port", str(port)],
        log=cluster.dir / "receiver.log",
        ready="delivery receiver on",
        env=cluster.env("redis", config, RCPT=SECRET),
    ).start()
    try:
        cluster.stub.set_receipts(
            url=f"http://127.0.0.1:{port}/receipts/stub",
            secret=SECRET,
            statuses=["delivered"],
            max_tries=8,
            retry_ms=200,
        )
        stop = threading.Timer(0.5, cluster.pg.restart, kwargs={"down": DOWN})
        stop.start()
        started = time.monotonic()
        with httpx.Client(base_url=f"http://127.0.0.1:{cluster.stub_port}") as provider:
            for i, key in enumerate(keys):  # the sends the provider accepts, over 2 s or so
                provider.post(
                    "/v1/messages",
                    json={"to": f"+1201555{i:04d}", "body": "hi"},
                    headers={"Idempotency-Key": key},
                )
                time.sleep(max(0.0, started + i * 2.0 / MESSAGES - time.monotonic()))
        stop.join()

        def answered() -> bool:
            log = cluster.stub.receipts()["sent"]
            return len(log) == MESSAGES and all(e["answer"] == 200 for e in log)

        deadline = time.monotonic() + 60
        while not answered():
            assert time.monotonic() < deadline, cluster.stub.receipts()["sent"][:5]
            time.sleep(0.3)
    finally:
        receiver.stop()
    log = cluster.stub.receipts()["sent"]
    assert cluster.pg.restarts >= 1
    assert any(e["tries"] > 1 for e in log), "no callback was refused while PostgreSQL was down"
    with cluster.db.connect() as conn:
        stored = set(conn.scalars(select(Receipt.event)))
        statuses = set(conn.scalars(select(messages_table.c.status)))
    assert stored == {e["event"] for e in log}  # every 200 stored, each once
    assert statuses == {"delivered"}
    assert "not stored" in receiver.log.read_text()  # the receiver said why it refused

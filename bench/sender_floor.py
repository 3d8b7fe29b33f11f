"""Sender floor: what one delivery attempt costs in a worker thread, run back to back without
Celery, to tell how much of the end-to-end gap is the sender's database work.

Three ways over the same kind of ``dispatched`` rows and the same stub, interleaved in blocks
of 250 for ``--rounds`` rounds (the first dropped), median ms per message:

- ``shipped``: ``delivery.sending.sender.deliver`` as it is (a read in an ORM session, the
  ``sending`` commit, the POST, then the attempt row and ``sent`` in a third transaction, plus
  the breaker and the transition hooks);
- ``lean``: an experiment, not product code: the happy path in two single-statement
  autocommit transactions built once (``UPDATE .. RETURNING`` to take the row, then one
  ``WITH .. UPDATE .. INSERT`` for ``sent`` and the attempt row), the same POST;
- ``http``: the POST alone (what the Celery-alone task does).

    python -m bench.sender_floor [--rounds 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any

from sqlalchemy import bindparam, text, update

from bench.common import fresh_database, insert_rows, median, report, row, session
from delivery.core.models import messages_table as m
from delivery.core.models import utcnow
from delivery.providers import Envelope
from delivery.relay.claims import claim
from delivery.runtime.current import get_settings
from delivery.runtime.service import Service
from delivery.sending.sender import deliver

TAKE = (
    update(m)
    .where(m.c.id == bindparam("mid"), m.c.key == bindparam("k"), m.c.status == "dispatched")
    .values(
        status="sending",
        attempts=m.c.attempts + 1,
        updated_at=bindparam("now"),
        lease_expires_at=bindparam("lease"),
    )
    .returning(m.c.key, m.c.channel, m.c.provider, m.c.recipient, m.c.payload, m.c.attempts)
)
FINISH = text(
    """
    WITH done AS (
        UPDATE delivery_messages SET status = 'sent', provider_ref = :ref, sent_at = :now,
               updated_at = :now, lease_expires_at = NULL
        WHERE id = :mid AND status = 'sending' AND attempts = :attempt RETURNING id)
    INSERT INTO delivery_attempts
        (message_id, number, kind, outcome, started_at, http_status, latency_ms)
    SELECT id, :attempt, 'send', 'delivered', :started, 201, :latency FROM done
    """
)


def lean(service: Service, conn: Any, message_id: int, key: str) -> None:
    now = utcnow()
    taken = conn.execute(
        TAKE, {"mid": message_id, "k": key, "now": now, "lease": now + dt.timedelta(seconds=60)}
    ).one()
    started = time.perf_counter()
    envelope = Envelope(taken.key, taken.channel, taken.recipient, dict(taken.payload))
    outcome: Any = service.provider(taken.provider).send(envelope)
    latency = (time.perf_counter() - started) * 1000
    conn.execute(
        FINISH,
        {
            "ref": outcome.provider_ref,
            "now": utcnow(),
            "mid": message_id,
            "attempt": taken.attempts,
            "started": now,
            "latency": latency,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    block = 250
    with session() as procs:
        engine = fresh_database()
        procs.stub()
        insert_rows(engine, 2 * block * (args.rounds + 1))
        with engine.begin() as conn:
            claims = claim(conn, limit=10**6, lease=600)
        service = Service.from_settings(get_settings())
        provider = service.provider("stub")
        ms: dict[str, list[float]] = {"shipped": [], "lean": [], "http": []}
        autocommit = service.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            position = 0
            for n in range(args.rounds + 1):
                for name in ms:
                    start = time.perf_counter()
                    for i in range(block):
                        if name == "http":
                            envelope = Envelope(f"http-{n}-{i}", "sms", "+12015550123", {"b": 1})
                            provider.send(envelope)
                            continue
                        c = claims[position]
                        position += 1
                        if name == "shipped":
                            result = deliver(service, c.id, c.key)
                            assert result.status == "sent", result
                        else:
                            lean(service, autocommit, c.id, c.key)
                    if n:
                        ms[name].append((time.perf_counter() - start) / block * 1000)
            with engine.connect() as conn:
                sent = conn.scalar(
                    text("SELECT count(*) FROM delivery_messages WHERE status='sent'")
                )
            assert sent == position, (sent, position)
        finally:
            autocommit.close()
            service.close()
        med = {k: round(median(v), 3) for k, v in ms.items()}
        rows = [
            row(
                "one attempt back to back (no Celery): shipped sender vs lean happy path",
                med["shipped"] / med["lean"],
                "",
                None,
                f"shipped {med['shipped']} ms/msg",
                f"lean 2-statement experiment {med['lean']} ms/msg; POST alone {med['http']} ms",
            )
        ]
        report(
            "sender_floor", {"median_ms": med, "block": block, "rounds": args.rounds}, rows, engine
        )
        engine.dispose()


if __name__ == "__main__":
    main()

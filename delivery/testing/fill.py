"""A large outbox on PostgreSQL in one statement (``generate_series``), for the console's plan
tests and benchmarks: statuses, providers, error codes and types mixed, one message every
``spacing`` ending now."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection, text

from delivery.runtime import partitions

__all__ = ["fill_outbox"]

_CREATED = "now() - (:rows - i) * :spacing"

_FILL = r"""
INSERT INTO delivery_messages ({id}key, channel, provider, recipient, payload, payload_hash,
    on_unknown, status, attempts, max_attempts, needs_lookup, next_attempt_at, created_at,
    updated_at, last_error_code, message_type, priority)
SELECT {id_value}'order-' || i || '\:receipt', 'sms',
    CASE WHEN i % 3 = 0 THEN 'twilio' ELSE 'stub' END,
    '+15555550123', '{"body": "x"}', 'h', 'retry',
    CASE WHEN i % 20 = 0 THEN 'dead' WHEN i % 50 = 1 THEN 'unknown'
         WHEN i % 33 = 2 THEN 'pending' ELSE 'sent' END,
    1, 8, false, now(), {created}, {created},
    CASE WHEN i % 20 = 0 THEN (CASE WHEN i % 40 = 0 THEN '21211' ELSE '503' END) END,
    CASE WHEN i % 7 = 0 THEN 'otp' END, 'normal'
FROM generate_series(1, :rows) AS i
"""


def fill_outbox(conn: Connection, rows: int, spacing: dt.timedelta) -> None:
    """Insert ``rows`` messages keyed ``order-N:receipt`` (N from 1) into ``conn``'s outbox.
    On a partitioned outbox each id is of its ``created_at``'s day, as if inserted then (the
    past days' partitions must exist: ``conversion.partition(engine, start=..)``)."""
    partitioned = partitions.is_partitioned(conn)
    sql = (
        _FILL.replace("{id}", "id, " if partitioned else "")
        .replace("{id_value}", f"delivery_message_id({_CREATED}), " if partitioned else "")
        .replace("{created}", _CREATED)
    )
    conn.execute(text(sql), {"rows": rows, "spacing": spacing})

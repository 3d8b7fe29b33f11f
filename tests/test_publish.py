"""The relay's and the nudge's publisher (``delivery.worker.publish``) goes through Celery's
``apply_async``: Celery's publish signals fire, ``task_routes`` are honoured, and an
OpenTelemetry producer span is the parent of the worker's consumer span for the same message.

The outbox here is a private database of the suite's server, so that no live beat relay of
the session claims these rows first: what is published is what this process's relay or
nudge published. The tasks go to the suite's broker (slot); a worker of the session that
takes one finds no such message in its own database and skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.signals import after_task_publish, before_task_publish
from sqlalchemy import Engine, create_engine, insert, select, text
from sqlalchemy.orm import Session

import delivery
from delivery.core.models import messages_table
from delivery.relay.claims import Claim, relay_once
from delivery.runtime.current import get_settings
from delivery.worker.app import app
from delivery.worker.publish import publish
from tests.conftest import BROKER_URL, PG_DB, PG_SERVER, RUN_DIR, free_port, wait_until
from tests.factories import OUTBOX_TABLES, empty_outbox, message_values

pytestmark = pytest.mark.integration

PRIVATE_DB = f"{PG_DB}_publish"
PRIVATE_URL = f"{PG_SERVER}/{PRIVATE_DB}"
BODY = "publish-test-body-7f3a"  # a payload text that must never reach the broker
RECIPIENT = "+12015550177"  # a recipient, likewise


@pytest.fixture(scope="module")
def private(pg_engine: Engine) -> Iterator[Engine]:
    """A migrated outbox of its own (no beat relay runs on it)."""
    from delivery.runtime.db import make_engine, upgrade

    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": PRIVATE_DB}):
            conn.execute(text(f"CREATE DATABASE {PRIVATE_DB}"))
    admin.dispose()
    engine = make_engine(PRIVATE_URL)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {OUTBOX_TABLES}, alembic_version CASCADE"))
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def outbox(private: Engine, broker_ready: None) -> Engine:
    with private.begin() as conn:
        empty_outbox(conn)
    return private


class Published:
    """What Celery's ``before_task_publish`` and ``after_task_publish`` saw, per task id."""

    def __init__(self) -> None:
        self.before: dict[str, dict[str, Any]] = {}
        self.after: dict[str, dict[str, Any]] = {}

    def on_before(self, **kw: Any) -> None:
        self.before[kw["headers"]["id"]] = kw

    def on_after(self, **kw: Any) -> None:
        self.after[kw["headers"]["id"]] = kw


@pytest.fixture
def signals() -> Iterator[Published]:
    seen = Published()
    before_task_publish.connect(seen.on_before, weak=False)
    after_task_publish.connect(seen.on_after, weak=False)
    yield seen
    before_task_publish.disconnect(seen.on_before)
    after_task_publish.disconnect(seen.on_after)


@contextmanager
def task_routes(routes: Any) -> Iterator[None]:
    """``task_routes`` set as a user of the app would (``app.conf.update``), then restored."""
    before = app.conf.task_routes
    app.conf.update(task_routes=routes)
    try:
        yield
    finally:
        app.conf.update(task_routes=before)


def _carries_ids_and_keys_only(kw: dict[str, Any]) -> None:
    """Nothing Celery publishes names the recipient or the payload (docs/concepts.md, G6)."""
    seen = json.dumps(
        {k: kw.get(k) for k in ("body", "headers", "properties", "exchange", "routing_key")},
        default=str,
    )
    assert RECIPIENT not in seen and BODY not in seen, seen


def test_the_relay_publishes_through_celery_signals_and_priority_queues(
    outbox: Engine, signals: Published
) -> None:
    """A relay pass fires ``before_task_publish`` and ``after_task_publish`` for each task:
    ``delivery.deliver`` under the message's key (``retries`` = its attempts) in its priority's
    queue; a backlog as ``delivery.deliver_batch``; ids and keys only."""
    size = get_settings().batch_size
    rows = [
        message_values(
            "pub-urgent", priority="urgent", attempts=2, recipient=RECIPIENT, payload={"body": BODY}
        ),
        message_values("pub-bulk", priority="bulk", recipient=RECIPIENT, payload={"body": BODY}),
    ] + [
        message_values(f"pub-n{i}", priority="normal", recipient=RECIPIENT, payload={"body": BODY})
        for i in range(size)
    ]
    with outbox.begin() as conn:
        conn.execute(insert(messages_table), rows)
        ids = dict(conn.execute(select(messages_table.c.key, messages_table.c.id)).all())

    published = relay_once(outbox, publish, batch=500, lease=30)

    assert published == size + 2
    assert set(signals.before) == set(signals.after)
    urgent, bulk = signals.before["pub-urgent"], signals.before["pub-bulk"]
    assert urgent["sender"] == "delivery.deliver" and urgent["routing_key"] == "delivery.urgent"
    assert list(urgent["body"][0]) == [ids["pub-urgent"], "pub-urgent"]
    assert urgent["headers"]["argsrepr"] == repr((ids["pub-urgent"], "pub-urgent"))
    assert urgent["headers"]["retries"] == 2
    assert bulk["routing_key"] == "delivery.bulk" and bulk["headers"]["retries"] == 0
    [batch_id] = set(signals.before) - {"pub-urgent", "pub-bulk"}
    batch = signals.before[batch_id]
    assert batch["sender"] == "delivery.deliver_batch" and batch["routing_key"] == "delivery"
    assert sorted(map(tuple, batch["body"][0][0])) == sorted(
        (ids[f"pub-n{i}"], f"pub-n{i}") for i in range(size)
    )
    for kw in signals.before.values():
        _carries_ids_and_keys_only(kw)


def test_the_post_commit_nudge_publishes_through_celery_signals(
    outbox: Engine, signals: Published
) -> None:
    """The nudge (inside the app's commit) fires both publish signals for its message."""
    with Session(outbox) as session, session.begin():
        message_id = delivery.enqueue(
            session, channel="sms", to=RECIPIENT, payload={"body": BODY}, key="pub-nudged"
        ).id
    assert set(signals.before) == set(signals.after) == {"pub-nudged"}
    kw = signals.before["pub-nudged"]
    assert kw["sender"] == "delivery.deliver" and list(kw["body"][0]) == [message_id, "pub-nudged"]
    _carries_ids_and_keys_only(kw)
    with outbox.connect() as conn:
        assert conn.scalar(text("SELECT status FROM delivery_messages")) == "dispatched"


def test_task_routes_configured_by_the_user_are_honoured(outbox: Engine) -> None:
    """A ``task_routes`` entry sends the relay's tasks (alone and batched) to its queue,
    whatever the priority."""
    client = redis.Redis.from_url(BROKER_URL)
    client.delete("pub-routed")
    size = get_settings().batch_size
    claims = [Claim(1, "routed-alone", "urgent")] + [
        Claim(10 + i, f"routed-{i}", "bulk") for i in range(size)
    ]
    routes = {"delivery.deliver": "pub-routed", "delivery.deliver_batch": {"queue": "pub-routed"}}
    try:
        with task_routes(routes):
            assert publish(claims) == {"urgent": 1, "bulk": 1}
        queued = [json.loads(raw) for raw in client.lrange("pub-routed", 0, -1)]
    finally:
        client.delete("pub-routed")
    assert sorted(m["headers"]["task"] for m in queued) == [
        "delivery.deliver",
        "delivery.deliver_batch",
    ]


def test_a_publish_to_an_unreachable_broker_fails_within_the_retry_policy(tmp_path: Path) -> None:
    """kombu's retry is bounded: against a broker nobody listens on, ``publish`` raises within
    a few seconds (the relay then gives the rows back: tests/test_relay.py)."""
    script = textwrap.dedent("""
        import time
        from delivery.relay.claims import Claim
        from delivery.worker.publish import publish
        start = time.monotonic()
        try:
            publish([Claim(1, "k")])
        except Exception as exc:
            print("raised", type(exc).__name__, round(time.monotonic() - start, 2))
        else:
            print("published")
    """)
    env = dict(os.environ, DELIVERY_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.startswith("raised"), out.stdout + out.stderr
    assert float(out.stdout.split()[-1]) < 5.0, out.stdout
    assert time.monotonic() - started < 30


SITECUSTOMIZE = """
import os

from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_out = open(os.environ["PUBLISH_TEST_SPANS"], "a", buffering=1)
_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\\n")
    )
)
CeleryInstrumentor().instrument(tracer_provider=_provider)
"""


def test_an_opentelemetry_producer_span_is_the_parent_of_the_workers_span(
    outbox: Engine, stub: Any, tmp_path: Path
) -> None:
    """With ``opentelemetry-instrumentation-celery`` on both sides, the nudge's publish records
    a producer span, and the worker's consumer span for that message is its child (same
    trace). The worker is a real process, instrumented by a ``sitecustomize`` of its own and
    writing its spans to a file; it serves a queue of its own (a ``task_routes`` entry)."""
    pytest.importorskip("opentelemetry.instrumentation.celery")
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from delivery.testing.processes import worker

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    spans_file = tmp_path / "worker-spans.jsonl"
    env = dict(
        os.environ,
        DELIVERY_DATABASE_URL=PRIVATE_URL,
        PUBLISH_TEST_SPANS=str(spans_file),
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    )
    proc = worker(RUN_DIR / "worker-otel.log", env=env, name="otel", extra=("-Q", "pub-otel"))
    proc.start()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        routed = task_routes({"delivery.deliver": {"queue": "pub-otel"}})
        with routed, Session(outbox) as session, session.begin():
            delivery.enqueue(
                session, channel="sms", to=RECIPIENT, payload={"body": "x"}, key="pub-otel"
            )

        def consumer_spans() -> list[dict[str, Any]]:
            if not spans_file.exists():
                return []
            lines = spans_file.read_text().splitlines()
            spans = [json.loads(line) for line in lines if line.strip()]
            return [s for s in spans if s["name"] == "run/delivery.deliver"]

        wait_until(lambda: bool(consumer_spans()), timeout=60)
        with outbox.connect() as conn:
            wait_until(
                lambda: conn.scalar(text("SELECT status FROM delivery_messages")) == "sent",
                timeout=30,
            )
    finally:
        instrumentor.uninstrument()
        proc.stop()
    [producer] = [s for s in exporter.get_finished_spans() if s.name.startswith("apply_async/")]
    assert producer.name == "apply_async/delivery.deliver"
    assert producer.kind.name == "PRODUCER"
    assert producer.attributes is not None
    assert producer.attributes.get("messaging.message.id") == "pub-otel"
    # A busy machine may make the worker retry the task (a connect timeout is retryable): a
    # retry runs again under the same task id, published from inside the first run's span, so
    # every run is in the producer's trace and the first one is the producer's child.
    consumers = sorted(consumer_spans(), key=lambda span: span["start_time"])
    assert consumers and all(span["kind"] == "SpanKind.CONSUMER" for span in consumers)
    assert producer.context is not None
    trace_id = f"0x{producer.context.trace_id:032x}"
    assert {span["context"]["trace_id"] for span in consumers} == {trace_id}
    assert consumers[0]["parent_id"] == f"0x{producer.context.span_id:016x}"

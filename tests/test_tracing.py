"""Traces (``delivery.observability.tracing``, issue 28) in one process: off and free without
the ``[otel]`` extra or without an SDK; with one, the spans and events of each kind of move.

Each case that sets a tracer provider runs in a subprocess of its own: OpenTelemetry's global
provider is set once per process, and the suite's other tests run untraced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.observability import tracing

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, tmp_path: Path, **env: str) -> str:
    """Run ``script`` in a fresh interpreter with an SQLite outbox of its own; its stdout."""
    config = tmp_path / "delivery.toml"
    config.write_text('[providers.stub]\nkind = "http"\nbase_url = "http://127.0.0.1:9"\n')
    environ = {
        **os.environ,
        "DELIVERY_DATABASE_URL": f"sqlite:///{tmp_path / 'outbox.db'}",
        "DELIVERY_CONFIG": str(config),
        "PYTHONPATH": str(ROOT),
        **env,
    }
    for name in [n for n in environ if n.startswith("OTEL_")]:
        if name not in env:
            del environ[name]
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


PRELUDE = """
import sys
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import delivery
from delivery.runtime.db import upgrade
from delivery.runtime.current import get_settings

engine = create_engine(get_settings().database_url)
upgrade(engine)

def enqueue(key):
    with Session(engine) as session, session.begin():
        delivery.enqueue(session, channel="sms", to="+12015550123", payload={"body": "x"}, key=key)
    with engine.connect() as conn:
        query = text("SELECT traceparent FROM delivery_messages WHERE key = :k")
        return conn.scalar(query, {"k": key})
"""


def test_without_the_extra_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """With every ``opentelemetry`` import failing as it does when the extra is not installed,
    enqueue, a transition, an attempt's span calls and ``configure`` (asked by ``OTEL_*``)
    all work, and no module of OpenTelemetry is loaded."""
    script = """
    from types import SimpleNamespace
    from delivery.observability import events, tracing
    assert enqueue("no-otel") is None
    assert tracing.configure("delivery-worker") is False and not tracing.active()
    row = SimpleNamespace(id=1, key="no-otel", provider="stub", channel="sms", attempts=0)
    tracing.begin_attempts([row])
    with tracing.calling(1, "stub"):
        pass
    events.emit_moved(row, "dispatched", "sending")
    claim = SimpleNamespace(id=1, key="k", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    with tracing.publishing([claim], "delivery", "k") as h:
        assert h is None
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """
    out = run(
        "import delivery.testing.without_otel\n"
        + textwrap.dedent(PRELUDE)
        + textwrap.dedent(script),
        tmp_path,
        OTEL_TRACES_EXPORTER="otlp",
    )
    assert out.strip() == "[]"


def test_with_the_api_but_no_sdk_nothing_is_recorded_or_stored(
    session: Session, db_url: str
) -> None:
    """The extra installed, no tracer provider set (this test process): tracing is off, and
    an enqueue inside a (no-op) span stores no trace context."""
    from opentelemetry import trace

    assert not tracing.active()
    settings = load_settings()  # this test's outbox, passed: the process's settings untouched
    with trace.get_tracer("app").start_as_current_span("request"):
        message = delivery.enqueue(
            session, channel="sms", to="+12015550123", payload={"body": "x"}, settings=settings
        )
    session.commit()
    assert message.traceparent is None


SDK = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
"""


def test_spans_of_a_message_with_an_sdk(tmp_path: Path) -> None:
    """With an SDK: enqueue stores the current span's context; a task of one message is
    published in a span that is its child, a batch task in a span linking each, the relay's
    claims its events (no span of their own); an attempt's
    span opens at the take, is current while called, gets every move as an event and ends
    with the move out of ``sending`` (outcome, code; error status when ``dead``); a move
    outside an attempt (a receipt) is a ``status STATUS`` span of its own in the trace."""
    script = """
    from types import SimpleNamespace
    from opentelemetry.trace import StatusCode
    from delivery.observability import events, tracing

    with trace.get_tracer("shop").start_as_current_span("checkout") as checkout:
        parent = enqueue("one")
        other = enqueue("two")
    ids = checkout.get_span_context()
    assert parent.split("-")[1:3] == [f"{ids.trace_id:032x}", f"{ids.span_id:016x}"], parent

    claims = [SimpleNamespace(id=1, key="one", provider="stub", attempts=0, traceparent=parent),
              SimpleNamespace(id=2, key="two", provider="stub", attempts=0, traceparent=other)]
    with tracing.publishing(claims[:1], "delivery", "one") as headers:
        assert headers["traceparent"].split("-")[1] == f"{ids.trace_id:032x}"
    with tracing.publishing(claims, "delivery", "batch-1"):
        pass
    single, batch = exporter.get_finished_spans()[-2:]
    assert single.parent.span_id == ids.span_id and single.kind.name == "PRODUCER"
    assert batch.parent is None and len(batch.links) == 2
    assert batch.attributes["messaging.batch.message_count"] == 2
    claimed = [e.attributes["delivery.message.id"] for e in batch.events]
    assert claimed == [1, 2] and batch.events[0].attributes["delivery.status.to"] == "dispatched"
    before = len(exporter.get_finished_spans())
    events.emit_moved(claims[0], "pending", "dispatched")  # the claim: its publish span's event
    assert len(exporter.get_finished_spans()) == before

    def row(n, key, tp):
        return SimpleNamespace(id=n, key=key, provider="stub", channel="sms", attempts=0,
                               traceparent=tp, message_type=None)
    one, two = row(1, "one", parent), row(2, "two", other)
    tracing.begin_attempts([one, two])
    for r in (one, two):
        events.emit_moved(r, "dispatched", "sending")
    with tracing.calling(1, "stub"):
        assert trace.get_current_span().name == "deliver sms"
    events.emit(events.Transition(1, "one", "stub", "sending", "sent", 1, "delivered"))
    events.emit(events.Transition(2, "two", "stub", "sending", "dead", 1, "permanent", "21211"))
    sent, dead = exporter.get_finished_spans()[-2:]
    assert sent.name == "deliver sms" and sent.parent.span_id == ids.span_id
    assert sent.attributes["delivery.attempt"] == 1
    assert sent.attributes["delivery.outcome"] == "delivered"
    assert [e.attributes["delivery.status.to"] for e in sent.events] == ["sending", "sent"]
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.attributes["delivery.code"] == "21211"

    events.emit_moved(row(1, "one", parent), "sent", "delivered", "receipt")
    receipt = exporter.get_finished_spans()[-1]
    assert receipt.name == "status delivered" and receipt.parent.span_id == ids.span_id
    assert receipt.events[0].attributes["delivery.status.from"] == "sent"
    assert not tracing._open
    for span in exporter.get_finished_spans():
        values = [*span.attributes.values()]
        values += [v for e in span.events for v in e.attributes.values()]
        assert not [v for v in values if "2015550123" in str(v)], span
    print("ok")
    """
    out = run(textwrap.dedent(PRELUDE) + SDK + textwrap.dedent(script), tmp_path)
    assert out.strip() == "ok"


def test_configure_follows_the_otel_variables(tmp_path: Path) -> None:
    """``configure`` sets a provider when ``OTEL_*`` asks for traces and none is set yet, and
    leaves one that is set (``opentelemetry-instrument``'s) alone."""
    script = """
    import os
    from opentelemetry import trace
    from delivery.observability import tracing
    os.environ.pop("OTEL_TRACES_EXPORTER", None)
    assert tracing.configure("delivery-worker") is False  # nothing asked
    os.environ["OTEL_TRACES_EXPORTER"] = "none"
    assert tracing.configure("delivery-worker") is False
    os.environ["OTEL_TRACES_EXPORTER"] = "console"
    assert tracing.configure("delivery-worker") is True and tracing.active()
    assert trace.get_tracer_provider().resource.attributes["service.name"] == "delivery-worker"
    assert tracing.configure("delivery-worker") is False  # set already
    print("ok")
    """
    assert run(textwrap.dedent(script), tmp_path).strip() == "ok"

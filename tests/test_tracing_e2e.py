"""One trace per message (issue 28), end to end: the app, beat and a worker (prefork: the SDK
is set up before the pool forks) as real processes, each exporting its spans over OTLP/HTTP
(``OTEL_EXPORTER_OTLP_ENDPOINT``) to a collector this test serves on 127.0.0.1. The app opens
a span, enqueues one message in it and commits; the stub provider takes the first request's
effect and closes the connection unanswered (a lost answer: ``unknown``), and the ``retry``
policy sends it again with the same key, which the stub answers from what it stored.

Checked: every span of the message (the app's, the relay's publish, both attempts and the HTTP
calls under them, recorded by ``opentelemetry-instrumentation-httpx`` in the worker's
``sitecustomize``) is in the app span's trace; the attempts are ``deliver sms`` spans
numbered 1 and 2 with their provider, key, outcome and status-change events; and no attribute,
event or log line of any process holds the recipient or the payload.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from sqlalchemy import text

from delivery.testing.processes import beat, start_all, stop_all, stub_provider, worker
from delivery.testing.stub_provider import StubClient
from tests.conftest import free_port, own_outbox, wait_until
from tests.provider_stubs import QuietHTTPServer

pytestmark = pytest.mark.integration

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

RECIPIENT = "+12015550123"
BODY = "your code is 418302"
KEY = "trace-e2e-1"

TOML = """
[delivery]
relay_interval = 0.2
sweep_interval = 0.5

[providers.stub]
kind = "http"
base_url = "http://127.0.0.1:{stub}"

[channels.sms]
provider = "stub"
on_unknown = "retry"
"""

APP = """
import os, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import delivery

provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
engine = create_engine(os.environ["DELIVERY_DATABASE_URL"])
with trace.get_tracer("shop").start_as_current_span("checkout"):
    with Session(engine) as session, session.begin():
        delivery.enqueue(
            session, channel="sms", to=sys.argv[1], payload={"body": sys.argv[2]}, key=sys.argv[3]
        )
provider.shutdown()
"""


#: The worker's ``sitecustomize``: httpx instrumented as a user would, unchanged.
SITECUSTOMIZE = """
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

HTTPXClientInstrumentor().instrument()
"""


class Collector:
    """An OTLP/HTTP trace endpoint: every span exported to it, as plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.add(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = QuietHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, path: str, body: bytes) -> None:
        assert path == "/v1/traces", path
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.raw.append(body)
            for resource in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(_span(span, service.get("service.name", "")))

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _span(span: Any, service: str) -> dict[str, Any]:
    return {
        "service": service,
        "name": span.name,
        "kind": span.kind,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_id": span.parent_span_id.hex(),
        "start": span.start_time_unix_nano,
        "attributes": {a.key: _value(a.value) for a in span.attributes},
        "events": [
            {"name": e.name, "attributes": {a.key: _value(a.value) for a in e.attributes}}
            for e in span.events
        ],
        "links": [link.trace_id.hex() for link in span.links],
        "status": span.status.code,
    }


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, redis_client: Any) -> Iterator[Any]:
    run = tmp_path_factory.mktemp("tracing")
    collector = Collector()
    stub_port = free_port()
    config = run / "tracing.toml"
    config.write_text(TOML.format(stub=stub_port))
    redis_client.flushdb()
    procs = []
    with own_outbox("tracing", run, config) as (engine, env):
        site = run / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        worker_env = {
            **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
        }
        try:
            procs = start_all(
                [
                    stub_provider(run / "stub.log", stub_port),
                    worker(run / "worker.log", env=worker_env, pool="prefork", concurrency=2),
                    beat(run / "beat.log", run / "beat-schedule", env=env),
                ]
            )
            with StubClient(f"http://127.0.0.1:{stub_port}") as stub:
                answer = {"id": "msg_trace_e2e", "status": "accepted"}
                stub.set_faults(rules={RECIPIENT: {"status": 201, "json": answer, "drop": True}})
                app = subprocess.run(
                    [sys.executable, "-c", textwrap.dedent(APP), RECIPIENT, BODY, KEY],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert app.returncode == 0, app.stderr
                with engine.connect() as conn:
                    wait_until(
                        lambda: conn.scalar(text("SELECT status FROM delivery_messages")) == "sent",
                        timeout=60,
                    )
                # the worker's last attempt span ends with the move to sent; then it exports
                wait_until(lambda: len(collector.named("deliver ")) >= 2, timeout=30)
                logs = [app.stdout + app.stderr] + [p.output() for p in procs]
                yield collector, logs, stub
        finally:
            stop_all(procs[::-1])
            collector.server.shutdown()
            redis_client.flushdb()


def test_one_trace_from_the_apps_span_to_both_attempts(traced: Any) -> None:
    collector, _, stub = traced
    [checkout] = collector.named("checkout")
    trace_id = checkout["trace_id"]
    attempts = sorted(collector.named("deliver "), key=lambda s: s["start"])
    assert [a["name"] for a in attempts] == ["deliver sms", "deliver sms"], attempts
    assert {a["trace_id"] for a in attempts} == {trace_id}
    assert {a["service"] for a in attempts} == {"delivery-worker"}
    for number, attempt in enumerate(attempts, 1):
        attributes = attempt["attributes"]
        assert attributes["delivery.attempt"] == number
        assert attributes["delivery.idempotency_key"] == KEY
        assert attributes["delivery.provider"] == "stub"
        assert attributes["messaging.operation.type"] == "process"
        assert attempt["parent_id"] == checkout["span_id"]  # the span that called enqueue
    # httpx's own span (opentelemetry-instrumentation-httpx, unchanged) is each one's child
    calls = [s for s in collector.spans if s["name"] == "POST" and s["trace_id"] == trace_id]
    assert sorted(c["parent_id"] for c in calls) == sorted(a["span_id"] for a in attempts)
    first, second = attempts
    assert first["attributes"]["delivery.outcome"] == "unknown"
    assert second["attributes"]["delivery.outcome"] == "delivered"
    moves = [
        (e["attributes"]["delivery.status.from"], e["attributes"]["delivery.status.to"])
        for e in second["events"]
    ]
    assert moves == [("dispatched", "sending"), ("sending", "sent")]
    assert ("dispatched", "sending") in [
        (e["attributes"]["delivery.status.from"], e["attributes"]["delivery.status.to"])
        for e in first["events"]
    ]
    # the relay's publish (this app installs no nudge): a producer span in beat, in the trace
    # as the enqueue span's child, though it ended before the relay ran
    [send] = [s for s in collector.named("send ") if s["trace_id"] == trace_id]
    assert (send["service"], send["name"], send["parent_id"]) == (
        "delivery-beat",
        "send delivery",
        checkout["span_id"],
    )
    assert send["attributes"]["messaging.message.id"] == KEY  # the task id
    # the first attempt's move out of sending, outside it or not, is an event of the trace
    trace_events = {
        e["attributes"]["delivery.status.to"]
        for s in collector.spans
        if s["trace_id"] == trace_id
        for e in s["events"]
        if e["name"] == "delivery.status"
    }
    assert {"sending", "sent"} <= trace_events
    assert stub.effects()[KEY] == 1  # one effect: the retry was answered from the stored one


def test_no_recipient_or_payload_in_spans_events_or_logs(traced: Any) -> None:
    collector, logs, _ = traced
    secrets = (RECIPIENT, RECIPIENT[1:], BODY)
    for body in collector.raw:
        for secret in secrets:
            assert secret.encode() not in body
    for log in logs:
        for secret in secrets:
            assert secret not in log


def test_the_workers_log_lines_carry_the_trace(traced: Any) -> None:
    collector, logs, _ = traced
    [checkout] = collector.named("checkout")
    lines = [
        json.loads(line[line.index("{") :])
        for log in logs
        for line in log.splitlines()
        if '"event": "transition"' in line and KEY in line
    ]
    assert lines
    sending = [entry for entry in lines if entry["to_status"] in ("sending", "sent", "unknown")]
    assert sending and all(entry["trace_id"] == checkout["trace_id"] for entry in sending)
    assert all("span_id" in entry for entry in sending)
    assert "traceparent" not in lines[0]

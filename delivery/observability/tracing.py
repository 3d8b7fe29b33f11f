"""OpenTelemetry traces: one trace per message, from the span that called ``enqueue`` to the
provider's answer (docs/operations.md, "Traces").

Off unless the ``[otel]`` extra is installed *and* a tracer provider is set: without the extra
nothing of OpenTelemetry is ever imported (``active`` answers False without trying twice);
with it but no SDK configured, every function here returns at its first check. The SDK is
configured as usual by the app (the standard ``OTEL_*`` variables), and by ``configure`` in
delivery's own processes (worker, beat, receiver).

- ``traceparent``: the current span's W3C ``traceparent``, which ``enqueue`` stores on the row
  (``delivery_messages.traceparent``): the message's trace outlives the request that made it.
- ``publishing``: the relay's and the nudge's ``send QUEUE`` span (PRODUCER) around one task's
  ``apply_async``, and the headers that carry it (Celery's own message headers, where
  ``opentelemetry-instrumentation-celery`` puts its context too). A task of one message is
  the child of that message's context; a batch task links every message's. The relay's claim
  of each message is an event of this span.
- ``begin_attempts`` / ``calling`` / ``end_attempts``: one ``deliver CHANNEL`` span
  (CONSUMER) per attempt, child of the message's context, from the take until the move that
  ends it; current while the provider is called, so an HTTP client's span
  (``opentelemetry-instrumentation-httpx``) is its child. Attributes: message id, key,
  provider, attempt number, outcome and code, never the recipient or the payload.
- ``on_transition``: every status change is an event (``delivery.status``) of the message's
  open attempt span, of its publish span (the relay's claim) or, outside both (the sweeper,
  a receipt, an operator's repair), of a short ``status STATUS`` span in the message's
  trace. A message that
  ends ``dead`` sets its span's status to error.
- ``log_ids``: the ``trace_id`` and ``span_id`` that a transition's JSON log line carries;
  ``trace_id``: the trace id of a stored ``traceparent`` (``delivery show``, the console).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ATTEMPT_EVENT",
    "active",
    "begin_attempts",
    "calling",
    "configure",
    "end_attempts",
    "flush",
    "log_ids",
    "on_transition",
    "publishing",
    "trace_id",
    "traceparent",
]

ATTEMPT_EVENT = "delivery.status"
"""The name of the span event of every status change."""

_api: Any = None  # ``opentelemetry.trace`` once imported; False: the extra is not installed
_open: dict[int, Span] = {}  # each message's attempt span, from its take to its end
_lock = threading.Lock()


def _trace() -> Any:
    """``opentelemetry.trace``, imported on first use; False without the extra."""
    global _api
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
        else:
            _api = trace
    return _api


def active() -> bool:
    """Whether spans are recorded: the extra is installed and a tracer provider is set."""
    trace = _trace()
    return bool(trace) and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@functools.cache
def _tracer() -> Tracer:
    """delivery's tracer, asked for once ``active`` (the global provider is set only once)."""
    return _trace().get_tracer("delivery")  # type: ignore[no-any-return]


def _context(parent: str | None) -> Any:
    """The context of a stored ``traceparent`` (None: a new trace)."""
    if not parent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": parent})


def _span_context(parent: str | None) -> Any:
    context = _context(parent)
    return None if context is None else _trace().get_current_span(context).get_span_context()


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``, if a span is being recorded (``enqueue``)."""
    if not active():
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)  # nothing without a valid current span
    return carrier.get("traceparent")


@contextmanager
def publishing(claims: Sequence[Any], queue: str | None, task_id: str) -> Iterator[Any]:
    """The ``send QUEUE`` span of one task carrying ``claims`` (each with the message's
    ``id``, ``key`` and stored ``traceparent``), current inside the block, with the relay's
    claim of each (``pending`` -> ``dispatched``) as its event; yields the headers to publish
    the task with (None when not tracing)."""
    parents = [claim.traceparent for claim in claims]
    if not active() or not any(parents):
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import Link, SpanKind

    destination = queue or "routed"
    attributes: dict[str, Any] = {
        "messaging.system": "celery",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": destination,
        "messaging.message.id": task_id,
    }
    if len(parents) == 1:
        context, links = _context(parents[0]), []
    else:
        context = None
        links = [Link(c) for c in (_span_context(p) for p in parents if p) if c is not None]
        attributes["messaging.batch.message_count"] = len(parents)
    span = _tracer().start_span(
        f"send {destination}", context, SpanKind.PRODUCER, attributes, links
    )
    for claim in claims:
        claimed = {"delivery.status.from": "pending", "delivery.status.to": "dispatched"}
        span.add_event(ATTEMPT_EVENT, {**claimed, "delivery.message.id": claim.id})
    with _trace().use_span(span, end_on_exit=True):
        headers: dict[str, str] = {}
        propagate.inject(headers)
        yield headers


def begin_attempts(rows: Iterable[Any]) -> None:
    """Open the attempt span of each row just taken (``id``, ``key``, ``provider``,
    ``channel``, ``attempts`` as read before the take, ``traceparent``)."""
    if not active():
        return
    from opentelemetry.trace import SpanKind

    tracer = _tracer()
    for row in rows:
        attributes = {
            "messaging.system": "celery",
            "messaging.operation.type": "process",
            "messaging.operation.name": "deliver",
            "messaging.message.id": str(row.id),
            "delivery.message.id": row.id,
            "delivery.idempotency_key": row.key,
            "delivery.provider": row.provider,
            "delivery.channel": row.channel,
            "delivery.attempt": row.attempts + 1,
        }
        parent = _context(getattr(row, "traceparent", None))
        span = tracer.start_span(f"deliver {row.channel}", parent, SpanKind.CONSUMER, attributes)
        with _lock:
            old = _open.pop(row.id, None)
            _open[row.id] = span
        if old is not None:
            old.end()


@contextmanager
def calling(message_id: int, provider: str) -> Iterator[None]:
    """Make the message's attempt span current while its provider (``provider``, the one the
    call goes to) is called; an exception is recorded on it."""
    span = _open.get(message_id) if _open else None
    if span is None:
        yield
        return
    span.set_attribute("delivery.provider", provider)
    try:
        with _trace().use_span(span, end_on_exit=False, record_exception=True):
            yield
    except BaseException:
        end_attempts([message_id], "the call raised")
        raise


def end_attempts(message_ids: Iterable[int], reason: str | None = None) -> None:
    """End the attempt spans still open of ``message_ids`` (their move did not happen: a
    fenced UPDATE that found the row moved, a row someone else took; ``reason`` says so)."""
    if not _open:
        return
    for message_id in message_ids:
        with _lock:
            span = _open.pop(message_id, None)
        if span is not None:
            if reason:
                span.set_attribute("delivery.skipped", reason)
            span.end()


def on_transition(transition: Any) -> None:
    """Called by ``events.emit`` with each ``Transition``: the change as an event of the
    message's attempt span (ended once the message leaves ``sending``), else of a ``status
    STATUS`` span of its own (but the relay's claim: ``_claimed``)."""
    span = _open.get(transition.message_id) if _open else None
    if span is None:
        if not transition.traceparent or not active() or _claimed(transition):
            return
        span = _tracer().start_span(
            f"status {transition.to_status}",
            _context(transition.traceparent),
            attributes={
                "delivery.message.id": transition.message_id,
                "delivery.idempotency_key": transition.key,
                "delivery.provider": transition.to_provider or transition.provider,
            },
        )
        _event(span, transition)
        span.end()
        return
    _event(span, transition)
    if transition.to_status != "sending":  # the attempt's end: what the provider answered
        if transition.outcome is not None:
            span.set_attribute("delivery.outcome", transition.outcome)
        if transition.code is not None:
            span.set_attribute("delivery.code", transition.code)
        end_attempts([transition.message_id])


def _claimed(transition: Any) -> bool:
    """The relay's claim, an event of the publish span that follows it (``publishing``): a
    span of its own per row would be thousands at once, more than a batch span processor's
    queue holds (2,048), and would push out the attempts' spans."""
    return bool(transition.from_status == "pending" and transition.to_status == "dispatched")


def _event(span: Span, transition: Any) -> None:
    attributes: dict[str, Any] = {
        "delivery.status.from": transition.from_status,
        "delivery.status.to": transition.to_status,
    }
    for name, value in (
        ("delivery.outcome", transition.outcome),
        ("delivery.code", transition.code),
        ("delivery.provider.to", transition.to_provider),
    ):
        if value is not None:
            attributes[name] = value
    span.add_event(ATTEMPT_EVENT, attributes)
    if transition.to_status == "dead":
        from opentelemetry.trace import StatusCode

        span.set_status(StatusCode.ERROR, f"dead: {transition.code or 'no code'}")


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a stored W3C ``traceparent`` (``00-TRACE-SPAN-FLAGS``): 32 lowercase
    hex digits, or None. Plain text, so that ``delivery show`` and the console read it
    without the extra."""
    parts = (traceparent or "").split("-")
    trace = parts[1] if len(parts) == 4 else ""
    return trace if len(trace) == 32 and all(c in "0123456789abcdef" for c in trace) else None


def log_ids(message_id: int, parent: str | None) -> Mapping[str, str]:
    """``trace_id`` and ``span_id`` for a transition's log line: its attempt span's, else its
    stored trace's (with the current span's id when that is in the same trace)."""
    trace = _trace()
    span = _open.get(message_id) if _open else None
    if span is not None:
        context = span.get_span_context()
        return {
            "trace_id": trace.format_trace_id(context.trace_id),
            "span_id": trace.format_span_id(context.span_id),
        }
    stored = trace_id(parent)
    if stored is None:
        return {}
    current = trace.get_current_span().get_span_context()
    if current.is_valid and trace.format_trace_id(current.trace_id) == stored:
        return {"trace_id": stored, "span_id": trace.format_span_id(current.span_id)}
    return {"trace_id": stored}


#: ``OTEL_TRACES_EXPORTER`` values ``configure`` sets up (``none``: tracing stays off).
_EXPORTERS = ("otlp", "console")


def configure(service_name: str) -> bool:
    """Set up the OpenTelemetry SDK in one of delivery's processes from the standard ``OTEL_*``
    variables, when they ask for traces (``OTEL_TRACES_EXPORTER`` = ``otlp`` or ``console``,
    or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``..._TRACES_ENDPOINT``) and no tracer provider is
    set yet (``opentelemetry-instrument`` sets its own): spans go through a batch processor
    to OTLP over HTTP (``[otel]``) or to stdout. ``service_name`` unless
    ``OTEL_SERVICE_NAME`` names it. True if it set a provider."""
    env = os.environ
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter not in _EXPORTERS and not (endpoint and not exporter):
        return False
    trace = _trace()
    if not trace or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter == "console":
        span_exporter: Any = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
    name = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(name))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    return True


def flush() -> None:
    """Export the spans still buffered (a process about to exit)."""
    trace = _trace()
    provider = trace.get_tracer_provider() if trace else None
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(5000)

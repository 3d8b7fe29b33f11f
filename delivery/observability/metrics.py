"""Prometheus metrics: the outbox read on each scrape, and counters fed by the hooks.

Two sources, because they live in different processes: ``OutboxCollector`` (served by
``delivery metrics``) queries the database and the shared breakers on every scrape, so its
numbers are the truth whatever process wrote them; ``WorkerMetrics`` (served by each worker,
``delivery.worker.metrics``) counts what happens in the process that does it, fed by
``observe_transition`` (an ``events.add_hook``) and ``observe_breaker`` (a
``guards.breaker.add_breaker_hook``). The metrics are listed in
[docs/operations.md](../../docs/operations.md#metrics-and-alerts); with
``PROMETHEUS_MULTIPROC_DIR``, ``multiprocess_registry`` sums every process's files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from delivery import ops
from delivery.core.models import utcnow
from delivery.core.status import Status
from delivery.guards.breaker import Breakers, BreakerTransition
from delivery.observability.events import Transition

__all__ = [
    "BREAKER_STATES",
    "LATENCY_BUCKETS",
    "OutboxCollector",
    "WorkerMetrics",
    "breaker_reader",
    "exporter_registry",
    "multiprocess_registry",
    "served_registry",
]

log = logging.getLogger("delivery.metrics")

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
"""``delivery_breaker_state`` values."""

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600, 14400)
"""Send latency buckets (seconds): a retried message legitimately takes minutes."""

_BATCH_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)

BreakerReader = Callable[[], Mapping[str, tuple[str, int]]]
"""Returns provider -> (state, failures in window) from the shared store, or ``{}``."""


class OutboxCollector(Collector):
    """Reads the outbox (and the breakers) on every scrape; never raises into the exporter.

    A failing database yields ``delivery_outbox_up 0`` and nothing else from it.
    """

    def __init__(self, engine: Engine, breakers: BreakerReader | None = None) -> None:
        self.engine = engine
        self.breakers = breakers

    def describe(self) -> Iterable[Metric]:
        return []  # collected on demand: never query the database at registration

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("delivery_outbox_up", "1 if the last scrape read the outbox.")
        try:
            families = self._outbox()
        except Exception:
            log.exception("metrics: reading the outbox failed")
            up.add_metric([], 0)
            families = []
        else:
            up.add_metric([], 1)
        yield up
        yield from families
        yield from self._breakers()

    def _outbox(self) -> list[Metric]:
        now = utcnow()
        messages = GaugeMetricFamily(
            "delivery_messages",
            "Messages in the outbox by provider and status.",
            labels=["provider", "status"],
        )
        dead = GaugeMetricFamily(
            "delivery_dead_letter_messages",
            "Dead messages (the dead-letter queue) by provider; `delivery redrive` empties it.",
            labels=["provider"],
        )
        with Session(self.engine) as session:
            by_provider = ops.stats_by_provider(session)
            oldest = ops.oldest_pending_age(session, now=now)
            lag = ops.relay_lag(session, now=now)
            ahead = ops.days_ahead(session)
        for provider, counts in by_provider.items():
            for status, count in counts.items():
                messages.add_metric([provider, status], count)
            dead.add_metric([provider], counts[Status.DEAD.value])
        oldest_gauge = GaugeMetricFamily(
            "delivery_oldest_pending_age_seconds",
            "Seconds since the oldest open (pending, dispatched, sending) message was "
            "enqueued; 0 when none.",
            value=oldest or 0.0,
        )
        lag_gauge = GaugeMetricFamily(
            "delivery_relay_lag_seconds",
            "Seconds the most overdue pending message has waited for the relay; 0 when none.",
            value=lag,
        )
        families: list[Metric] = [messages, dead, oldest_gauge, lag_gauge]
        if ahead is not None:  # a partitioned outbox (PostgreSQL)
            families.append(
                GaugeMetricFamily(
                    "delivery_partition_days_ahead",
                    "Days after today whose partitions exist (beat keeps 7); at -1 enqueue "
                    "fails: run `delivery db partition`.",
                    value=ahead,
                )
            )
        return families

    def _breakers(self) -> list[Metric]:
        if self.breakers is None:
            return []
        try:
            found = self.breakers()
        except Exception:
            log.exception("metrics: reading the breakers failed")
            return []
        state = GaugeMetricFamily(
            "delivery_breaker_state",
            "Circuit breaker per provider: 0 closed, 1 half-open, 2 open.",
            labels=["provider"],
        )
        failures = GaugeMetricFamily(
            "delivery_breaker_failures",
            "Transient failures inside the breaker's rolling window.",
            labels=["provider"],
        )
        for provider, (name, count) in sorted(found.items()):
            if name in BREAKER_STATES:
                state.add_metric([provider], BREAKER_STATES[name])
                failures.add_metric([provider], count)
        return [state, failures]


class WorkerMetrics:
    """Counters and histograms fed by the transition and breaker hooks of one process.

    The send latency is timed from the ``enqueued_at`` the sender puts on a ``sent``
    transition (no query per message). Hooks must not fail a send, and these do not raise.
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.attempts = Counter(
            "delivery_attempts",
            "Provider calls by outcome class (delivered, retryable, permanent, unknown, "
            "found, lookup_failed, undeliverable) and provider.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.transitions = Counter(
            "delivery_transitions",
            "Message state transitions.",
            ["provider", "from_status", "to_status", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "delivery_send_latency_seconds",
            "Enqueue to provider accept (created_at -> sent_at) of sent messages.",
            ["provider"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.relay_batch = Histogram(
            "delivery_relay_batch_size",
            "Messages published by one relay run.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.failovers = Counter(
            "delivery_failovers",
            "Messages moved to the next provider of their route, by channel, the provider they "
            "left and the one they moved to, and why (circuit_open, rate_limited, unavailable).",
            ["channel", "from", "to", "reason"],
            registry=registry,
        )
        self.breaker_transitions = Counter(
            "delivery_breaker_transitions",
            "Circuit breaker transitions by provider (half_open -> open is a failed probe).",
            ["provider", "from_state", "to_state"],
            registry=registry,
        )
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: prometheus_client takes a lock and checks the
        labels on every call (a hot frame on the worker's batch path)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_transition(self, transition: Transition) -> None:
        """A transition hook (``add_hook``): count it; time a send from enqueue when it is sent."""
        provider = transition.provider
        self._child(
            self.transitions,
            provider,
            str(transition.from_status),
            str(transition.to_status),
            transition.outcome or "",
        ).inc()
        if transition.from_status == Status.SENDING and transition.outcome:
            self._child(self.attempts, provider, transition.outcome).inc()
        if transition.to_provider is not None:
            self._child(
                self.failovers,
                transition.channel or "",
                provider,
                transition.to_provider,
                transition.code or "",
            ).inc()
        if (
            transition.to_status == Status.SENT
            and transition.from_status == Status.SENDING
            and transition.enqueued_at is not None
        ):
            seconds = (utcnow() - transition.enqueued_at).total_seconds()
            self._child(self.latency, provider).observe(max(seconds, 0.0))

    def observe_breaker(self, transition: BreakerTransition) -> None:
        """A breaker hook (``add_breaker_hook``): count the transition."""
        self.breaker_transitions.labels(
            transition.provider, transition.from_state, transition.to_state
        ).inc()

    def observe_relay(self, published: int) -> None:
        """One relay run published ``published`` messages."""
        self.relay_batch.observe(published)


def breaker_reader(breakers: Breakers) -> BreakerReader:
    """Read every configured provider's breaker from the shared Redis (a peek: it changes
    nothing). Providers whose state could not be read from Redis are left out: a process's
    local fallback state says nothing about the workers'."""

    def read() -> dict[str, tuple[str, int]]:
        found: dict[str, tuple[str, int]] = {}
        for name in breakers.settings.providers:
            status = breakers.get(name).status()
            if status.source == "redis":
                found[name] = (status.state, status.failures)
        return found

    return read


def exporter_registry(engine: Engine, breakers: BreakerReader | None = None) -> CollectorRegistry:
    """The registry ``delivery metrics`` serves: the outbox collector only."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector(engine, breakers))
    return registry


def served_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """What a process serves at ``/metrics``: ``registry`` as it is, or, under
    ``PROMETHEUS_MULTIPROC_DIR``, the sum of every process's files (its metrics included)."""
    return multiprocess_registry() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else registry


def multiprocess_registry() -> CollectorRegistry:
    """A registry summing every process's files in ``PROMETHEUS_MULTIPROC_DIR``."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        raise RuntimeError("PROMETHEUS_MULTIPROC_DIR is not set")
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return registry

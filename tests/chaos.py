"""The chaos scenarios of issue 3: each enqueues N messages on a private cluster
(``tests/chaos_cluster.py``), injects one fault while apps keep enqueueing, waits until nothing
is open, and measures what guarantees G1-G5 promise:

- **lost**: a message with no row, a row still open when the run gave up waiting, or a row
  ``sent`` whose key the provider never saw;
- **duplicates**: keys with more than one effect at the provider (``stub.effects()``);
- the final statuses, and each scenario's own check (the fault was really injected; no request
  came earlier than its Retry-After; ...).

Each scenario is a function ``(cluster, n, broker) -> Report``; a report lists its
``failures`` (empty when every guarantee held). ``tests/test_chaos.py`` asserts on reports at
N = 200 (100 for the lost-answer scenarios); ``bench/chaos.py`` runs the same functions at a
larger N and writes
``bench/RELIABILITY.md`` from them.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from delivery.config.settings import Settings
from delivery.core.models import utcnow
from delivery.core.status import FINAL
from tests.chaos_cluster import (
    ChaosConfig,
    Cluster,
    Feeder,
    Pipeline,
    campaign_size,
    overrides,
    wait_until,
)

__all__ = ["BATCH_DONE", "SCENARIOS", "Report", "Scenario"]

DRAIN_TIMEOUT = 180.0
#: ``[delivery] max_attempts`` as shipped, for the scenarios that must hold with it.
PRODUCT_MAX_ATTEMPTS: int = Settings.__dataclass_fields__["max_attempts"].default
# Fewer worker threads and a slower provider: tasks queue up in the broker, so that losing
# the broker's contents loses many of them.
BACKLOG = ChaosConfig(concurrency=4)


@dataclass
class Report:
    """What one scenario run measured. ``failures`` is empty when every guarantee held."""

    scenario: str
    title: str
    broker: str
    messages: int
    faults: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicates: int = 0
    drain_s: float | None = None
    recovery_s: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def check(self, condition: bool, failure: str) -> None:
        if not condition:
            self.failures.append(failure)

    def summary(self) -> str:
        return (
            f"[{self.scenario} on {self.broker}] {self.messages} messages, faults: {self.faults}; "
            f"statuses {self.statuses}, lost {self.lost}, duplicates {self.duplicates}, "
            f"drain {self.drain_s} s, recovery {self.recovery_s} s, figures {self.figures}; "
            f"failures: {self.failures or 'none'}"
        )


class Run:
    """One scenario run on a started pipeline: a clock, the feeder, and the final measures."""

    def __init__(
        self,
        cluster: Cluster,
        pipe: Pipeline,
        settings: Settings,
        report: Report,
    ) -> None:
        self.cluster, self.pipe, self.settings, self.report = cluster, pipe, settings, report
        changed = overrides(pipe.config)
        if changed:
            report.figures["settings"] = changed
        self.t0 = time.monotonic()
        self.fault_over: float | None = None
        self.feeder: Feeder | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def at(self, seconds: float) -> None:
        """Sleep until ``seconds`` after the run started."""
        time.sleep(max(0.0, self.t0 + seconds - time.monotonic()))

    def feed(self, duration: float, options: Callable[[int], dict[str, Any]] | None = None) -> None:
        prefix = f"{self.report.scenario}-{self.report.broker}"
        self.feeder = Feeder(
            self.cluster.db,
            self.settings,
            prefix,
            self.report.messages,
            duration,
            options=options or (lambda i: {}),
            campaign=campaign_size(self.report.messages),
        ).start()

    def recovered(self) -> None:
        """Mark the moment the fault was switched off (for the recovery time)."""
        self.fault_over = time.monotonic()

    def finish(
        self,
        expect: Callable[[Mapping[str, str]], list[str]],
        timeout: float = DRAIN_TIMEOUT,
    ) -> Report:
        """Wait until nothing is open, then measure lost, duplicates and statuses."""
        assert self.feeder is not None
        self.feeder.join()
        report = self.report
        drained, _ = self.cluster.wait_final(report.messages, timeout)
        end = time.monotonic()
        if drained:
            report.drain_s = round(end - self.t0, 1)
            if self.fault_over is not None:
                report.recovery_s = round(end - self.fault_over, 1)
        with self.cluster.db.connect() as conn:
            rows = dict(conn.execute(text("SELECT key, status FROM delivery_messages")).all())
        effects = self.cluster.stub.effects()
        keys = self.feeder.keys
        report.statuses = dict(sorted(_count(rows.values()).items()))
        missing = [k for k in keys if k not in rows]
        still_open = [k for k, s in rows.items() if s not in FINAL]
        sent_unseen = [k for k, s in rows.items() if s == "sent" and not effects.get(k)]
        doubled = {k: n for k, n in effects.items() if n > 1}
        strangers = sorted(set(effects) - set(keys))
        report.lost = len(missing) + len(still_open) + len(sent_unseen)
        report.duplicates = len(doubled)
        report.check(len(keys) == report.messages, f"only {len(keys)} messages were enqueued")
        report.check(drained, f"not drained within {timeout:g} s: {report.statuses}")
        report.check(not missing, f"{len(missing)} enqueued keys have no row: {missing[:5]}")
        report.check(not sent_unseen, f"{len(sent_unseen)} sent but unseen: {sent_unseen[:5]}")
        report.check(not doubled, f"{len(doubled)} keys with several effects: {_first(doubled)}")
        report.check(not strangers, f"effects for keys never enqueued: {strangers[:5]}")
        report.failures.extend(expect(rows))
        return report


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return dict(counts)


def _first(mapping: Mapping[str, int], n: int = 5) -> dict[str, int]:
    return dict(list(mapping.items())[:n])


def all_sent(rows: Mapping[str, str]) -> list[str]:
    other = _count(s for s in rows.values() if s != "sent")
    return [f"expected every message sent, also got {other}"] if other else []


def _attempts(cluster: Cluster, where: str) -> int:
    return int(cluster.scalar(f"SELECT count(*) FROM delivery_attempts WHERE {where}") or 0)


def _queued_deliveries(client: Any) -> int:
    """``delivery.deliver`` tasks waiting in the Redis broker's queue (beat's relay and sweep
    tasks share the queue and are not counted)."""
    count = 0
    for raw in client.lrange("delivery", 0, -1):
        if json.loads(raw).get("headers", {}).get("task") == "delivery.deliver":
            count += 1
    return count


def _in_flight(cluster: Cluster, since: dt.datetime) -> int:
    sql = "SELECT count(*) FROM delivery_messages WHERE status = 'sending' AND updated_at >= :t"
    return int(cluster.scalar(sql, t=since) or 0)


BATCH_DONE = r"delivery\.deliver_batch\[[^\]]*\] succeeded in [\d.]+s: '([^']*)'"


def _log_sum(pipe: Pipeline, pattern: str) -> int:
    return sum(int(m) for m in re.findall(pattern, pipe.logs_text()))


def _pipeline_figures(run: Run) -> None:
    """Figures every scenario reports: attempts by outcome, and rows the sweeper recovered."""
    cluster, report = run.cluster, run.report
    with cluster.db.connect() as conn:
        outcomes = dict(
            conn.execute(
                text("SELECT outcome, count(*) FROM delivery_attempts GROUP BY outcome")
            ).all()
        )
        twice = conn.execute(
            text(
                "SELECT m.key, string_agg(a.number || ' ' || a.outcome || ' at '"
                " || to_char(a.started_at, 'MI:SS.MS') || ' ' || round(a.latency_ms) || ' ms',"
                " ', ' ORDER BY a.id) FROM delivery_attempts a"
                " JOIN delivery_messages m ON m.id = a.message_id GROUP BY m.key"
                " HAVING count(*) FILTER (WHERE a.outcome IN ('delivered', 'found')) > 1"
            )
        ).all()
    report.figures["attempts"] = dict(sorted(outcomes.items()))
    # A message the provider accepted is final: a second accepted attempt is a send too many.
    report.check(not twice, f"{len(twice)} messages accepted twice: {dict(twice[:5])}")
    report.figures["requeued_by_sweeper"] = _log_sum(run.pipe, r"'requeued': (\d+)")
    # A batch task's result counts its messages by answer ("48 sent, 2 retried").
    batches = re.findall(BATCH_DONE, run.pipe.logs_text())
    report.figures["batch_tasks"] = len(batches)
    report.figures["in_batches"] = sum(int(n) for b in batches for n in re.findall(r"\d+", b))
    # Half of every run is enqueued as campaigns: the batch path must have met the fault too.
    report.check(bool(batches), "no deliver_batch task ran: the batch path was not driven")


# ---------------------------------------------------------------------------------------------
# The scenarios


def _feed_time(n: int, rate: float = 40.0, least: float = 0.0) -> float:
    return max(least, n / rate)


def lost_responses(cluster: Cluster, n: int, broker: str = "redis") -> Report:
    """1. The proxy forwards every request but swallows 30% of the answers (the provider has
    acted; the worker times out): every message ends sent, one effect per key."""
    report = Report("lost-responses", "30% of responses lost after accept", broker, n)
    with cluster.pipeline(report.scenario, broker, ChaosConfig()) as (pipe, settings):
        cluster.proxy.set(blackhole_rate=0.3)
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n))
        run.finish(all_sent)
        stats = cluster.proxy.stats()
        replays = sum(1 for r in cluster.stub.requests() if r["outcome"] == "replay")
        report.faults = (
            f"{stats.blackholed} of {stats.exchanges} answers swallowed by the proxy "
            f"({stats.blackholed / max(stats.exchanges, 1):.0%})"
        )
        report.figures["provider_replays"] = replays
        _pipeline_figures(run)
        report.check(stats.blackholed > 0, "no answer was swallowed: the fault never hit")
        report.check(replays > 0, "no resend was deduplicated by the provider")
    return report


def worker_killed(cluster: Cluster, n: int, broker: str = "redis") -> Report:
    """2. The worker is SIGKILLed three times while it is sending, and restarted each time:
    nothing lost, nothing doubled; rows stuck in ``sending`` go through their unknown policy
    when their lease expires (retry and lookup end sent; give_up may park as unknown)."""
    report = Report("worker-killed", "worker SIGKILLed 3x while sending", broker, n)
    policies = ("retry", "lookup", "retry", "give_up")

    def policy(i: int) -> dict[str, Any]:
        return {"on_unknown": policies[i % len(policies)]}

    with cluster.pipeline(report.scenario, broker, ChaosConfig()) as (pipe, settings):
        cluster.proxy.set(latency_ms=250)  # keep sends in flight so that kills land mid-send
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=15.0), policy)
        caught: list[int] = []
        for _ in range(3):
            since = utcnow()  # count only sends the current worker started, not stuck ones
            wait_until(lambda t=since: _in_flight(cluster, t) >= 3, 30, 0.02)
            caught.append(_in_flight(cluster, since))
            pipe.kill_worker()
            time.sleep(0.5)
            pipe.start_worker()
        run.recovered()

        def expect(rows: Mapping[str, str]) -> list[str]:
            bad = {}
            for key, status in rows.items():
                give_up = policies[int(key.rsplit("-", 1)[1]) % len(policies)] == "give_up"
                if status != "sent" and not (give_up and status == "unknown"):
                    bad[key] = status
            return [f"unexpected final statuses: {_first(_count(bad.values()))}"] if bad else []

        run.finish(expect)
        expired = _attempts(cluster, "error_code = 'LEASE_EXPIRED'")
        parked = int(
            cluster.scalar(
                "SELECT count(*) FROM delivery_messages WHERE status = 'unknown' "
                "AND last_error_code = 'LEASE_EXPIRED'"
            )
        )
        report.faults = (
            f"{pipe.kills} SIGKILLs with {', '.join(map(str, caught))} rows in sending; "
            f"{expired} stuck sends recovered through their policy"
        )
        report.figures["unknown_give_up"] = parked
        _pipeline_figures(run)
        report.check(pipe.kills == 3, f"{pipe.kills} kills instead of 3")
        report.check(all(c > 0 for c in caught), f"a kill found nothing in flight: {caught}")
        report.check(expired > 0, "no sending row went through the lease-expiry policy")
        report.check(
            report.statuses.get("unknown", 0) == parked,
            "a row ended unknown for another reason than an expired send lease",
        )
    return report


def broker_flushed(cluster: Cluster, n: int, broker: str = "redis") -> Report:
    """3a. FLUSHALL on the broker's Redis mid-run wipes queued and unacked tasks: the relay
    republishes from the outbox once their dispatch leases expire; nothing lost."""
    report = Report("broker-flushed", "broker FLUSHALL mid-run", broker, n)
    with cluster.pipeline(report.scenario, broker, BACKLOG) as (pipe, settings):
        cluster.proxy.set(latency_ms=300)  # a backlog in the broker worth flushing
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=6.0))
        run.at(2.0)
        client = cluster.redis.client(0)
        wait_until(lambda: _queued_deliveries(client) >= 20, 10, 0.02)
        queued, unacked = _queued_deliveries(client), client.hlen("unacked")
        client.flushall()
        flushed_at = run.now()
        run.recovered()
        run.finish(all_sent)
        report.faults = (
            f"FLUSHALL at t={flushed_at} s wiped {queued} queued deliver tasks "
            f"(and {unacked} entries of prefetched ones)"
        )
        _pipeline_figures(run)
        report.check(queued > 0, "the flush wiped no deliver task: the fault never hit")
        report.check(
            report.figures["requeued_by_sweeper"] > 0, "no row was recovered by the sweeper"
        )
    return report


def redis_restarted(cluster: Cluster, n: int, broker: str = "redis", down: float = 3.0) -> Report:
    """3b. The broker's Redis (no persistence) is stopped mid-run and started again: worker and
    beat reconnect by themselves; lost tasks come back from the outbox; nothing lost."""
    report = Report("redis-restarted", f"Redis restarted mid-run ({down:g} s down)", broker, n)
    with cluster.pipeline(report.scenario, broker, BACKLOG) as (pipe, settings):
        cluster.proxy.set(latency_ms=300)
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=8.0))
        run.at(2.0)
        client = cluster.redis.client(0)
        wait_until(lambda: _queued_deliveries(client) >= 20, 10, 0.02)
        queued, unacked = _queued_deliveries(client), client.hlen("unacked")
        stopped_at = run.now()
        cluster.redis.restart(down=down)
        run.recovered()
        run.finish(all_sent)
        report.faults = (
            f"Redis stopped at t={stopped_at} s for {down:g} s; {queued} queued deliver tasks "
            f"(and {unacked} entries of prefetched ones) lost with it"
        )
        _pipeline_figures(run)
        report.check(queued > 0, "the restart lost no deliver task: the fault never hit")
    return report


def postgres_restarted(
    cluster: Cluster, n: int, broker: str = "redis", down: float = 3.0
) -> Report:
    """4. PostgreSQL is stopped mid-run (fast shutdown: sessions killed) and started again:
    relay, sweeper and workers reconnect by themselves; apps retry their transactions with the
    same keys; nothing lost, nothing doubled."""
    report = Report("postgres-restarted", f"PostgreSQL restarted ({down:g} s down)", broker, n)
    with cluster.pipeline(report.scenario, broker, ChaosConfig()) as (pipe, settings):
        cluster.proxy.set(latency_ms=100)
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=8.0))
        run.at(3.0)
        stopped_at = run.now()
        cluster.pg.restart(down=down)
        run.recovered()
        run.finish(all_sent)
        assert run.feeder is not None
        report.faults = (
            f"PostgreSQL stopped at t={stopped_at} s for {down:g} s; "
            f"{run.feeder.retried} app transactions retried"
        )
        report.figures["app_retries"] = run.feeder.retried
        _pipeline_figures(run)
    return report


def provider_down(cluster: Cluster, n: int, broker: str = "redis", outage: float = 20.0) -> Report:
    """5. The provider refuses connections for ``outage`` seconds, then comes back: everything
    drains after recovery and nothing is dead, with the product's ``max_attempts`` (8): the
    circuit breaker parks messages without spending attempts, and a failed probe gives its
    attempt back, so an outage of any length costs a message only the few attempts made
    before the breaker opened."""
    report = Report("provider-down", f"provider down {outage:g} s (refused)", broker, n)
    config = ChaosConfig(max_attempts=PRODUCT_MAX_ATTEMPTS)
    with cluster.pipeline(report.scenario, broker, config) as (pipe, settings):
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=10.0))
        run.at(2.0)
        cluster.proxy.refuse()
        run.at(2.0 + outage)
        cluster.proxy.resume()
        run.recovered()
        run.finish(all_sent)
        refused = _attempts(cluster, "error_code LIKE 'NETWORK_Connect%'")
        circuit = len(re.findall(r'"outcome": "circuit_open"', pipe.logs_text()))
        report.faults = (
            f"connections refused for {outage:g} s: {refused} attempts refused, "
            f"{circuit} parked by the open circuit breaker"
        )
        most = cluster.scalar(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM delivery_attempts"
            " WHERE error_code LIKE 'NETWORK_Connect%' GROUP BY message_id) AS refusals"
        )
        report.figures["circuit_parks"] = circuit
        report.figures["most_refused_per_message"] = int(most or 0)
        _pipeline_figures(run)
        report.check(refused + circuit > 0, "no send met the outage: the fault never hit")
    return report


def rate_limited(
    cluster: Cluster, n: int, broker: str = "redis", storm: float = 6.0, retry_after: int = 2
) -> Report:
    """6. A 429 storm with ``Retry-After``: for ``storm`` seconds every request is answered 429
    with Retry-After: 2. No key is requested again earlier than its Retry-After allows, and
    everything is sent once the storm is over."""
    report = Report("rate-limited", f"429 storm {storm:g} s, Retry-After {retry_after}", broker, n)
    # The breaker would stop most requests after the first 429s (scenario 5 shows it); here
    # every message should meet the storm, so it is off.
    config = ChaosConfig(breaker_enabled=False)
    with cluster.pipeline(report.scenario, broker, config) as (pipe, settings):
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n, least=storm))
        run.at(1.0)
        cluster.stub.set_faults(error_rate=1.0, error_status=429, retry_after=retry_after)
        run.at(1.0 + storm)
        cluster.stub.set_faults(error_rate=0.0)
        run.recovered()
        run.finish(all_sent)
        by_key: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for request in cluster.stub.requests():
            by_key[request["key"]].append((request["at"], request["status"]))
        limited = margins = 0
        worst = float("inf")
        for seen in by_key.values():
            seen.sort()
            for (at, status), (later, _) in itertools.pairwise(seen):
                if status == 429:
                    margins += 1
                    worst = min(worst, later - at - retry_after)
            limited += sum(1 for _, status in seen if status == 429)
        report.faults = f"{limited} requests answered 429 with Retry-After: {retry_after}"
        report.figures["earliest_retry_margin_s"] = round(worst, 3) if margins else None
        _pipeline_figures(run)
        report.check(limited > 0, "no 429 was answered: the fault never hit")
        report.check(margins > 0, "no key was retried after a 429")
        report.check(worst >= 0, f"a key was retried {-worst:.3f} s before Retry-After allowed")
    return report


def beat_stopped(cluster: Cluster, n: int, broker: str = "redis", outage: float = 30.0) -> Report:
    """7. celery beat (the relay and the sweeper) is stopped for ``outage`` seconds while apps
    keep enqueueing, then started again: the backlog waits in the outbox and drains."""
    report = Report("beat-stopped", f"beat stopped {outage:g} s", broker, n)
    with cluster.pipeline(report.scenario, broker, ChaosConfig()) as (pipe, settings):
        run = Run(cluster, pipe, settings, report)
        run.feed(max(_feed_time(n), outage + 6.0))
        run.at(3.0)
        pipe.stop_beat()
        run.at(3.0 + outage)
        backlog = (cluster.counts() or {}).get("pending", 0)
        pipe.start_beat()
        run.recovered()
        run.finish(all_sent)
        report.faults = f"beat down {outage:g} s; {backlog} messages waiting in the outbox"
        report.figures["backlog"] = backlog
        _pipeline_figures(run)
        report.check(backlog > 0, "no backlog built up while beat was down")
    return report


def no_dedupe_lookup(cluster: Cluster, n: int, broker: str = "redis") -> Report:
    """8. A provider that ignores idempotency keys, 30% of answers lost after accept, policy
    ``lookup``: the worker asks the provider before resending, so one effect per key."""
    report = Report("no-dedupe-lookup", "provider ignores keys; lookup; 30% lost", broker, n)
    with cluster.pipeline(report.scenario, broker, ChaosConfig(max_attempts=12)) as (
        pipe,
        settings,
    ):
        cluster.stub.set_faults(dedupe=False)
        cluster.proxy.set(blackhole_rate=0.3)
        run = Run(cluster, pipe, settings, report)
        run.feed(_feed_time(n), lambda i: {"on_unknown": "lookup"})
        run.finish(all_sent)
        stats = cluster.proxy.stats()
        found = _attempts(cluster, "kind = 'lookup' AND outcome = 'found'")
        lookups = _attempts(cluster, "kind = 'lookup'")
        report.faults = (
            f"{stats.blackholed} of {stats.exchanges} answers swallowed; provider dedupe off"
        )
        report.figures["lookups"] = lookups
        report.figures["found_by_lookup"] = found
        _pipeline_figures(run)
        report.check(found > 0, "no lost answer was resolved by a lookup: the fault never hit")
    return report


@dataclass(frozen=True)
class Scenario:
    number: str
    run: Callable[..., Report]
    brokers: tuple[str, ...] = ("redis",)


SCENARIOS = (
    Scenario("1", lost_responses, ("redis", "rabbitmq")),
    Scenario("2", worker_killed, ("redis", "rabbitmq")),
    Scenario("3a", broker_flushed),
    Scenario("3b", redis_restarted),
    Scenario("4", postgres_restarted),
    Scenario("5", provider_down),
    Scenario("6", rate_limited),
    Scenario("7", beat_stopped),
    Scenario("8", no_dedupe_lookup),
)

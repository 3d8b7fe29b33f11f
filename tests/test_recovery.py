"""Recovery after a worker is killed, default settings (issue 12 §2): on a private cluster
(``tests/chaos_cluster.py``), every message a SIGKILLed worker held is sent within 30 s of the
kill, on Redis and on RabbitMQ, with one effect per key (``tests/recovery.py``)."""

from __future__ import annotations

import pytest

from tests import recovery
from tests.chaos_cluster import Cluster
from tests.test_chaos import _missing, check

pytestmark = pytest.mark.integration

N = 40


def test_killed_worker_messages_sent_within_30s_on_redis(cluster: Cluster) -> None:
    """With Redis (unacked tasks come back only after an hour), the messages a killed worker
    prefetched or was sending are all sent within 30 s of the kill, each key once."""
    report = recovery.held_by_killed_worker(cluster, N, "redis")
    check(report)
    assert report.statuses == {"sent": N}


def test_killed_worker_messages_sent_within_30s_on_rabbitmq(cluster: Cluster) -> None:
    """With RabbitMQ, the same: within 30 s of the kill, each key once."""
    if not Cluster.rabbitmq_reachable():
        _missing("RabbitMQ is not reachable")
    report = recovery.held_by_killed_worker(cluster, N, "rabbitmq")
    check(report)
    assert report.statuses == {"sent": N}


def test_message_received_just_before_the_kill_is_sent_within_30s_on_redis(
    cluster: Cluster,
) -> None:
    """A worker SIGKILLed right after receiving a task, before renewing its lease (it stops
    itself on receipt), loses nothing: every message is sent within 30 s of the kill, once."""
    report = recovery.killed_right_after_receipt(cluster, 6, "redis")
    check(report)
    assert report.statuses == {"sent": 6}


def test_message_received_just_before_the_kill_is_sent_within_30s_on_rabbitmq(
    cluster: Cluster,
) -> None:
    """The same on RabbitMQ (which redelivers the killed worker's unacknowledged tasks)."""
    if not Cluster.rabbitmq_reachable():
        _missing("RabbitMQ is not reachable")
    report = recovery.killed_right_after_receipt(cluster, 6, "rabbitmq")
    check(report)
    assert report.statuses == {"sent": 6}


def test_relay_claims_and_publishes_while_every_worker_slot_is_blocked(cluster: Cluster) -> None:
    """Beat's relay does not wait for a worker slot: with every slot stuck in a 20 s provider
    call, a new message is claimed and its task published within 10 s, and no relay or sweep
    task appears in the worker's log (so none in Flower, which shows the worker's events)."""
    report = recovery.relay_with_blocked_slots(cluster)
    assert report.failures == [], report.summary()
    assert report.figures["claimed_and_published_s"] <= 10.0, report.summary()

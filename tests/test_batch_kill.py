"""A worker SIGKILLed in the middle of batches (issue 13), on a private cluster
(``tests/chaos_cluster.py``) with the product's defaults: every message of the batches it held
(taken to ``sending``, or still ``dispatched``) is recovered by leases, sweeper and policy and
sent, with one effect per key at the provider.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy.orm import Session

import delivery
from tests.chaos_cluster import Cluster, message_for, wait_until
from tests.recovery import DEFAULTS

pytestmark = pytest.mark.integration

N = 200


def _count(cluster: Cluster, status: str) -> int:
    sql = "SELECT count(*) FROM delivery_messages WHERE status = :s"
    return int(cluster.scalar(sql, s=status) or 0)


def test_kill_9_in_the_middle_of_batches_loses_nothing_and_sends_each_key_once(
    cluster: Cluster,
) -> None:
    """200 messages committed at once (enqueue_many) go out as batches to one worker with the
    default settings and a slow provider; SIGKILL once a batch has settled and others are
    mid-send; a new worker and beat's sweeper finish every message, each key one effect."""
    with cluster.pipeline("batch-kill", "redis", DEFAULTS) as (pipe, settings):
        cluster.proxy.set(latency_ms=400)
        with Session(cluster.db) as session, session.begin():
            specs = (message_for("batch-kill", i) for i in range(N))
            assert delivery.enqueue_many(session, specs, settings=settings).created == N
        mid = wait_until(
            lambda: _count(cluster, "sent") >= 1 and _count(cluster, "sending") >= 8, 60, 0.05
        )
        assert mid, f"never mid-batch: {cluster.counts()}"
        time.sleep(0.2)
        held = _count(cluster, "sending") + _count(cluster, "dispatched")
        pipe.kill_worker()
        time.sleep(0.5)
        pipe.start_worker()
        drained, counts = cluster.wait_final(N, 150)
        log = pipe.logs_text()
    assert drained, counts
    assert counts == {"sent": N}
    assert held >= 8, f"only {held} messages were held at the kill"
    assert "delivery.deliver_batch" in log
    effects = cluster.stub.effects()
    assert len(effects) == N
    assert {n for n in effects.values()} == {1}

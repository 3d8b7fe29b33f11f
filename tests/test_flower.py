"""Flower over the real pipeline: tasks found by message key, no PII, dead and retried tasks.

Starts ``celery -A delivery.worker flower`` with ``deploy/flowerconfig.py`` against the suite's
broker, drives three messages through the running worker and reads Flower's HTTP API.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import delivery
import delivery.core.models
import delivery.worker
from delivery.config.settings import BreakerConfig
from delivery.guards.breaker import CircuitBreaker, Verdict
from delivery.guards.redis_client import redis_client
from delivery.testing.processes import ServiceProcess
from tests.conftest import REDIS_URL, RUN_DIR, drained, free_port, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "ops", "s3cret-flower"
DELIVERED, REJECTED, FLAKY = "+12015550111", "+12015550199", "+12015550122"


def start_flower(port: int, db: Path) -> ServiceProcess:
    env = {**os.environ, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}", "FLOWER_DB": str(db)}
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "delivery.worker",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
        f"--conf={ROOT / 'deploy' / 'flowerconfig.py'}",
        f"--basic-auth={USER}:{PASSWORD}",
        "--state_save_interval=500",
    ]
    return ServiceProcess(
        "flower", argv, log=RUN_DIR / "flower.log", ready="Visit me at", env=env, cwd=ROOT
    ).start()


class Flower:
    """A running Flower process and an authenticated client for its HTTP API."""

    def __init__(self, db: Path) -> None:
        self.db, self.port = db, free_port()
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", auth=(USER, PASSWORD), timeout=10
        )
        self.process = start_flower(self.port, db)

    def wait_for_worker(self) -> None:
        """The worker's heartbeat events prove that Flower's event consumer is listening."""
        params = {"status": 1}
        wait_until(lambda: bool(self.client.get("/api/workers", params=params).json()), 30)

    def restart(self) -> None:
        """Stop Flower (it saves its state on SIGTERM) and start it again on the same db."""
        self.process.stop()
        self.process = start_flower(self.port, self.db)

    def close(self) -> None:
        self.client.close()
        self.process.stop()


@pytest.fixture
def flower(pipeline: Any, tmp_path: Path) -> Iterator[Flower]:
    """Flower on a free port, with basic auth and persistence, once it sees the worker."""
    running = Flower(tmp_path / "flower.db")
    try:
        running.wait_for_worker()
        yield running
    finally:
        running.close()


def tasks_by_id(client: httpx.Client) -> dict[str, dict[str, Any]]:
    response = client.get("/api/tasks")
    assert response.status_code == 200, response.text
    found: dict[str, dict[str, Any]] = response.json()
    return found


def test_flower_shows_delivered_dead_and_retried_tasks_by_key(
    flower: Flower,
    live: Engine,
    stub: Any,
) -> None:
    """Flower finds each deliver task by message key, with no recipient in its arguments, a
    dead message as a failure naming its code and status, a retry with its countdown, and
    still has them after a restart (persistence)."""
    # A breaker left open or half-open by an earlier test would park these messages.
    CircuitBreaker("stub", BreakerConfig(), client=redis_client(REDIS_URL)).reset()
    stub.set_faults(
        fail_first=1,
        error_status=503,
        rules={
            DELIVERED: {"status": 201, "json": {"id": "msg_ok", "status": "accepted"}},
            REJECTED: {"status": 400, "json": {"code": 21211, "message": "Invalid To"}},
        },
    )
    keys = {"flower-ok": DELIVERED, "flower-dead": REJECTED, "flower-retry": FLAKY}
    with Session(live) as session, session.begin():
        for key, to in keys.items():
            delivery.enqueue(session, channel="sms", to=to, payload={"body": "secret"}, key=key)
    assert drained(live, 3, timeout=60) == {"sent": 2, "dead": 1}

    expected = {"flower-ok": "SUCCESS", "flower-dead": "FAILURE", "flower-retry": "SUCCESS"}

    def settled() -> bool:
        seen = tasks_by_id(flower.client)
        return {key: seen.get(key, {}).get("state") for key in keys} == expected

    wait_until(settled, 30)
    seen = tasks_by_id(flower.client)

    for key, to in keys.items():
        task = seen[key]
        assert task["name"] == "delivery.deliver"
        assert task["uuid"] == key
        assert key in task["args"]
        assert to not in str(task) and to[2:] not in str(task) and "secret" not in str(task)
        assert task["kwargs"] in ("{}", {})
    assert seen["flower-ok"]["state"] == "SUCCESS"
    assert "sent via stub" in str(seen["flower-ok"]["result"])

    dead = seen["flower-dead"]
    assert dead["state"] == "FAILURE"
    assert "DeadLettered" in dead["exception"]
    assert "21211" in dead["exception"] and "dead-letter status" in dead["exception"]
    # The error code is searchable: Flower's search reads the result field, not the exception.
    found = flower.client.get("/api/tasks", params={"search": "21211"}).json()
    assert list(found) == ["flower-dead"], found
    assert "dead: 21211 via stub" in str(found["flower-dead"]["result"])

    retried = flower.client.get("/api/task/info/flower-retry").json()
    assert (retried["state"], retried["retries"]) == ("SUCCESS", 1)
    countdown = re.search(r"Retry in ([0-9.]+)s", retried["traceback"])
    assert countdown is not None, retried["traceback"]
    # The retry was published with that countdown: its ETA is the retry time plus it.
    eta = dt.datetime.fromisoformat(retried["eta"]).timestamp()
    assert eta == pytest.approx(retried["retried"] + float(countdown.group(1)), abs=0.5)

    flower.restart()
    persisted = tasks_by_id(flower.client)
    assert {key: persisted[key]["state"] for key in keys} == expected


def test_flower_shows_a_parked_send_as_parked_and_counts_retries_across_republishes(
    flower: Flower, live: Engine, stub: Any
) -> None:
    """A send parked by an open breaker shows as PARKED with its code and time, never a green
    SUCCESS; once the breaker closes it is sent (SUCCESS). A message republished after 3
    attempts shows ``retries: 3``, not a count restarted at 0. A message on another provider
    than its channel's is ``sent via`` that one."""
    breaker = CircuitBreaker(
        "stub", BreakerConfig(failure_threshold=1, reset_timeout=2), client=redis_client(REDIS_URL)
    )
    breaker.reset()
    breaker.record(breaker.allow(), Verdict.FAILURE)  # open, for everyone sharing Redis
    try:
        with Session(live) as session, session.begin():
            delivery.enqueue(
                session, channel="sms", to=DELIVERED, payload={"body": "x"}, key="flower-parked"
            )

        def parked() -> bool:
            task = tasks_by_id(flower.client).get("flower-parked", {})
            return task.get("state") == "PARKED"

        wait_until(parked, 30)
        task = flower.client.get("/api/task/info/flower-parked").json()
        assert "CIRCUIT_OPEN" in str(task["result"]) and "no attempt spent" in str(task["result"])
    finally:
        breaker.reset()
    wait_until(lambda: tasks_by_id(flower.client)["flower-parked"]["state"] == "SUCCESS", 60)

    from tests.factories import message_values

    with Session(live) as session, session.begin():
        values = message_values("flower-again", attempts=3, recipient=DELIVERED)
        session.add(delivery.core.models.Message(**values))
        # On another provider than its channel's (as after a failover): the result names it.
        values = message_values("flower-via", provider="unguarded", recipient=DELIVERED)
        session.add(delivery.core.models.Message(**values))
    wait_until(lambda: tasks_by_id(flower.client).get("flower-again", {}).get("state") == "SUCCESS")
    assert flower.client.get("/api/task/info/flower-again").json()["retries"] == 3
    wait_until(lambda: tasks_by_id(flower.client).get("flower-via", {}).get("state") == "SUCCESS")
    assert "sent via unguarded" in str(tasks_by_id(flower.client)["flower-via"]["result"])


def test_flower_refuses_requests_without_credentials(flower: Flower) -> None:
    """Flower's API answers 401 to a request without or with wrong basic-auth credentials."""
    url = f"{flower.client.base_url}/api/tasks"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, auth=(USER, "wrong"), timeout=10).status_code == 401
    assert flower.client.get("/api/tasks").status_code == 200


def test_flower_config_refuses_to_run_without_auth(tmp_path: Path) -> None:
    """deploy/flowerconfig.py stops Flower with a message naming FLOWER_BASIC_AUTH when unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "delivery.worker",
            "flower",
            f"--port={free_port()}",
            "--address=127.0.0.1",
            f"--conf={ROOT / 'deploy' / 'flowerconfig.py'}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "FLOWER_BASIC_AUTH" in result.stdout + result.stderr


def test_flower_shows_each_message_of_a_batch_by_its_key(
    flower: Flower, live: Engine, stub: Any
) -> None:
    """A backlog sent as ``delivery.deliver_batch`` tasks still shows in Flower one
    ``delivery.deliver`` task per message under its key (events sent by the batch's worker):
    sent ones as SUCCESS, a dead one as FAILURE naming its code (searchable), a retried one
    with its retry counted; no recipient anywhere."""
    CircuitBreaker("stub", BreakerConfig(), client=redis_client(REDIS_URL)).reset()
    stub.set_faults(
        rules={
            DELIVERED: {"status": 201, "json": {"id": "msg_ok", "status": "accepted"}},
            REJECTED: {"status": 400, "json": {"code": 21211, "message": "Invalid To"}},
            FLAKY: {"status": 503, "body": "busy"},
        }
    )
    keys = [f"flower-batch-{i}" for i in range(58)]
    with Session(live) as session, session.begin():
        specs = [dict(channel="sms", to=DELIVERED, payload={"body": "secret"}, key=k) for k in keys]
        specs.append(dict(channel="sms", to=REJECTED, payload={"body": "x"}, key="fb-dead"))
        specs.append(
            dict(channel="sms", to=FLAKY, payload={"body": "x"}, key="fb-retry", max_attempts=2)
        )
        delivery.enqueue_many(session, specs)
    assert drained(live, 60, timeout=60) == {"sent": 58, "dead": 2}

    def settled() -> bool:
        seen = tasks_by_id(flower.client)
        states = {seen.get(k, {}).get("state") for k in keys}
        dead = seen.get("fb-dead", {}).get("state")
        return states == {"SUCCESS"} and dead == "FAILURE"

    wait_until(settled, 30)
    seen = tasks_by_id(flower.client)
    batches = [t for t in seen.values() if t["name"] == "delivery.deliver_batch"]
    assert batches, "the messages did not travel in batches"
    for key in keys:
        task = seen[key]
        assert (task["name"], task["uuid"], task["result"]) == (
            "delivery.deliver",
            key,
            "sent via stub",
        )
        assert key in task["args"]
    assert DELIVERED not in str(seen) and DELIVERED[2:] not in str(seen)
    assert "secret" not in str(seen)
    dead = seen["fb-dead"]
    assert "DeadLettered" in dead["exception"] and "21211" in dead["exception"]
    found = flower.client.get("/api/tasks", params={"search": "21211"}).json()
    assert "fb-dead" in found, found
    one = flower.client.get("/api/tasks", params={"search": keys[7]}).json()
    assert keys[7] in one, one
    wait_until(lambda: tasks_by_id(flower.client).get("fb-retry", {}).get("state") == "FAILURE")
    assert flower.client.get("/api/task/info/fb-retry").json()["retries"] == 1


def test_a_tasks_result_names_its_provider_and_a_failover_where_it_went() -> None:
    """What the worker tells Flower (``delivery.worker.deliver``): a message that failed over
    is PARKED with ``failed over to backup`` (never the stored reason, which may hold a
    provider's text), one sent is ``sent via backup``, one dead names its code and provider."""
    from delivery.core.status import Status
    from delivery.transitions import Action, Result

    task = importlib.import_module("delivery.worker.deliver")  # the package's name is the task
    reason = f"failed over from 'primary' to 'backup': refused for {DELIVERED}"
    moved = Result(Action.PARKED, Status.PENDING, 0.0, "FAILOVER", reason, "backup")
    parked = task.parked_text(moved)
    assert parked.startswith("failed over to backup; ") and DELIVERED not in parked
    assert "no attempt spent" not in parked  # a call at the primary may have counted
    sent = Result(Action.DONE, Status.SENT, provider="backup")
    assert task.outcome_text(sent) == "sent via backup"
    dead = Result(Action.DONE, Status.DEAD, code="21211", reason="text", provider="twilio")
    assert task.outcome_text(dead) == "dead: 21211 via twilio"

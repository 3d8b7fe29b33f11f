"""Guarantee G6 and friends, over a full run on a private cluster (real worker, beat, relay,
PostgreSQL, Redis, two stub providers over HTTP):

- task messages on the broker carry the message id and key only: no recipient, no body, no
  secret (read raw from Redis, and from RabbitMQ with ``basic_get``, before any worker runs);
- provider secrets come from the environment (``api_key_env``), reach their own provider only,
  and never appear in the worker or beat logs, ``delivery show`` or task messages;
- keys and recipients full of SQL and shell metacharacters are stored and sent verbatim.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

import delivery
from delivery.testing.processes import stub_provider
from delivery.testing.stub_provider import StubClient
from tests.chaos_cluster import (
    RABBITMQ_URL,
    ROOT,
    ChaosConfig,
    Cluster,
    ServiceMissing,
    free_port,
    message_for,
)

pytestmark = pytest.mark.integration

IN_CI = os.environ.get("CI") == "true"
STUB_SECRET = "sk_test_stub_" + secrets.token_hex(16)
OTHER_SECRET = "sk_test_other_" + secrets.token_hex(16)
SECRETS = {"STUB_API_KEY": STUB_SECRET, "OTHER_API_KEY": OTHER_SECRET}
RELAY = "from tasks.schedule import relay; print(relay())"
DENIED = "+12015550401"  # the provider answers 401 for this recipient: the failure path too

# Keys and recipients a careless layer would interpret: SQL, shell, format strings, quotes.
NASTY_KEYS = [
    "order-1'; DROP TABLE delivery_messages; --",
    'k" OR "1"="1',
    "$(touch /tmp/pwned)`id`;|&><*?~!#",
    "back\\slash %s %(name)s {0} \\n",
]
NASTY_TO = [
    ("email", "o'brien+$x|y&z`{id}`~!#%*=?^@example.com"),
    ("webhook", "https://hooks.example.com/h?q=';DROP TABLE delivery_messages;--&c=$(id)|`id`"),
    ("email", "plain@example.com"),
    ("webhook", "https://hooks.example.com/h?x=%27%22%3B&y=a b"),
]


def _missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} (CI=true: services are required)")
    pytest.skip(what)


def _digest(secret: str) -> str:
    return hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()


@dataclass
class SecureRun:
    """Everything a full run left behind, for the tests to inspect."""

    messages: list[dict[str, Any]]
    published: int = 0
    raw_messages: list[bytes] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    rows: dict[str, str] = field(default_factory=dict)
    requests_stub: list[dict[str, Any]] = field(default_factory=list)
    requests_other: list[dict[str, Any]] = field(default_factory=list)
    logs: str = ""
    show: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    box = Cluster()
    try:
        box.start()
    except ServiceMissing as exc:
        _missing(str(exc))
    failed_before = request.session.testsfailed
    yield box
    box.stop(keep=request.session.testsfailed > failed_before)


@pytest.fixture(scope="module")
def other_stub(cluster: Cluster) -> Iterator[StubClient]:
    """A second provider, so that each secret can be shown to reach only its own."""
    port = free_port()
    process = stub_provider(cluster.dir / "other-stub.log", port, cwd=ROOT).start()
    client = StubClient(f"http://127.0.0.1:{port}")
    yield client
    client.close()
    process.stop()


def _config(other: StubClient) -> ChaosConfig:
    return ChaosConfig(
        api_key_env="STUB_API_KEY",
        email_provider="other",
        extra_toml=(
            f'\n[providers.other]\nkind = "http"\nbase_url = "{other.url}"\n'
            'api_key_env = "OTHER_API_KEY"\n'
        ),
    )


def _messages() -> list[dict[str, Any]]:
    plain = [message_for("sec", i) for i in range(30)]
    nasty = [
        {**message_for("sec", 100 + i), "key": k, "channel": ch, "to": to}
        for i, (k, (ch, to)) in enumerate(zip(NASTY_KEYS, NASTY_TO, strict=True))
    ]
    denied = {"key": "sec-denied", "channel": "sms", "to": DENIED, "payload": {"body": "no"}}
    return plain + nasty + [denied]


def _enqueue(cluster: Cluster, settings: delivery.Settings, messages: list[dict[str, Any]]) -> None:
    with Session(cluster.db) as session, session.begin():
        for spec in messages:
            delivery.enqueue(session, settings=settings, **spec)


def _relay(env: dict[str, str]) -> int:
    """Run the real relay (``delivery.pipeline.relay``'s function) once, in a process configured
    like beat's worker: it claims the due rows and publishes their tasks to the broker."""
    done = subprocess.run(
        [sys.executable, "-c", RELAY], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def _show(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from delivery.cli import main; main()", "show", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def run(cluster: Cluster, other_stub: StubClient) -> SecureRun:
    """Enqueue, publish with the relay while no worker runs (and read the broker raw), then
    start worker and beat with the secrets in their environment and drain."""
    result = SecureRun(_messages())
    other_stub.reset()
    with cluster.pipeline("security", "redis", _config(other_stub), start=False, **SECRETS) as (
        pipe,
        settings,
    ):
        cluster.stub.set_faults(
            rules={DENIED: {"status": 401, "json": {"code": "UNAUTHORIZED", "message": "no"}}}
        )
        _enqueue(cluster, settings, result.messages)
        result.published = _relay(pipe.env)
        result.raw_messages = list(cluster.redis.client(0).lrange("delivery", 0, -1))
        pipe.start()
        drained, result.statuses = cluster.wait_final(len(result.messages), 60)
        assert drained, result.statuses
        with cluster.db.connect() as conn:
            rows = conn.execute(text("SELECT key, recipient FROM delivery_messages")).all()
        result.rows = {key: recipient for key, recipient in rows}
        result.requests_stub = cluster.stub.requests()
        result.requests_other = other_stub.requests()
        for key in ("sec-00000", "sec-00001", "sec-denied", NASTY_KEYS[0]):
            result.show[key] = _show(pipe.env, key) + _show(pipe.env, key, "--json")
        pipe.stop()
        stubs = [cluster.dir / "stub.log", cluster.dir / "other-stub.log"]
        result.logs = pipe.logs_text() + "".join(p.read_text(errors="replace") for p in stubs)
    return result


def _decode(raw: bytes) -> tuple[dict[str, Any], list[Any]]:
    """A kombu Redis message: JSON envelope, the task body base64-encoded inside."""
    envelope = json.loads(raw)
    body = json.loads(base64.b64decode(envelope["body"]))
    return envelope, body


def _private_values(messages: list[dict[str, Any]]) -> list[str]:
    values = [spec["to"] for spec in messages]
    for spec in messages:
        values += [v for v in spec["payload"].values() if isinstance(v, str) and len(v) > 3]
    return values


def test_redis_task_messages_carry_only_id_and_key(run: SecureRun) -> None:
    """Every deliver task on the Redis broker has args (id, key) and nothing else: no
    recipient, no body, no secret anywhere in the raw message."""
    keys = {spec["key"] for spec in run.messages}
    assert run.published == len(run.messages) == len(run.raw_messages)
    seen = set()
    for raw in run.raw_messages:
        envelope, (args, kwargs, _embed) = _decode(raw)
        assert envelope["headers"]["task"] == "delivery.deliver"
        assert kwargs == {} and len(args) == 2 and isinstance(args[0], int), args
        assert args[1] in keys and envelope["headers"]["id"] == args[1]
        seen.add(args[1])
        text_form = raw.decode() + json.dumps([args, kwargs])
        for private in [*_private_values(run.messages), STUB_SECRET, OTHER_SECRET]:
            assert private not in text_form, f"{private!r} found in a task message"
    assert seen == keys


def test_rabbitmq_task_messages_carry_only_id_and_key(
    cluster: Cluster, other_stub: StubClient
) -> None:
    """The same on RabbitMQ: messages read with basic_get before any worker runs hold only
    the id and the key."""
    if not Cluster.rabbitmq_reachable():
        _missing(f"RabbitMQ is not reachable at {RABBITMQ_URL}")
    from kombu import Connection

    messages = [message_for("amqp", i) for i in range(9)]
    with cluster.pipeline("security-amqp", "rabbitmq", _config(other_stub), start=False) as (
        pipe,
        settings,
    ):
        _enqueue(cluster, settings, messages)
        assert _relay(pipe.env) == len(messages)
        got = []
        with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
            channel = conn.default_channel
            while (message := channel.basic_get("delivery", no_ack=True)) is not None:
                got.append(message)
    assert len(got) == len(messages)
    for message in got:
        args, kwargs, _embed = json.loads(message.body)
        assert kwargs == {} and [type(a) for a in args] == [int, str], args
        body = message.body if isinstance(message.body, str) else message.body.decode()
        text_form = body + json.dumps(message.properties, default=str)
        for private in [*_private_values(messages), STUB_SECRET, OTHER_SECRET]:
            assert private not in text_form
    assert {json.loads(m.body)[0][1] for m in got} == {spec["key"] for spec in messages}


def test_each_secret_reaches_only_its_own_provider(run: SecureRun) -> None:
    """Provider "stub" saw only its own Bearer secret and provider "other" only its own; both
    were read from the worker's environment (api_key_env)."""
    stub_auth = {r["auth"] for r in run.requests_stub}
    other_auth = {r["auth"] for r in run.requests_other}
    assert run.requests_stub and run.requests_other
    assert stub_auth == {_digest(STUB_SECRET)}
    assert other_auth == {_digest(OTHER_SECRET)}


def test_secrets_never_in_logs_show_or_task_messages(run: SecureRun) -> None:
    """Neither secret appears in any process log of the run (worker, beat, stubs), in
    `delivery show` (plain and --json, a dead message included) or in a task message."""
    assert run.statuses.get("dead") == 1  # the 401 path was exercised
    assert "sec-denied" in run.logs  # the logs are really the run's
    shown = "".join(run.show.values())
    assert "UNAUTHORIZED" in shown
    raw = b"".join(run.raw_messages).decode()
    for secret in (STUB_SECRET, OTHER_SECRET):
        for where, content in (("logs", run.logs), ("delivery show", shown), ("broker", raw)):
            assert secret not in content, f"a provider secret appears in {where}"


def test_recipients_and_bodies_never_in_logs(run: SecureRun) -> None:
    """The worker and beat logs name messages by id and key; no recipient or body appears."""
    worker_and_beat = run.logs
    for private in _private_values(run.messages):
        assert private not in worker_and_beat, f"{private!r} appears in a log"


def test_metacharacters_are_stored_and_sent_verbatim(run: SecureRun) -> None:
    """Keys and recipients with SQL and shell metacharacters reach the database and the
    provider byte for byte, and `delivery show` finds them by key."""
    sent = {r["key"]: r["to"] for r in run.requests_stub + run.requests_other}
    for key, (_channel, to) in zip(NASTY_KEYS, NASTY_TO, strict=True):
        assert run.rows[key] == to
        assert sent[key] == to
    assert NASTY_KEYS[0] in run.show[NASTY_KEYS[0]]

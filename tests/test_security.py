"""Guarantee G6 and friends, over a full run on a private cluster (real worker, beat, relay,
PostgreSQL, Redis, two stub providers over HTTP):

- task messages on the broker carry the message id and key only: no recipient, no body, no
  secret (read raw from Redis, and from RabbitMQ with ``basic_get``, before any worker runs);
- provider secrets come from the environment (``api_key_env``), reach their own provider only,
  and never appear in the worker or beat logs, ``delivery show`` or task messages;
- keys and recipients full of SQL and shell metacharacters are stored and sent verbatim;
- a provider's error text that names the recipient (any spelling) reaches no worker or beat
  log, no Flower page, nothing the broker carries and no CLI output (on the suite's worker
  and Flower); the answers that used to leave a row in ``sending`` (a 300-character code, a
  huge Retry-After) end it properly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

import delivery
from delivery.core.bounds import MAX_RETRY_AFTER
from delivery.core.models import utcnow
from delivery.outbox.validation import payload_hash
from delivery.testing.processes import stub_provider
from delivery.testing.stub_provider import StubClient
from tests.chaos_cluster import (
    RABBITMQ_URL,
    ROOT,
    ChaosConfig,
    Cluster,
    free_port,
    message_for,
)
from tests.conftest import BROKER_URL, RUN_DIR, drained, wait_until
from tests.test_flower import Flower, tasks_by_id

pytestmark = pytest.mark.integration

IN_CI = os.environ.get("CI") == "true"
STUB_SECRET = "sk_test_stub_" + secrets.token_hex(16)
OTHER_SECRET = "sk_test_other_" + secrets.token_hex(16)
SECRETS = {"STUB_API_KEY": STUB_SECRET, "OTHER_API_KEY": OTHER_SECRET}
RELAY = "from delivery.worker.schedule import relay; print(relay())"
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
    """Run the real relay (``delivery.relay.claims``'s function) once, in a process configured
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


# --- provider errors that name the recipient: nothing outside the outbox (G6, G7) ----------
#
# These run on the suite's own worker and beat (tests/conftest.py: worker at --loglevel INFO)
# and Flower (tests/test_flower.py), with the stub answering errors whose text names the
# recipient, in several spellings.

LEAKS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # key: (channel, recipient, the stub's answer to it)
    "pii-twilio": (
        "sms",
        "+12015550461",
        {
            "status": 400,
            "json": {
                "code": 21211,
                "message": "The 'To' number +12015550461 is not a valid phone number.",
            },
        },
    ),
    "pii-long-code": (
        "email",
        "pii.leak.one@example.com",
        {
            "status": 422,
            "json": {
                "code": "MAILBOX_pii.leak.one@example.com_" + "X" * 300,
                "message": "Mailbox pii.leak.one@example.com does not exist",
            },
        },
    ),
    "pii-retry": (
        "sms",
        "+12015550462",
        {"status": 503, "json": {"code": "UPSTREAM", "message": "carrier down for (201) 555-0462"}},
    ),
    "pii-hook": (
        "webhook",
        "https://hooks.example.com/pii/secret-path-77?token=t0p",
        {
            "status": 400,
            "json": {
                "code": "BAD_RECEIVER",
                "message": "POST https://hooks.example.com/pii/secret-path-77?token=t0p refused",
            },
        },
    ),
}
#: Every spelling of the recipients above that must not appear anywhere.
NEEDLES = [
    "+12015550461",
    "2015550461",
    "+12015550462",
    "2015550462",
    "555-0462",
    "pii.leak.one",
    "secret-path-77",
    "token=t0p",
]


class BrokerTap:
    """Redis MONITOR on the broker's server while the run lasts: every task message pushed
    and every event published (task-failed included), as the broker saw them."""

    def __init__(self, url: str) -> None:
        import redis

        if not url.startswith("redis"):
            pytest.skip("the broker tap reads a Redis broker (DELIVERY_TEST_BROKER_URL is not)")
        self._client = redis.Redis.from_url(url)
        self.lines: list[str] = []
        self._stop = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            for command in monitor.listen():
                self.lines.append(str(command.get("command", "")))
                if self._stop:
                    return

    def __enter__(self) -> BrokerTap:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._client.ping()  # one more command wakes the listener up
        self._thread.join(10)
        self._client.close()


def _payload(channel: str) -> dict[str, Any]:
    return {"body": "Your code is 482901"} if channel != "webhook" else {"e": 1}


def _cli(*args: str) -> str:
    from click.testing import CliRunner

    from delivery.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exit_code in (0, 1), (args, result.output)
    return result.output


def test_provider_errors_naming_the_recipient_leave_no_trace(
    live: Any, stub: Any, tmp_path: Any
) -> None:
    """Real worker, beat and Flower; the provider answers errors whose text names the
    recipient (Twilio's 21211 text, a 300-character code, a retried 503, a webhook URL): the
    worker and beat logs at INFO, Flower's API, everything the broker carried, and every CLI
    command's output hold none of the recipients, and every message still ends ``dead``."""
    flower = Flower(tmp_path / "flower.db")
    try:
        flower.wait_for_worker()
        stub.set_faults(rules={to: answer for _ch, to, answer in LEAKS.values()})
        with BrokerTap(BROKER_URL) as tap, Session(live) as session:
            with session.begin():
                for key, (channel, to, _answer) in LEAKS.items():
                    delivery.enqueue(
                        session, channel=channel, to=to, payload=_payload(channel), key=key
                    )
            assert drained(live, len(LEAKS), timeout=90) == {"dead": len(LEAKS)}
            wait_until(
                lambda: all(
                    tasks_by_id(flower.client).get(k, {}).get("state") == "FAILURE" for k in LEAKS
                ),
                30,
            )
        flower_text = json.dumps(tasks_by_id(flower.client)) + "".join(
            flower.client.get(f"/api/task/info/{key}").text for key in LEAKS
        )
    finally:
        flower.close()
    broker_text = "\n".join(tap.lines)
    logs = "".join(
        p.read_text(errors="replace") for p in (RUN_DIR / "worker.log", RUN_DIR / "beat.log")
    )
    cli = {
        " ".join(args): _cli(*args)
        for args in (
            ("stats",),
            ("stats", "--json", "--by-provider"),
            ("dead",),
            ("dead", "--json"),
            ("watch", "--once"),
            ("watch", "--once", "--json"),
            ("redrive", "--dry-run", *LEAKS),
            *(("show", key) for key in LEAKS),
            *(("show", key, "--json") for key in LEAKS),
        )
    }
    # The scans read the right things: the run's keys and codes are there.
    assert all(key in logs and key in flower_text and key in broker_text for key in LEAKS)
    assert "DeadLettered" in flower_text and "21211" in flower_text
    assert all(key in cli["dead --json"] for key in LEAKS)
    assert "attempts exhausted" in cli["show pii-retry --json"]
    assert "HTTP Request:" not in logs  # httpx's INFO lines (URLs, query strings) stay out
    sources = {"worker/beat log": logs, "flower": flower_text, "broker": broker_text, **cli}
    hits = [(where, n) for where, text_ in sources.items() for n in NEEDLES if n in text_]
    assert hits == []
    # The payload hash is not shown: an OTP could be found from it by guessing.
    hashes = [payload_hash(ch, to, _payload(ch)) for ch, to, _answer in LEAKS.values()]
    with live.connect() as conn:
        stored = set(conn.scalars(text("SELECT payload_hash FROM delivery_messages")))
    assert stored == set(hashes)  # the hashes looked for are really the stored ones
    assert not [h for h in hashes for out in cli.values() if h in out]


def test_the_reported_answers_do_not_leave_a_message_in_sending(live: Any, stub: Any) -> None:
    """A 400 with a 300-character code ends ``dead`` with the code cut to its column, and a
    503 with ``Retry-After: 999999999999`` parks the message for one day (the clamp), on the
    real worker and PostgreSQL: neither is left in ``sending``."""
    long_code = "E" * 300
    stub.set_faults(
        rules={"+12015550471": {"status": 400, "json": {"code": long_code}}},
        fail_first=1,
        error_status=503,
        error_html=False,
        retry_after=999999999999,
    )
    with Session(live) as session, session.begin():
        # The stub's first answer (fail_first) goes to whichever request comes first: the
        # message to +12015550471 is answered by its rule either way.
        delivery.enqueue(
            session, channel="sms", to="+12015550472", payload={"body": "a"}, key="clamp-1"
        )
    wait_until(lambda: _status(live, "clamp-1")[0] == "pending", 60)
    with Session(live) as session, session.begin():
        delivery.enqueue(
            session, channel="sms", to="+12015550471", payload={"body": "b"}, key="long-code-1"
        )
    wait_until(lambda: _status(live, "long-code-1")[0] == "dead", 60)
    status, _code, due = _status(live, "clamp-1")
    wait = (due - utcnow()).total_seconds()
    assert status == "pending" and MAX_RETRY_AFTER - 120 < wait <= MAX_RETRY_AFTER
    assert _status(live, "long-code-1")[1] == long_code[:63] + "…"


def _status(engine: Any, key: str) -> tuple[str, str | None, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT status, last_error_code, next_attempt_at FROM delivery_messages "
                "WHERE key = :key"
            ),
            {"key": key},
        ).one_or_none()
    return (row[0], row[1], row[2]) if row is not None else ("", None, None)

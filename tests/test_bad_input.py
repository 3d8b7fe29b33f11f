"""Bad input (issue 3): each case gets a specific error naming what is wrong, writes nothing,
and leaves the caller's transaction usable; a provider answer without a usable id never ends
a message ``sent`` without a provider reference.

The cases are data (``ENQUEUE_CASES``, ``CONFIG_CASES``, ``PROVIDER_ANSWERS``) and the checks
are plain functions (``refuse``, ``refuse_config``, ``provider_answers``), so that
``bench/chaos.py`` runs the very same ones to write the bad-input table of
``bench/RELIABILITY.md``. Cases already proven elsewhere are not repeated here: a key reused
with another payload (``tests/test_enqueue.py::test_same_key_other_payload_conflicts_and_
keeps_transaction``) and the config errors (``test_enqueue.py::test_bad_config_names_the_key``,
``test_missing_config_file_is_named``); the bench runs them to show the real messages.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.core.models import Attempt, Message
from delivery.errors import ConfigError, DeliveryError, IdempotencyConflict, InvalidMessage
from tests.chaos_cluster import ChaosConfig, Cluster

SMS: dict[str, Any] = dict(channel="sms", to="+12015550123", payload={"body": "hello"})


@dataclass(frozen=True)
class Case:
    """One bad ``enqueue`` call: what it is, the field the error must name, and words the
    message must contain (so that it says what is wrong, not just where)."""

    what: str
    kwargs: dict[str, Any]
    field: str
    says: str


#: The one error for any wrong SMS recipient (tests/test_phone.py holds every case to it).
PHONE = "is not a valid phone number in international form (E.164: +, country code and number"

ENQUEUE_CASES = [
    Case("SMS recipient not E.164 (no +)", dict(SMS, to="2015550123"), "to", PHONE),
    Case("SMS recipient not a valid number", dict(SMS, to="+1555"), "to", PHONE),
    Case(
        "email recipient not an address",
        dict(channel="email", to="ann(at)example.com", payload={"body": "x"}),
        "to",
        "not an email address",
    ),
    Case("empty SMS body", dict(SMS, payload={"body": ""}), "payload.body", "is empty"),
    Case(
        "payload over max_payload_bytes",
        dict(SMS, payload={"body": "x" * 70_000}),
        "payload",
        "the limit is",
    ),
    Case("key over 255 characters", dict(SMS, key="k" * 256), "key", "limit is 255"),
    Case("key not printable ASCII", dict(SMS, key="заказ-42"), "key", "printable ASCII"),
    Case("key with a line break", dict(SMS, key="a\r\nX-Evil: 1"), "key", "printable ASCII"),
    Case("key with a leading space", dict(SMS, key=" order-42"), "key", "space"),
    Case("unknown channel", dict(SMS, channel="fax"), "channel", "not a configured channel"),
    Case("unknown provider", dict(SMS, provider="nope"), "provider", "not a configured provider"),
    Case("unknown on_unknown policy", dict(SMS, on_unknown="pray"), "on_unknown", "not one of"),
    Case(
        "send_at without a timezone",
        dict(SMS, send_at=dt.datetime(2030, 1, 1, 12)),
        "send_at",
        "timezone-aware",
    ),
    Case(
        "payload not JSON-serialisable",
        dict(SMS, payload={"body": "x", "when": dt.date(2030, 1, 1)}),
        "payload",
        "not JSON-serialisable",
    ),
]


def _count(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Message)) or 0)


def refuse(
    engine: Engine,
    kwargs: Mapping[str, Any],
    *,
    error: type[DeliveryError] = InvalidMessage,
    settings: Settings | None = None,
    prepare: Callable[[Session], None] | None = None,
) -> DeliveryError:
    """Call ``enqueue`` with bad ``kwargs`` inside a caller's transaction that already holds
    its own work; check that it raises ``error``, wrote nothing, and that the transaction
    still works and commits. Returns the error (for its message)."""
    tag = dt.datetime.now(dt.UTC).strftime("%H%M%S%f")
    with Session(engine) as session:
        if prepare is not None:
            with session.begin():
                prepare(session)
        with session.begin():
            delivery.enqueue(session, settings=settings, key=f"before-{tag}", **SMS)
            rows = _count(session)
            with pytest.raises(error) as info:
                delivery.enqueue(session, settings=settings, **kwargs)
            assert _count(session) == rows, "the refused call wrote a row"
            delivery.enqueue(session, settings=settings, key=f"after-{tag}", **SMS)
        keys = set(session.scalars(select(Message.key).where(Message.key.like(f"%-{tag}"))))
    assert keys == {f"before-{tag}", f"after-{tag}"}, "the caller's transaction was harmed"
    return info.value


def refuse_conflict(engine: Engine, settings: Settings | None = None) -> DeliveryError:
    """A key reused with another payload: ``IdempotencyConflict``, nothing written."""
    key = "order-42:receipt-" + dt.datetime.now(dt.UTC).strftime("%H%M%S%f")

    def first(session: Session) -> None:
        delivery.enqueue(session, settings=settings, key=key, **SMS)

    other = dict(SMS, key=key, payload={"body": "another text"})
    err = refuse(engine, other, error=IdempotencyConflict, settings=settings, prepare=first)
    assert key in str(err)
    return err


CONFIG_CASES = [
    ("config: provider without kind", '[providers.s]\nbase_url = "http://x"\n', "providers.s.kind"),
    ("config: misspelt key", "[delivery]\nmax_atempts = 3\n", "delivery.max_atempts"),
    ("config: wrong type", '[backoff]\nbase = "fast"\n', "backoff.base"),
]


def refuse_config(folder: Path, toml: str, key: str) -> ConfigError:
    """A TOML file with a missing or wrong key fails at start-up naming its dotted key."""
    path = folder / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings({"DELIVERY_CONFIG": str(path)})
    assert info.value.key == key and key in str(info.value)
    return info.value


def refuse_missing_config(folder: Path) -> ConfigError:
    """``DELIVERY_CONFIG`` naming no file fails at start-up, naming the variable."""
    with pytest.raises(ConfigError) as info:
        load_settings({"DELIVERY_CONFIG": str(folder / "missing.toml")})
    assert info.value.key == "DELIVERY_CONFIG"
    return info.value


# A provider that answers 2xx without a usable id: the row must not end ``sent`` without a
# provider reference. Each recipient gets one canned answer from the stub (``rules``).
PROVIDER_ANSWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "+12015550601": ("201 with a non-JSON body", {"status": 201, "body": "OK, queued"}),
    "+12015550602": (
        "200 with an HTML page",
        {"status": 200, "body": "<html><body>Accepted</body></html>", "content_type": "text/html"},
    ),
    "+12015550603": ("201 with an empty body", {"status": 201, "body": ""}),
    "+12015550604": ("201 JSON without an id", {"status": 201, "json": {"status": "accepted"}}),
    "+12015550605": ("202 JSON list", {"status": 202, "json": ["accepted"]}),
}


@dataclass(frozen=True)
class Ending:
    what: str
    policy: str
    status: str
    provider_ref: str | None
    code: str | None
    attempts: int
    effects: int


def provider_answers(cluster: Cluster) -> list[Ending]:
    """Send one message per canned answer under policies ``retry`` (two attempts) and
    ``give_up``, end to end through a real worker on the private ``cluster``; return how each
    one ended. (Its circuit breaker is off: every one of these answers is a failure, ten in a
    row open it, and an open breaker would only delay the endings.)"""
    config = ChaosConfig(breaker_enabled=False)
    with cluster.pipeline("provider-answers", "redis", config) as (_pipe, settings):
        cluster.stub.set_faults(rules={to: rule for to, (_, rule) in PROVIDER_ANSWERS.items()})
        with Session(cluster.db) as session, session.begin():
            for to in PROVIDER_ANSWERS:
                for policy in ("retry", "give_up"):
                    delivery.enqueue(
                        session,
                        settings=settings,
                        channel="sms",
                        to=to,
                        payload={"body": "hi"},
                        key=f"answer-{to[-3:]}-{policy}",
                        on_unknown=policy,
                        max_attempts=2,
                    )
        drained, counts = cluster.wait_final(2 * len(PROVIDER_ANSWERS), 60)
        assert drained, counts
        effects = cluster.stub.effects()
        with Session(cluster.db) as session:
            endings = []
            for m in session.scalars(select(Message).order_by(Message.id)):
                logged = session.scalar(
                    select(func.count()).select_from(Attempt).where(Attempt.message_id == m.id)
                )
                endings.append(
                    Ending(
                        PROVIDER_ANSWERS[m.recipient][0],
                        m.on_unknown,
                        m.status,
                        m.provider_ref,
                        m.last_error_code,
                        int(logged or 0),
                        effects.get(m.key, 0),
                    )
                )
    return endings


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("case", ENQUEUE_CASES, ids=[c.what for c in ENQUEUE_CASES])
def test_bad_enqueue_is_refused_specifically(clean: Engine, case: Case) -> None:
    """The bad call raises InvalidMessage naming the field and the problem, writes nothing,
    and the caller's transaction goes on and commits its own work."""
    err = refuse(clean, case.kwargs)
    assert isinstance(err, InvalidMessage) and err.field == case.field, err
    assert case.says in str(err), err


@pytest.mark.integration
def test_provider_answer_without_id_never_ends_sent(cluster: Cluster) -> None:
    """A 2xx that is not JSON, is HTML, is empty or has no id ends unknown (NO_PROVIDER_REF),
    never sent without a reference; each attempt is logged; the provider saw one effect."""
    endings = provider_answers(cluster)
    assert len(endings) == 2 * len(PROVIDER_ANSWERS)
    for e in endings:
        assert e.status == "unknown" and e.provider_ref is None, e
        assert e.code == "NO_PROVIDER_REF", e
        assert e.attempts == (2 if e.policy == "retry" else 1), e
        assert e.effects == 1, e

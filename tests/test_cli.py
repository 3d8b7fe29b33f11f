"""Tests for the ``delivery`` ops CLI against a temporary SQLite outbox."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery.cli import main
from delivery.core.models import Attempt, Message, utcnow
from delivery.observability.events import Transition, add_hook, remove_hook
from tests.factories import STATUSES, add, add_failover

RECIPIENT = "+15555550123"
MASKED = "+1*******123"


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def reload(session: Session, key: str) -> Message:
    session.expire_all()
    return session.scalars(select(Message).where(Message.key == key)).one()


def test_stats_json_counts_every_status(session: Session) -> None:
    """``stats --json`` prints one line with every status, zeros included, and nothing
    else: scripts rely on this shape (``--by-provider`` adds keys, see test_ops_cli)."""
    for i in range(3):
        add(session, f"d{i}", "dead")
    add(session, "s0", "sent")
    add(session, "u0", "unknown")

    result = run("stats", "--json")

    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1
    counts = json.loads(result.output)
    assert list(counts) == STATUSES  # every status, in this order
    assert counts == dict.fromkeys(STATUSES, 0) | {"sent": 1, "dead": 3, "unknown": 1}


def test_dead_lists_only_dead_and_filters_by_code(session: Session) -> None:
    """``dead`` lists dead messages only, newest first, and ``--code`` keeps one error code."""
    old = utcnow() - dt.timedelta(hours=3)
    add(session, "dead-old", "dead", last_error_code="REJECTED", updated_at=old)
    add(session, "dead-new", "dead", last_error_code="EXHAUSTED")
    add(session, "sent-1", "sent")
    add(session, "unknown-1", "unknown", last_error_code="REJECTED")

    listed = run("dead", "--json")
    assert listed.exit_code == 0, listed.output
    assert [m["key"] for m in json.loads(listed.output)] == ["dead-new", "dead-old"]

    coded = run("dead", "--code", "REJECTED", "--json")
    assert [m["key"] for m in json.loads(coded.output)] == ["dead-old"]

    recent = run("dead", "--since", "1h", "--json")
    assert [m["key"] for m in json.loads(recent.output)] == ["dead-new"]

    table = run("dead")
    assert table.exit_code == 0, table.output
    assert "dead-new" in table.output and "sent-1" not in table.output
    assert RECIPIENT not in table.output


def test_show_by_key_and_id_prints_attempts_and_masks(session: Session) -> None:
    """``show`` finds a message by key or id, prints its attempts and masks the recipient."""
    message = add(session, "order-7", "dead", attempts=2, last_error_code="REJECTED")
    for number, code in ((1, "TIMEOUT"), (2, "REJECTED")):
        session.add(
            Attempt(
                message_id=message.id,
                number=number,
                kind="send",
                started_at=utcnow(),
                outcome="failed",
                http_status=400,
                error_code=code,
                error="bad",
            )
        )
    session.commit()

    by_key = run("show", "order-7", "--json")
    assert by_key.exit_code == 0, by_key.output
    data = json.loads(by_key.output)
    assert data["id"] == message.id
    assert [a["error_code"] for a in data["attempts"]] == ["TIMEOUT", "REJECTED"]
    assert data["recipient"] == MASKED
    assert data["payload"].startswith("<hidden: ")

    by_id = run("show", str(message.id))
    assert by_id.exit_code == 0, by_id.output
    assert "order-7" in by_id.output and "TIMEOUT" in by_id.output
    assert MASKED in by_id.output and RECIPIENT not in by_id.output

    revealed = json.loads(run("show", "order-7", "--json", "--reveal").output)
    assert revealed["recipient"] == RECIPIENT
    assert revealed["payload"] == {"body": "hi"}
    assert RECIPIENT in run("show", "order-7", "--reveal").output


def test_show_prints_the_trace_id_of_a_traced_message(session: Session) -> None:
    """``show`` of a message enqueued in a recorded span prints its trace id (``--json``:
    ``trace_id``); of one without, none."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    add(session, "traced-2", "sent", traceparent=f"00-{trace}-00f067aa0ba902b7-01")
    add(session, "plain-2", "sent")
    assert json.loads(run("show", "traced-2", "--json").output)["trace_id"] == trace
    assert json.loads(run("show", "plain-2", "--json").output)["trace_id"] is None
    add(session, "odd-2", "sent", traceparent=f"00-{'<a>' * 10}xx-00f067aa0ba902b7-01")
    assert json.loads(run("show", "odd-2", "--json").output)["trace_id"] is None
    lines = run("show", "traced-2").output.splitlines()
    assert any(line.split() == ["trace_id", trace] for line in lines), lines


def test_show_names_each_attempts_provider_and_the_route(session: Session) -> None:
    """``show`` of a message that failed over: each attempt names the provider it called, the
    message its route (``primary -> backup``, a provider repeated in a row once) and
    ``pinned``; a failover row between the two providers' attempts; ``--json`` has
    ``provider`` per attempt, ``route`` as a list and ``pinned``. Recipients stay masked."""
    add_failover(session, "otp-9")

    data = json.loads(run("show", "otp-9", "--json").output)
    assert [a["provider"] for a in data["attempts"]] == ["primary", "backup", "backup"]
    assert (data["provider"], data["route"], data["pinned"]) == (
        "backup",
        ["primary", "backup"],
        False,
    )
    assert list(data).index("route") == list(data).index("provider") + 1
    assert RECIPIENT not in str(data)

    shown = run("show", "otp-9")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert any(line.split() == ["route", "primary", "->", "backup"] for line in lines), lines
    assert any(line.split() == ["pinned", "False"] for line in lines), shown.output
    tries = [line for line in lines if "(try " in line]
    assert [t.split("│")[5].strip() for t in tries] == ["primary", "backup", "backup"]
    (moved,) = [line for line in lines if "failover" in line]
    assert "primary -> backup" in moved
    assert lines.index(moved) == lines.index(tries[0]) + 1
    assert RECIPIENT not in shown.output and MASKED in shown.output


def test_show_of_a_message_waiting_on_its_next_provider_names_why(session: Session) -> None:
    """A message that failed over and has not been tried at its next provider yet: its route
    ends there, and the failover row after its last attempt gives the stored reason, masked;
    one that failed over before any attempt (its breaker was open) shows the move alone."""
    add_failover(session, "otp-10", sent=False)
    data = json.loads(run("show", "otp-10", "--json").output)
    assert (data["route"], [a["provider"] for a in data["attempts"]]) == (
        ["primary", "backup"],
        ["primary"],
    )
    lines = run("show", "otp-10").output.splitlines()
    (moved,) = [line for line in lines if "failover" in line]
    assert "primary -> backup" in moved and "failed over from 'primary'" in moved
    assert lines.index(moved) == next(i for i, line in enumerate(lines) if "(try 1)" in line) + 1
    assert RECIPIENT not in "\n".join(lines)

    reason = f"failed over from 'primary' to 'backup': breaker open ({RECIPIENT})"
    add(
        session,
        "early-1",
        "pending",
        provider="backup",
        last_error_code="FAILOVER",
        last_error=reason,
    )
    data = json.loads(run("show", "early-1", "--json").output)
    assert (data["route"], data["attempts"]) == (["backup"], [])
    shown = run("show", "early-1").output
    (moved,) = [line for line in shown.splitlines() if "failover" in line]
    assert "-> backup" in moved and "failed over from 'primary'" in moved
    assert RECIPIENT not in shown


def test_show_of_a_pinned_message_and_of_rows_from_before_failover(session: Session) -> None:
    """A message whose attempt may have taken effect is ``pinned``; an attempt row written
    before failover existed (no provider) reads as its message's provider; a message that
    never moved has a route of its one provider and no failover row."""
    message = add(session, "pin-1", "pending", attempts=1, pinned=True)
    session.add(
        Attempt(
            message_id=message.id,
            number=1,
            kind="send",
            started_at=utcnow(),
            outcome="unknown",
        )
    )
    session.commit()
    data = json.loads(run("show", "pin-1", "--json").output)
    assert (data["route"], data["pinned"]) == (["stub"], True)
    assert data["attempts"][0]["provider"] == "stub"
    lines = run("show", "pin-1").output.splitlines()
    assert ["pinned", "True"] in [line.split() for line in lines]
    assert not [line for line in lines if "failover" in line]


def test_redrive_requeues_dead_and_unknown_with_same_key(session: Session) -> None:
    """``redrive`` puts dead and unknown messages back to pending with the same key."""
    add(session, "k-dead", "dead", attempts=5, last_error_code="EXHAUSTED")
    add(session, "k-unknown", "unknown", attempts=3)
    seen: list[Transition] = []
    add_hook(seen.append)
    try:
        result = run("redrive", "k-dead", "k-unknown")
    finally:
        remove_hook(seen.append)

    assert result.exit_code == 0, result.output
    dead, unknown = reload(session, "k-dead"), reload(session, "k-unknown")
    # The attempt count (the fence) goes on; each gets its budget of 5 attempts again.
    assert (dead.status, dead.attempts, dead.max_attempts, dead.needs_lookup) == (
        "pending",
        5,
        10,
        False,
    )
    assert (unknown.status, unknown.attempts, unknown.max_attempts, unknown.needs_lookup) == (
        "pending",
        3,
        8,
        True,
    )
    assert dead.last_error_code == "EXHAUSTED"
    assert [(t.key, t.from_status, t.outcome) for t in seen] == [
        ("k-dead", "dead", "redrive"),
        ("k-unknown", "unknown", "redrive"),
    ]


def test_redrive_refuses_sent_message(session: Session) -> None:
    """``redrive`` leaves a sent message alone, says why and exits 1."""
    sent = add(session, "k-sent", "sent", attempts=1)
    add(session, "k-dead", "dead")

    result = run("redrive", "--json", str(sent.id), "k-dead")

    assert result.exit_code == 1, result.output
    rows = json.loads(result.stdout)
    assert [(r["key"], r["redriven"]) for r in rows] == [("k-sent", False), ("k-dead", True)]
    assert "only dead or unknown" in rows[0]["reason"]
    assert reload(session, "k-sent").status == "sent"
    assert reload(session, "k-dead").status == "pending"


def test_unknown_ref_exits_nonzero_naming_it(session: Session) -> None:
    """A ref that matches no message fails and names the ref, for ``show`` and ``redrive``."""
    add(session, "k-dead", "dead")

    shown = run("show", "no-such-key")
    assert shown.exit_code == 2
    assert "no-such-key" in shown.output and "Traceback" not in shown.output

    redriven = run("redrive", "k-dead", "424242")
    assert redriven.exit_code == 1
    assert "424242" in redriven.output
    assert reload(session, "k-dead").status == "pending"


def test_bad_since_names_the_option(db_url: str) -> None:
    """An unparseable ``--since`` is a usage error that names the option."""
    result = run("dead", "--since", "yesterday")

    assert result.exit_code == 2
    assert "--since" in result.output and "yesterday" in result.output


def test_broken_config_file_is_an_error_line(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DELIVERY_CONFIG that is not valid TOML prints ``error:`` and exits 2."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[delivery\nmax_attempts = ")
    monkeypatch.setenv("DELIVERY_CONFIG", str(broken))

    result = run("stats")

    assert result.exit_code == 2
    assert result.output.startswith("error: ")
    assert "DELIVERY_CONFIG" in result.output
    assert "Traceback" not in result.output

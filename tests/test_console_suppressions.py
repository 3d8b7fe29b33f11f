"""The console's ``/suppressions`` page through Flask's test client, on the suite's PostgreSQL
database: the list (never a recipient), an operator's add and lift (audited, CSRF, notices),
a viewer's 403, bad input naming the field, and the page with no list secret."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from delivery.config.loading import load_settings
from delivery.core.models import AuditEntry, Suppression
from delivery.guards.suppression import Suppressions, recipient_hash
from tests.test_console import OPERATOR, VIEWER, console_app, get, post, token

LIST_SECRET = "a-console-suppression-secret"
NUMBER = "+12015550147"
EMAIL = "ann.recipient@example.com"


@pytest.fixture
def app(clean: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    """The console on the suite's (emptied) database, with a suppression secret."""
    monkeypatch.setenv("DELIVERY_SUPPRESSION_SECRET", LIST_SECRET)
    application = console_app()
    yield application
    application.extensions["delivery_console"].sessions.kw["bind"].dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def entries(engine: Engine) -> list[tuple[str, str, str]]:
    """(channel, recipient_hash, source) of every entry, oldest first."""
    with Session(engine) as session:
        s = Suppression
        rows = session.execute(select(s.channel, s.recipient_hash, s.source).order_by(s.id))
        return [(channel, digest, source) for channel, digest, source in rows]


def audits(engine: Engine) -> list[AuditEntry]:
    with Session(engine) as session:
        return list(session.scalars(select(AuditEntry).order_by(AuditEntry.id)))


def change(client: FlaskClient, action: str, channel: str, recipient: str):  # type: ignore[no-untyped-def]
    """An operator's POST of the add or lift form, with their CSRF token."""
    data = {
        "csrf_token": token(client, "/suppressions"),
        "channel": channel,
        "recipient": recipient,
    }
    return post(client, f"/suppressions/{action}", data)


def notice(client: FlaskClient, action: str, channel: str, recipient: str) -> str:
    """The notice shown on the list after the form was sent (303 back to it)."""
    response = change(client, action, channel, recipient)
    assert response.status_code == 303, response.get_data(as_text=True)
    assert response.headers["Location"].endswith("/suppressions")
    page: str = get(client, "/suppressions").get_data(as_text=True)
    assert recipient not in page and recipient.lstrip("+") not in page
    return page.split('<p class="notice">', 1)[1].split("</p>", 1)[0]


def test_the_list_shows_entries_and_never_a_recipient(client: FlaskClient, clean: Engine) -> None:
    """An entry from a receipt is listed (channel, hash prefix, code, source) to operators and
    viewers, from the navigation; no recipient anywhere; only operators get the forms."""
    lists = Suppressions(load_settings())
    with clean.begin() as conn:
        lists.add(conn, "sms", NUMBER, code="21610", source="receipt:stub evt_1")
    digest = recipient_hash(LIST_SECRET.encode(), "sms", NUMBER)
    for user in (OPERATOR, VIEWER):
        response = get(client, "/suppressions", user)
        page = response.get_data(as_text=True)
        assert response.status_code == 200, page
        assert 'href="/suppressions">Suppressions</a>' in page
        assert digest[:12] in page and digest not in page
        assert "21610" in page and "receipt:stub evt_1" in page
        assert NUMBER not in page and NUMBER.lstrip("+") not in page
        assert ('action="/suppressions/add"' in page) is (user == OPERATOR)
        assert ("csrf_token" in page) is (user == OPERATOR)


def test_an_operator_adds_a_recipient_and_the_list_shows_it(
    client: FlaskClient, clean: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Add: a notice says added; the entry is the keyed hash with the console user as source;
    the recipient is in no response and no log line."""
    caplog.set_level(logging.DEBUG)
    assert notice(client, "add", "email", EMAIL) == "email: recipient added"
    digest = recipient_hash(LIST_SECRET.encode(), "email", EMAIL)
    assert entries(clean) == [("email", digest, "console:ann")]
    page = get(client, "/suppressions").get_data(as_text=True)
    assert digest[:12] in page and "console:ann" in page
    assert EMAIL not in caplog.text


def test_adding_twice_says_it_was_already_listed(client: FlaskClient, clean: Engine) -> None:
    """The second add changes nothing, says so, and writes no second audit row."""
    assert notice(client, "add", "sms", NUMBER) == "sms: recipient added"
    assert notice(client, "add", "sms", NUMBER) == "sms: recipient was already on the list"
    assert len(entries(clean)) == 1
    assert [a.action for a in audits(clean)] == ["suppress"]


def test_an_operator_lifts_a_recipient(client: FlaskClient, clean: Engine) -> None:
    """Lift takes the entry off (another channel's entry stays); lifting again says it was not
    on the list."""
    notice(client, "add", "sms", NUMBER)
    notice(client, "add", "webhook", "https://hooks.example.com/in")
    assert notice(client, "lift", "sms", NUMBER) == "sms: recipient lifted"
    assert [channel for channel, _, _ in entries(clean)] == ["webhook"]
    assert notice(client, "lift", "sms", NUMBER) == "sms: recipient was not on the list"
    assert [a.action for a in audits(clean)] == ["suppress", "suppress", "lift"]


def test_changes_are_audited_with_the_actor_and_no_recipient(
    client: FlaskClient, clean: Engine
) -> None:
    """Each change is an audit row of ``console:ann`` whose detail is the channel and the hash
    prefix; the audit page shows it, and nowhere the recipient."""
    notice(client, "add", "sms", NUMBER)
    notice(client, "lift", "sms", NUMBER)
    prefix = recipient_hash(LIST_SECRET.encode(), "sms", NUMBER)[:12]
    rows = audits(clean)
    assert [(a.actor, a.action, a.detail) for a in rows] == [
        ("console:ann", "suppress", f"sms {prefix}"),
        ("console:ann", "lift", f"sms {prefix}"),
    ]
    for a in rows:
        assert NUMBER.lstrip("+") not in " ".join(str(v) for v in vars(a).values())
    page = get(client, "/audit").get_data(as_text=True)
    assert prefix in page and NUMBER.lstrip("+") not in page


def test_a_viewer_cannot_add_or_lift(client: FlaskClient, clean: Engine) -> None:
    """A viewer's POST, with a valid token of theirs, is 403 and writes nothing."""
    csrf = client.application.extensions["delivery_console"].csrf.token(VIEWER[0])
    for action in ("add", "lift"):
        data = {"csrf_token": csrf, "channel": "sms", "recipient": NUMBER}
        response = post(client, f"/suppressions/{action}", data, VIEWER)
        assert response.status_code == 403, action
    assert entries(clean) == [] and audits(clean) == []


def test_a_post_without_the_right_csrf_token_writes_nothing(
    client: FlaskClient, clean: Engine
) -> None:
    """No token, a wrong one or a viewer's: 403 saying CSRF, nothing written."""
    other = client.application.extensions["delivery_console"].csrf.token(VIEWER[0])
    for extra in ({}, {"csrf_token": "0" * 64}, {"csrf_token": other}):
        response = post(
            client, "/suppressions/add", {"channel": "sms", "recipient": NUMBER, **extra}
        )
        assert response.status_code == 403
        assert "CSRF" in response.get_data(as_text=True)
    assert entries(clean) == [] and audits(clean) == []


@pytest.mark.parametrize(
    ("channel", "recipient", "field"),
    [
        ("fax", NUMBER, "channel"),
        ("", NUMBER, "channel"),
        ("sms", "", "recipient"),
        ("sms", "   ", "recipient"),
        ("sms", EMAIL, "recipient"),
        ("email", NUMBER, "recipient"),
        ("webhook", "ftp://files.example.com/x", "recipient"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(
    client: FlaskClient, clean: Engine, channel: str, recipient: str, field: str
) -> None:
    """An unknown channel or an empty recipient, or one not of the channel's shape, is a 400
    whose message starts with the field; the recipient is not echoed; nothing is written."""
    for action in ("add", "lift"):
        response = change(client, action, channel, recipient)
        page = response.get_data(as_text=True)
        assert response.status_code == 400, page
        assert f"{field}: " in page
        assert not recipient.strip() or recipient not in page
    assert entries(clean) == [] and audits(clean) == []


def test_without_a_secret_the_page_says_the_list_is_off_and_refuses_changes(
    client: FlaskClient, clean: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DELIVERY_SUPPRESSION_SECRET: the page renders, says the list is off naming the
    variable, offers no form; a POST is a 400 saying so, and nothing is written."""
    monkeypatch.delenv("DELIVERY_SUPPRESSION_SECRET")
    csrf = client.application.extensions["delivery_console"].csrf.token(OPERATOR[0])
    page = get(client, "/suppressions").get_data(as_text=True)
    assert "suppression list is off" in page and "DELIVERY_SUPPRESSION_SECRET" in page
    assert 'action="/suppressions/add"' not in page
    for action in ("add", "lift"):
        data = {"csrf_token": csrf, "channel": "sms", "recipient": NUMBER}
        response = post(client, f"/suppressions/{action}", data)
        assert response.status_code == 400
        assert "suppression list is off" in response.get_data(as_text=True)
    assert entries(clean) == [] and audits(clean) == []

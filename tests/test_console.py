"""The ops console through its WSGI interface (Flask's test client) on a migrated SQLite
outbox: every page and action, auth (401/403), CSRF, masking, and the audit rows."""

from __future__ import annotations

import base64
import datetime as dt
import re
import time
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from delivery import ops
from delivery.config.loading import load_settings
from delivery.console import parse_users
from delivery.console.app import create_app
from delivery.core.models import AuditEntry, Message, utcnow
from delivery.errors import ConfigError
from tests.factories import RECIPIENT, add, add_attempt, add_failover, message_values

OPERATOR = ("ann", "correct-horse-battery")
VIEWER = ("vic", "read-only-viewer-pass")


def basic(user: tuple[str, str]) -> dict[str, str]:
    token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def console_app() -> Flask:
    """The console on the environment's settings, with an operator and a viewer."""
    users = parse_users(
        {
            "DELIVERY_CONSOLE_AUTH": f"{OPERATOR[0]}:{OPERATOR[1]}",
            "DELIVERY_CONSOLE_VIEWERS": f"{VIEWER[0]}:{VIEWER[1]}",
        }
    )
    application = create_app(settings=load_settings(), users=users)
    application.testing = True
    return application


@pytest.fixture
def app(db_url: str) -> Iterator[Flask]:
    yield console_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def get(client: FlaskClient, path: str, user: tuple[str, str] = OPERATOR, **kw: object):  # type: ignore[no-untyped-def]
    return client.get(path, headers=basic(user), **kw)


def token(client: FlaskClient, path: str, user: tuple[str, str] = OPERATOR) -> str:
    page = get(client, path, user).get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def post(client: FlaskClient, path: str, data: dict[str, str], user: tuple[str, str] = OPERATOR):  # type: ignore[no-untyped-def]
    return client.post(path, data=data, headers=basic(user))


def audit_rows(session: Session) -> list[AuditEntry]:
    session.expire_all()
    return list(session.scalars(select(AuditEntry).order_by(AuditEntry.id)))


def status_of(session: Session, key: str) -> str:
    session.expire_all()
    return session.scalars(select(Message.status).where(Message.key == key)).one()


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "field", "words"),
    [
        ({}, "DELIVERY_CONSOLE_AUTH", "refuses to start"),
        ({"DELIVERY_CONSOLE_AUTH": "ann:pw7x"}, "DELIVERY_CONSOLE_AUTH", "shorter than 12"),
        ({"DELIVERY_CONSOLE_AUTH": "nocolon"}, "DELIVERY_CONSOLE_AUTH", "not user:password"),
        (
            {
                "DELIVERY_CONSOLE_AUTH": "ann:aaaaaaaaaaaa",
                "DELIVERY_CONSOLE_VIEWERS": "ann:bbbbbbbbbbbb",
            },
            "DELIVERY_CONSOLE_VIEWERS",
            "also an operator",
        ),
    ],
)
def test_console_refuses_bad_credentials_naming_the_variable(
    environ: dict[str, str], field: str, words: str
) -> None:
    """Missing operators, a short password, a malformed entry or a name in both lists is a
    ConfigError naming the variable, and never echoes a password."""
    with pytest.raises(ConfigError) as caught:
        parse_users(environ)
    assert caught.value.key == field
    assert words in str(caught.value)
    for value in environ.values():
        secret = value.partition(":")[2]
        assert not secret or secret not in str(caught.value)


def test_cli_console_refuses_to_start_without_operators(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delivery console`` without DELIVERY_CONSOLE_AUTH exits 2 naming the variable."""
    from click.testing import CliRunner

    from delivery.cli import main

    monkeypatch.delenv("DELIVERY_CONSOLE_AUTH", raising=False)
    result = CliRunner().invoke(main, ["console", "--port", "0"])
    assert result.exit_code == 2
    assert "DELIVERY_CONSOLE_AUTH" in result.output


# --- auth, CSRF ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/messages", "/dead", "/unknown", "/breakers", "/audit"])
def test_every_page_needs_credentials(client: FlaskClient, path: str) -> None:
    """No credentials or a wrong password gets 401 with a Basic challenge on every page."""
    assert client.get(path).status_code == 401
    wrong = client.get(path, headers=basic((OPERATOR[0], "wrong-password-123")))
    assert wrong.status_code == 401
    assert wrong.headers["WWW-Authenticate"].startswith("Basic")


@pytest.mark.parametrize("path", ["/", "/messages", "/dead", "/unknown", "/breakers", "/audit"])
def test_every_page_renders_for_operators_and_viewers(
    client: FlaskClient, session: Session, path: str
) -> None:
    """Each page answers 200 to an operator and to a viewer, with a strict CSP (no script)."""
    add(session, "order-1:receipt", "dead", last_error_code="21211")
    for user in (OPERATOR, VIEWER):
        response = get(client, path, user)
        assert response.status_code == 200, response.get_data(as_text=True)
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert "<script" not in response.get_data(as_text=True)


def test_a_viewer_cannot_change_anything(client: FlaskClient, session: Session) -> None:
    """A viewer's POST (with a valid token of theirs) is 403, the message stays dead, no audit
    row is written, and the viewer sees no action buttons."""
    message = add(session, "v-1", "dead")
    page = get(client, "/messages/v-1", VIEWER).get_data(as_text=True)
    assert "Redrive" not in page and "csrf_token" not in page
    csrf = client.application.extensions["delivery_console"].csrf.token(VIEWER[0])
    for path in (f"/act/{message.id}/redrive", f"/act/{message.id}/reveal", "/bulk/redrive-dead"):
        response = post(client, path, {"csrf_token": csrf}, VIEWER)
        assert response.status_code == 403, path
    assert status_of(session, "v-1") == "dead"
    assert audit_rows(session) == []


def test_a_post_without_the_right_csrf_token_changes_nothing(
    client: FlaskClient, session: Session
) -> None:
    """An operator's POST without a token, or with another user's, is 403 and changes
    nothing."""
    message = add(session, "c-1", "dead")
    other = client.application.extensions["delivery_console"].csrf.token(VIEWER[0])
    for data in ({}, {"csrf_token": "0" * 64}, {"csrf_token": other}):
        response = post(client, f"/act/{message.id}/redrive", data)
        assert response.status_code == 403
        assert "CSRF" in response.get_data(as_text=True)
    assert status_of(session, "c-1") == "dead"
    assert audit_rows(session) == []


# --- messages -------------------------------------------------------------------------------


def test_search_masks_recipients_and_finds_by_key_prefix_id_status_and_code(
    client: FlaskClient, session: Session
) -> None:
    """The list never shows a recipient; key (exact and prefix*), id, status, provider, code
    and time filters each select the right messages."""
    a = add(session, "order-42:receipt", "dead", last_error_code="21211")
    add(session, "order-43:receipt", "sent")
    add(session, "signup-1:otp", "pending", created_at=utcnow() - dt.timedelta(days=2))

    def keys(query: str) -> list[str]:
        page = get(client, f"/messages?{query}").get_data(as_text=True)
        assert RECIPIENT not in page
        return re.findall(r'<td class="key"><a [^>]*>([^<]+)</a>', page)

    assert keys("") == ["signup-1:otp", "order-43:receipt", "order-42:receipt"]
    assert keys("key=order-42:receipt") == ["order-42:receipt"]
    assert keys("key=order-4*") == ["order-43:receipt", "order-42:receipt"]
    assert keys("key=order-4") == []
    assert keys(f"id={a.id}") == ["order-42:receipt"]
    assert keys("status=sent") == ["order-43:receipt"]
    assert keys("code=21211") == ["order-42:receipt"]
    assert keys("provider=stub&status=pending") == ["signup-1:otp"]
    since = (utcnow() - dt.timedelta(days=1)).isoformat()
    assert "signup-1:otp" not in keys(f"since={since}")
    assert "+1555" not in get(client, "/messages").get_data(as_text=True)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/messages?status=sen", "status"),
        ("/messages?id=abc", "id"),
        ("/messages?since=yesterday", "since"),
        ("/messages?key=a*b*", "key"),
        ("/messages?before=abc", "before"),
        ("/dead?before=abc", "before"),
        ("/unknown?before=-1", "before"),
        ("/dead?since=yesterday", "since"),
    ],
)
def test_a_bad_filter_is_a_400_naming_the_field(client: FlaskClient, path: str, field: str) -> None:
    """A malformed filter or page mark answers 400 with the field named, on every list page,
    not a 500 or a list that silently ignores it."""
    response = get(client, path)
    assert response.status_code == 400
    assert f"{field}:" in response.get_data(as_text=True)


def test_search_pages_by_keyset(client: FlaskClient, session: Session) -> None:
    """120 messages come in three pages of 50, 50 and 20, newest first, each once."""
    for i in range(120):
        session.add(Message(**message_values(f"p-{i:03d}")))
    session.commit()
    seen: list[str] = []
    path = "/messages?key=p-*"
    while path:
        page = get(client, path).get_data(as_text=True)
        seen += re.findall(r'<td class="key"><a [^>]*>([^<]+)</a>', page)
        nxt = re.search(r'href="(/messages\?[^"]*before=[^"]*)">older', page)
        path = nxt.group(1).replace("&amp;", "&") if nxt else ""
    assert seen == [f"p-{i:03d}" for i in reversed(range(120))]


def test_message_page_opens_by_key_or_id_and_shows_the_timeline(
    client: FlaskClient, session: Session
) -> None:
    """``/messages/<key>`` and ``/messages/<id>`` open the message: masked recipient, its
    attempts with codes, what round and try count; no Flower link without
    DELIVERY_FLOWER_URL (the demo runs no Flower); an unknown ref is a 404."""
    message = add(session, "order-7:receipt", "dead", last_error_code="21211", attempts=1)
    # Stored as an older release stored it, before provider text was masked on write.
    error = f"The 'To' number {RECIPIENT} is not a valid phone number."
    add_attempt(
        session,
        message.id,
        "permanent",
        http_status=400,
        error_code="21211",
        latency_ms=12.0,
        error=error,
    )
    for ref in ("order-7:receipt", str(message.id)):
        page = get(client, f"/messages/{ref}").get_data(as_text=True)
        assert "order-7:receipt" in page and "21211" in page and "permanent" in page
        assert RECIPIENT not in page and "is not a valid phone number" in page
        assert "/task/" not in page and "Flower" not in page
        assert "try N: the message's attempt count at that call, across rounds" in page
    assert get(client, "/messages/nope").status_code == 404


def test_message_page_shows_each_attempts_provider_and_the_route(
    client: FlaskClient, session: Session
) -> None:
    """A message that failed over: its page has a route line (``primary → backup``), each
    attempt's provider in the timeline with a failover row between them, the provider that
    accepted it; one waiting on its next provider shows the failover with its stored reason,
    masked, and ``FAILOVER``; a pinned one says it never fails over."""
    add_failover(session, "fo-1")
    page = get(client, "/messages/fo-1").get_data(as_text=True)
    assert re.search(r"<th>route</th><td[^>]*>primary → backup<", page), page
    providers = re.findall(r"\(try \d\)</td><td class=\"mono\">(\w+)</td>", page)
    assert providers == ["primary", "backup", "backup"]
    rows = re.findall(r"<tr[^>]*>.*?</tr>", page)
    (moved,) = [i for i, row in enumerate(rows) if 'class="move"' in row]
    assert "failed over" in rows[moved] and "primary → backup" in rows[moved]
    assert "(try 1)" in rows[moved - 1] and "(try 2)" in rows[moved + 1]
    accepted = next(row for row in rows if "accepted" in row)
    assert '<td class="mono">backup</td>' in accepted
    assert "<th>pinned</th>" in page and RECIPIENT not in page

    add_failover(session, "fo-2", sent=False)
    page = get(client, "/messages/fo-2").get_data(as_text=True)
    assert re.search(r"<th>route</th><td[^>]*>primary → backup<", page), page
    (moved_row,) = [row for row in re.findall(r"<tr[^>]*>.*?</tr>", page) if "move" in row]
    assert "FAILOVER" in moved_row and "failed over from &#39;primary&#39;" in moved_row
    assert RECIPIENT not in page and "[recipient]" in moved_row

    add(session, "pin-2", "pending", attempts=1, pinned=True)
    page = get(client, "/messages/pin-2").get_data(as_text=True)
    assert "pinned to stub" in page and 'class="move"' not in page


def test_message_page_links_to_flower_when_its_url_is_configured(
    db_url: str, session: Session
) -> None:
    """With DELIVERY_FLOWER_URL the message page links to its task in that Flower, by key."""
    users = parse_users({"DELIVERY_CONSOLE_AUTH": f"{OPERATOR[0]}:{OPERATOR[1]}"})
    environ = {"DELIVERY_FLOWER_URL": "https://flower.example.com/"}
    application = create_app(settings=load_settings(), users=users, environ=environ)
    add(session, "order-8:receipt", "dead")
    page = get(application.test_client(), "/messages/order-8:receipt").get_data(as_text=True)
    assert 'href="https://flower.example.com/task/order-8%3Areceipt"' in page


def test_message_page_shows_its_trace_and_links_it_when_a_trace_url_is_set(
    db_url: str, session: Session
) -> None:
    """A message enqueued in a recorded span shows its trace id; with DELIVERY_TRACE_URL the
    id links there. A URL without ``{trace_id}``, or not http(s), is refused by name."""
    users = parse_users({"DELIVERY_CONSOLE_AUTH": f"{OPERATOR[0]}:{OPERATOR[1]}"})
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    add(session, "traced-1", "sent", traceparent=f"00-{trace}-00f067aa0ba902b7-01")
    add(session, "untraced-1", "sent")
    environ = {"DELIVERY_TRACE_URL": "https://jaeger.example/trace/{trace_id}"}
    application = create_app(settings=load_settings(), users=users, environ=environ)
    page = get(application.test_client(), "/messages/traced-1").get_data(as_text=True)
    assert f'href="https://jaeger.example/trace/{trace}"' in page
    plain = create_app(settings=load_settings(), users=users, environ={})
    page = get(plain.test_client(), "/messages/traced-1").get_data(as_text=True)
    assert trace in page and "jaeger" not in page
    page = get(plain.test_client(), "/messages/untraced-1").get_data(as_text=True)
    assert "· trace" not in page
    for bad in ("https://jaeger.example/trace/", "javascript:alert(1)//{trace_id}"):
        with pytest.raises(ConfigError) as refused:
            create_app(settings=load_settings(), users=users, environ={"DELIVERY_TRACE_URL": bad})
        assert refused.value.key == "DELIVERY_TRACE_URL"


def test_redrive_from_the_message_page_confirms_then_redrives_and_audits(
    client: FlaskClient, session: Session
) -> None:
    """The confirmation says the key is kept and changes nothing; the POST redrives, and an
    audit row (console:ann, dead -> pending) shows on the message page and on /audit."""
    message = add(session, "r-1:otp", "dead")
    confirm = get(client, f"/act/{message.id}/redrive").get_data(as_text=True)
    assert "same key" in confirm and "dedupe" in confirm
    assert status_of(session, "r-1:otp") == "dead"
    csrf = token(client, f"/act/{message.id}/redrive")
    response = post(client, f"/act/{message.id}/redrive", {"csrf_token": csrf})
    assert response.status_code == 303
    assert status_of(session, "r-1:otp") == "pending"
    (row,) = audit_rows(session)
    assert (row.actor, row.action, row.message_id, row.from_status, row.to_status) == (
        "console:ann",
        "redrive",
        message.id,
        "dead",
        "pending",
    )
    page = get(client, "/messages/r-1:otp").get_data(as_text=True)
    assert "redrive by console:ann" in page
    assert "console:ann" in get(client, "/audit").get_data(as_text=True)


def test_unknown_message_confirmation_says_a_lookup_runs_first(
    client: FlaskClient, session: Session
) -> None:
    """For an unknown message on a provider that can look keys up, the redrive confirmation
    says the provider is asked first; resolve as sent / dead are offered and audited."""
    message = add(session, "u-1", "unknown")
    page = get(client, "/messages/u-1").get_data(as_text=True)
    assert "Resolve as sent" in page and "Resolve as dead" in page
    assert "lookup runs first" in get(client, f"/act/{message.id}/redrive").get_data(as_text=True)
    csrf = token(client, f"/act/{message.id}/resolve-sent")
    post(client, f"/act/{message.id}/resolve-sent", {"csrf_token": csrf})
    assert status_of(session, "u-1") == "sent"
    assert [(r.action, r.from_status, r.to_status) for r in audit_rows(session)] == [
        ("resolve", "unknown", "sent")
    ]


def test_cancel_a_pending_message_and_not_a_sent_one(client: FlaskClient, session: Session) -> None:
    """Cancel applies to pending only: it is offered and audited there; for a sent message
    it is not offered and a forced POST changes nothing and writes no audit row."""
    pending = add(session, "x-1", "pending")
    sent = add(session, "x-2", "sent")
    assert "Cancel" not in get(client, "/messages/x-2").get_data(as_text=True)
    csrf = token(client, f"/act/{pending.id}/cancel")
    post(client, f"/act/{pending.id}/cancel", {"csrf_token": csrf})
    post(client, f"/act/{sent.id}/cancel", {"csrf_token": csrf})
    assert (status_of(session, "x-1"), status_of(session, "x-2")) == ("cancelled", "sent")
    assert [(r.message_key, r.action) for r in audit_rows(session)] == [("x-1", "cancel")]


def test_reveal_is_an_audited_operator_post(client: FlaskClient, session: Session) -> None:
    """The recipient appears only after an operator's reveal POST, which writes an audit
    row; a GET cannot reveal."""
    message = add(session, "secret-1", "sent")
    assert RECIPIENT not in get(client, "/messages/secret-1?reveal=1").get_data(as_text=True)
    csrf = token(client, "/messages/secret-1")
    shown = post(client, f"/act/{message.id}/reveal", {"csrf_token": csrf})
    assert RECIPIENT in shown.get_data(as_text=True)
    (row,) = audit_rows(session)
    assert (row.actor, row.action, row.message_key) == ("console:ann", "reveal", "secret-1")
    assert RECIPIENT not in (row.detail or "")


# --- bulk -----------------------------------------------------------------------------------


def test_bulk_redrive_counts_first_then_runs_with_progress(
    client: FlaskClient, session: Session, app: Flask
) -> None:
    """The dry run counts the matching dead messages and changes nothing; the run redrives
    exactly those (filtered by code), reports progress to the end, and audits each one."""
    for i in range(5):
        add(session, f"bulk-{i}", "dead", last_error_code="503" if i < 3 else "21211")
    confirm = get(client, "/bulk/redrive-dead?code=503").get_data(as_text=True)
    assert "<strong>3</strong> dead messages match" in confirm
    assert [status_of(session, f"bulk-{i}") for i in range(5)] == ["dead"] * 5
    csrf = token(client, "/bulk/redrive-dead?code=503")
    started = post(client, "/bulk/redrive-dead?code=503", {"csrf_token": csrf, "code": "503"})
    assert started.status_code == 303
    job_id = started.headers["Location"].rsplit("/", 1)[1]
    progress = app.extensions["delivery_console"].jobs.get(job_id)
    for _ in range(200):
        if progress.finished:
            break
        time.sleep(0.05)
    page = get(client, f"/jobs/{job_id}").get_data(as_text=True)
    assert "3 of 3 looked at" in page and "finished" in page
    assert [status_of(session, f"bulk-{i}") for i in range(5)] == ["pending"] * 3 + ["dead"] * 2
    assert sorted(r.message_key or "" for r in audit_rows(session)) == [
        "bulk-0",
        "bulk-1",
        "bulk-2",
    ]


def test_bulk_resolve_unknown_as_dead(client: FlaskClient, session: Session, app: Flask) -> None:
    """Bulk resolve on /unknown settles every matching unknown message and audits each."""
    add(session, "q-1", "unknown")
    add(session, "q-2", "unknown")
    csrf = token(client, "/bulk/resolve-dead")
    started = post(client, "/bulk/resolve-dead", {"csrf_token": csrf})
    job = app.extensions["delivery_console"].jobs.get(started.headers["Location"].rsplit("/", 1)[1])
    for _ in range(200):
        if job.finished:
            break
        time.sleep(0.05)
    assert (status_of(session, "q-1"), status_of(session, "q-2")) == ("dead", "dead")
    assert [r.action for r in audit_rows(session)] == ["resolve", "resolve"]


# --- breakers, audit, prune -----------------------------------------------------------------


def test_breakers_page_notes_in_process_breakers_without_shared_redis(client: FlaskClient) -> None:
    """Without DELIVERY_REDIS_URL (the embedded default, the demo) the page says, in a neutral
    note and not as a problem, that each worker keeps its own breakers."""
    page = get(client, "/breakers").get_data(as_text=True)
    assert '<p class="note">Each worker keeps its own breakers, in its process' in page
    assert 'class="problem"' not in page


def test_cli_repairs_are_audited_with_the_cli_actor(session: Session) -> None:
    """``delivery redrive`` writes an audit row whose actor is cli:$USER; the timeline then
    numbers the attempts across the redrive and places the redrive between them."""
    from click.testing import CliRunner

    from delivery.cli import main

    message = add(session, "cli-1", "dead", attempts=1)
    add_attempt(session, message.id, "permanent", -5)
    result = CliRunner().invoke(main, ["redrive", "cli-1"])
    assert result.exit_code == 0, result.output
    (row,) = audit_rows(session)
    assert row.actor == ops.cli_actor() and row.actor.startswith("cli:")
    add_attempt(session, message.id, "delivered", 1)
    shown, attempts = ops.show(session, "cli-1")
    events = ops.timeline(session, shown, attempts)
    assert [(e.round, e.seq, e.audit.action if e.audit else None) for e in events] == [
        (1, 1, None),
        (2, None, "redrive"),
        (2, 2, None),
    ]


def test_prune_removes_old_audit_rows_and_keeps_recent_ones(session: Session) -> None:
    """``delivery prune --older-than 30d`` deletes audit rows older than the cutoff, like the
    messages, and keeps the recent ones."""
    from click.testing import CliRunner

    from delivery.cli import main

    ops.record(session, actor="cli:old", action="redrive", at=utcnow() - dt.timedelta(days=40))
    ops.record(session, actor="cli:new", action="redrive")
    session.commit()
    result = CliRunner().invoke(main, ["prune", "--older-than", "30d", "--json"])
    assert result.exit_code == 0, result.output
    assert '"audit": 1' in result.output
    assert [r.actor for r in audit_rows(session)] == ["cli:new"]


def test_healthz_answers_without_credentials_and_reveals_nothing(
    client: FlaskClient, session: Session
) -> None:
    """``/healthz`` (for compose's health check) answers ``ok`` without credentials and holds
    no count, key or recipient."""
    add(session, "h-1", "dead")
    response = client.get("/healthz")
    assert (response.status_code, response.get_data(as_text=True)) == (200, "ok\n")


def test_overview_charts_are_reused_for_a_short_while() -> None:
    """The chart cache returns the stored value within its time-to-live and recomputes after
    it; the overview keeps the hour's charts at most 30 s and the day's at most 60 s."""
    from delivery.console.context import TimedCache
    from delivery.console.pages.overview import chart_ttl

    now = [0.0]
    cache = TimedCache(clock=lambda: now[0])
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert cache.get("k", 30.0, compute) == 1
    now[0] = 29.0
    assert cache.get("k", 30.0, compute) == 1
    now[0] = 30.5
    assert cache.get("k", 30.0, compute) == 2
    assert (chart_ttl(60.0), chart_ttl(900.0)) == (30.0, 60.0)


def test_bulk_actions_are_offered_only_when_something_matches(
    client: FlaskClient, session: Session
) -> None:
    """An empty /unknown (or a filter nothing matches) offers no "Resolve as dead all
    matching"; with a matching message the bulk actions are there."""
    assert "all matching" not in get(client, "/unknown").get_data(as_text=True)
    assert "all matching" not in get(client, "/dead").get_data(as_text=True)
    add(session, "m-1", "unknown", last_error_code="TIMEOUT")
    page = get(client, "/unknown").get_data(as_text=True)
    assert "Resolve as dead all matching" in page
    assert "all matching" not in get(client, "/unknown?code=NOPE").get_data(as_text=True)

"""The Twilio adapter against a stub of Twilio's Messages API over real HTTP."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from delivery.core.outcomes import (
    Absent,
    Delivered,
    Found,
    LookupFailed,
    Permanent,
    Retryable,
    Undeliverable,
    Unknown,
)
from delivery.errors import ConfigError
from delivery.providers import Envelope
from delivery.providers import twilio as twilio_module
from tests.provider_stubs import Recorded, Reply, TwilioStub, provider_from, twilio_error

SID = "AC0123456789abcdef0123456789abcdef"
SERVICE = "MG0123456789abcdef0123456789abcdef"
OPENAPI = json.loads((Path(__file__).parent / "data" / "twilio_messages_openapi.json").read_text())
TOKEN = "twilio-token-s3cr3t-7f1e"
FROM = "+15005550006"
TO = "+12015550123"


@pytest.fixture
def stub() -> Iterator[TwilioStub]:
    with TwilioStub(SID, TOKEN) as server:
        yield server


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_TWILIO_TOKEN", TOKEN)


def twilio(stub: TwilioStub, **extra: Any) -> Any:
    table = {
        "kind": "twilio",
        "base_url": stub.url,
        "account_sid": SID,
        "auth_token_env": "TEST_TWILIO_TOKEN",
        "from_number": FROM,
        **extra,
    }
    return provider_from(table, timeouts={"connect": 1, "read": 2, "write": 1, "pool": 1})


def sms(body: str = "Your code is 482901", to: str = TO, key: str = "otp-1") -> Envelope:
    return Envelope(key, "sms", to, {"body": body})


def test_send_is_a_form_post_with_basic_auth_and_the_sid_is_the_reference(
    stub: TwilioStub,
) -> None:
    """A send posts To/From/Body form-encoded to the account's Messages.json with basic auth,
    and the new message's sid comes back as the provider reference."""
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    [request] = stub.sent()
    assert request.path == f"/2010-04-01/Accounts/{SID}/Messages.json"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.form() == {"To": TO, "From": FROM, "Body": "Your code is 482901"}
    assert request.headers["authorization"] == (
        "Basic " + base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    )
    assert "idempotency-key" not in request.headers
    assert outcome == Delivered(stub.messages[0]["sid"], 201)
    assert outcome.provider_ref and outcome.provider_ref.startswith("SM")


def test_messaging_service_sid_replaces_from(stub: TwilioStub) -> None:
    """With messaging_service_sid configured the form carries MessagingServiceSid, not From."""
    table = {
        "kind": "twilio",
        "base_url": stub.url,
        "account_sid": SID,
        "auth_token_env": "TEST_TWILIO_TOKEN",
        "messaging_service_sid": SERVICE,
    }
    provider = provider_from(table)
    assert isinstance(provider.send(sms()), Delivered)
    provider.close()
    assert stub.sent()[0].form() == {
        "To": TO,
        "MessagingServiceSid": SERVICE,
        "Body": sms().payload["body"],
    }


# The create call's synchronous codes, as Twilio documents them: (code, HTTP status, outcome).
CREATE_CODES = [
    (20003, 401, Permanent),
    (20404, 404, Permanent),
    (20429, 429, Retryable),
    (21211, 400, Permanent),
    (21212, 400, Permanent),
    (21408, 400, Permanent),
    (21602, 400, Permanent),
    (21603, 400, Permanent),
    (21604, 400, Permanent),
    (21606, 400, Permanent),
    (21608, 400, Permanent),
    (21610, 400, Permanent),
    (21611, 400, Retryable),
    (21612, 400, Permanent),
    (21614, 400, Permanent),
    (21617, 400, Permanent),
]


def test_the_create_code_tables_are_exactly_the_tested_rows() -> None:
    """Every code in the adapter's create-call tables has a row here and the other way round;
    no 30xxx delivery error and no voice code (21214) is among them."""
    tables = {**twilio_module.PERMANENT_CODES, **twilio_module.RETRYABLE_CODES}
    assert sorted(tables) == [code for code, _, _ in CREATE_CODES]
    assert set(twilio_module.RETRYABLE_CODES) == {c for c, _, k in CREATE_CODES if k is Retryable}
    assert not [code for code in tables if code >= 30000 or code == 21214]


@pytest.mark.parametrize(("code", "status", "kind"), CREATE_CODES, ids=lambda v: str(v))
def test_create_code(stub: TwilioStub, code: int, status: int, kind: type) -> None:
    """One row of the create-call table: Twilio's error answer with this code is this outcome,
    carrying the code and Twilio's message as the reason."""
    stub.push(twilio_error(code, f"Twilio says {code}", status))
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert type(outcome) is kind
    assert (outcome.code, outcome.reason, outcome.http_status) == (  # type: ignore[union-attr]
        str(code),
        f"Twilio says {code}",
        status,
    )


HTTP_ROWS = [
    # (answer, outcome class, code, retry_after)
    (
        Reply(
            429, twilio_error(20429, "Too Many Requests", 429).json, headers={"Retry-After": "7"}
        ),
        Retryable,
        "20429",
        7.0,
    ),
    # 500/502/504 came after the request was written: the SMS may exist (unknown -> lookup).
    (twilio_error(20500, "Internal Server Error", 500), Unknown, "20500", None),
    (twilio_error(20503, "Service Unavailable", 503), Retryable, "20503", None),
    (
        Reply(502, body="<html>Bad Gateway</html>", content_type="text/html"),
        Unknown,
        "HTTP_502",
        None,
    ),
    (Reply(504, body="Gateway Timeout", content_type="text/plain"), Unknown, "HTTP_504", None),
    (Reply(408, body="timeout"), Retryable, "HTTP_408", None),
    (twilio_error(21999, "Some other invalid parameter"), Permanent, "21999", None),
    (twilio_error(30005, "Unknown destination handset"), Permanent, "30005", None),
    (Reply(201, {"status": "queued"}), Unknown, "NO_PROVIDER_REF", None),
]


@pytest.mark.parametrize(("answer", "kind", "code", "retry_after"), HTTP_ROWS)
def test_outcome_by_http_status(
    stub: TwilioStub, answer: Reply, kind: type, code: str, retry_after: float | None
) -> None:
    """Answers outside the code tables go by HTTP status: 408/429/503 retry (Retry-After
    honoured), 500/502/504 are unknown (written: the SMS may exist), another 4xx is
    permanent with its code (a 30xxx the create call should never answer included), a 2xx
    without a sid is unknown."""
    stub.push(answer)
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert type(outcome) is kind
    assert outcome.code == code  # type: ignore[union-attr]
    assert outcome.http_status == answer.status
    if kind is Retryable:
        assert outcome.retry_after == retry_after  # type: ignore[union-attr]


def test_wrong_token_is_permanent_20003(stub: TwilioStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token Twilio rejects (its real 401 answer, code 20003) is permanent."""
    monkeypatch.setenv("TEST_TWILIO_TOKEN", "wrong")
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert outcome == Permanent("20003", "Authenticate", 401)
    assert stub.messages == []


def test_missing_token_fails_without_calling_twilio(
    stub: TwilioStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the token's variable unset, the send is permanent NO_CREDENTIALS and nothing is sent."""
    monkeypatch.delenv("TEST_TWILIO_TOKEN")
    provider = twilio(stub)
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Permanent) and outcome.code == "NO_CREDENTIALS"
    assert "TEST_TWILIO_TOKEN" in outcome.reason
    assert stub.requests == []


def test_lost_answer_is_unknown_and_lookup_finds_the_message(stub: TwilioStub) -> None:
    """An answer lost after Twilio created the message is unknown; the lookup then finds that
    message by recipient and body, so the policy marks it sent instead of sending twice."""
    stub.push(Reply(drop=True))
    provider = twilio(stub)
    outcome = provider.send(sms())
    assert isinstance(outcome, Unknown)
    assert len(stub.messages) == 1
    found = provider.lookup(sms())
    provider.close()
    assert found == Found(stub.messages[0]["sid"], 200)
    [query] = stub.sent("GET")
    assert query.query["To"] == [TO] and query.query["From"] == [FROM]
    assert "DateSent>" not in str(query.query)


def test_lookup_is_absent_when_nothing_matches(stub: TwilioStub) -> None:
    """Nothing to that number, another body, or our body outside the window: absent."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
    stub.add_message(TO, "Your code is 482901", old, FROM)  # same body, outside a 1 h window
    stub.add_message(TO, "Your code is 111111", dt.datetime.now(dt.UTC), FROM)
    stub.add_message("+12015550999", "Your code is 482901", dt.datetime.now(dt.UTC), FROM)
    provider = twilio(stub, lookup_window=3600)
    assert provider.lookup(sms()) == Absent(200)
    assert provider.lookup(sms(to="+12015550777")) == Absent(200)
    provider.close()


def test_lookup_matches_a_trial_account_prefix(stub: TwilioStub) -> None:
    """A trial account's prefixed body still matches ours."""
    message = stub.add_message(
        TO,
        "Sent from your Twilio trial account - Your code is 482901",
        dt.datetime.now(dt.UTC),
        FROM,
    )
    provider = twilio(stub)
    assert provider.lookup(sms()) == Found(message["sid"], 200)
    provider.close()


def test_lookup_follows_pages_and_gives_up_past_its_limit() -> None:
    """The lookup follows next_page_uri to an older message; more pages than lookup_pages
    inside the window is a failed lookup (looked again later), not absent."""
    with TwilioStub(SID, TOKEN, page_size_cap=2) as stub:
        now = dt.datetime.now(dt.UTC)
        ours = stub.add_message(TO, "Your code is 482901", now - dt.timedelta(minutes=9), FROM)
        for i in range(5):
            stub.add_message(TO, f"later {i}", now - dt.timedelta(minutes=5 - i), FROM)
        provider = twilio(stub)
        assert provider.lookup(sms()) == Found(ours["sid"], 200)
        assert len(stub.sent("GET")) == 3
        provider.close()
        short = twilio(stub, lookup_pages=2)
        failed = short.lookup(sms())
        short.close()
        assert isinstance(failed, LookupFailed) and failed.code == "LOOKUP_BUDGET"


def test_lookup_failure_is_reported(stub: TwilioStub) -> None:
    """A list query answered 503 is a failed lookup carrying Twilio's code."""
    stub.push(twilio_error(20503, "Service Unavailable", 503), method="GET")
    provider = twilio(stub)
    failed = provider.lookup(sms())
    provider.close()
    assert failed == LookupFailed("20503", "list query: Service Unavailable", 503)


def test_read_timeout_is_unknown_and_refused_connection_is_retryable(stub: TwilioStub) -> None:
    """Per-phase timeouts: an answer slower than the read timeout is unknown (the SMS may
    exist); a refused connection is retryable (nothing was sent)."""
    stub.push(Reply(delay=1.0))
    provider = provider_from(
        {
            "kind": "twilio",
            "base_url": stub.url,
            "account_sid": SID,
            "auth_token_env": "TEST_TWILIO_TOKEN",
            "from_number": FROM,
            "timeouts": {"read": 0.2},
        }
    )
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Unknown) and outcome.code == "NETWORK_ReadTimeout"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    provider = provider_from(
        {
            "kind": "twilio",
            "base_url": f"http://127.0.0.1:{closed}",
            "account_sid": SID,
            "auth_token_env": "TEST_TWILIO_TOKEN",
            "from_number": FROM,
        }
    )
    outcome = provider.send(sms())
    provider.close()
    assert isinstance(outcome, Retryable) and outcome.code == "NETWORK_ConnectError"


def test_the_token_is_never_logged(stub: TwilioStub, caplog: pytest.LogCaptureFixture) -> None:
    """Sends, errors and lookups at DEBUG log level never print the auth token, nor do the
    outcomes or the settings' repr."""
    caplog.set_level(logging.DEBUG)
    stub.push(twilio_error(21211, "bad number"), Reply(drop=True))
    provider = twilio(stub)
    outcomes = [
        provider.send(sms()),
        provider.send(sms()),
        provider.send(sms()),
        provider.lookup(sms()),
    ]
    provider.close()
    assert caplog.records, "nothing was logged: the check would prove nothing"
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(outcomes)
    assert TOKEN not in repr(provider.__dict__)


# --- what a lookup concludes from the message Twilio lists -----------------------------------

NOW = dt.datetime.now(dt.UTC)
# (status, error_code, outcome, code): one row of the lookup table each.
LOOKUP_ROWS = [
    ("accepted", None, Found, None),
    ("scheduled", None, Found, None),
    ("queued", None, Found, None),
    ("sending", None, Found, None),
    ("sent", None, Found, None),
    ("delivered", None, Found, None),
    ("read", None, Found, None),
    ("partially_delivered", None, Found, None),
    ("canceled", None, Undeliverable, "CANCELED"),
    ("failed", None, Absent, None),
    ("undelivered", None, Absent, None),
    ("failed", 30001, Absent, None),
    ("undelivered", 30003, Absent, None),
    ("undelivered", 30008, Absent, None),
    ("failed", 30002, Undeliverable, "30002"),
    ("undelivered", 30004, Undeliverable, "30004"),
    ("undelivered", 30005, Undeliverable, "30005"),
    ("undelivered", 30006, Undeliverable, "30006"),
    ("undelivered", 30007, Undeliverable, "30007"),
    ("undelivered", 30034, Undeliverable, "30034"),  # in neither table: not known transient
    ("received", None, Absent, None),  # an inbound message is never ours
    ("receiving", None, Absent, None),
    ("on_hold", None, LookupFailed, "LOOKUP_STATUS"),  # not a status Twilio documents
]


def test_the_lookup_rows_cover_every_documented_status_and_delivery_code() -> None:
    """Each status of Twilio's published enum and each code of the delivery-error tables has
    a row in LOOKUP_ROWS."""
    statuses = {status for status, _, _, _ in LOOKUP_ROWS}
    assert set(OPENAPI["message_status"]) <= statuses
    codes = {code for _, code, _, _ in LOOKUP_ROWS}
    assert set(twilio_module.RESEND_CODES) | set(twilio_module.UNDELIVERABLE_CODES) <= codes


@pytest.mark.parametrize(("status", "error_code", "kind", "code"), LOOKUP_ROWS)
def test_lookup_row(
    stub: TwilioStub, status: str, error_code: int | None, kind: type, code: str | None
) -> None:
    """One row of the lookup table: our message listed with this status and error code gives
    this lookup outcome (Found carries its sid; Undeliverable its code and sid)."""
    direction = "inbound" if status in ("received", "receiving") else "outbound-api"
    message = stub.add_message(TO, "Your code is 482901", NOW, FROM, status=status)
    message.update(error_code=error_code, direction=direction)
    provider = twilio(stub)
    outcome = provider.lookup(sms())
    provider.close()
    assert type(outcome) is kind
    if kind is Found:
        assert outcome == Found(message["sid"], 200)
    if kind is Undeliverable:
        assert (outcome.code, outcome.provider_ref) == (code, message["sid"])  # type: ignore[union-attr]
        assert TO not in outcome.reason  # type: ignore[union-attr]
    if kind is LookupFailed:
        assert outcome.code == code  # type: ignore[union-attr]


def test_lookup_prefers_a_message_that_reached_the_user(stub: TwilioStub) -> None:
    """Several matches: a delivered one wins over an earlier failure (Found), and a permanent
    delivery error wins over a transient one (dead, not another resend)."""
    stub.add_message(TO, "Your code is 482901", NOW, FROM, status="undelivered", error_code=30005)
    ours = stub.add_message(TO, "Your code is 482901", NOW, FROM, status="delivered", sent=NOW)
    provider = twilio(stub)
    assert provider.lookup(sms()) == Found(ours["sid"], 200)
    stub.messages.remove(ours)
    stub.add_message(TO, "Your code is 482901", NOW, FROM, status="undelivered", error_code=30003)
    outcome = provider.lookup(sms())
    provider.close()
    assert isinstance(outcome, Undeliverable) and outcome.code == "30005"


def test_lookup_depends_on_no_order_of_the_list(stub: TwilioStub) -> None:
    """Twilio sorts by date_sent and a queued message has none: ours (queued, created now) is
    listed after an older message created outside the window. The lookup reads on past it and
    finds ours, where stopping at the first old message would have sent a duplicate."""
    three_hours_ago = NOW - dt.timedelta(hours=3)
    stub.add_message(TO, "older", three_hours_ago, FROM, status="delivered", sent=three_hours_ago)
    ours = stub.add_message(TO, "Your code is 482901", NOW, FROM)
    listed = [m["sid"] for m in stub._list(_get({"To": TO})).json["messages"]]
    assert listed.index(ours["sid"]) > 0, "the stub must list ours after the older one"
    provider = twilio(stub, lookup_window=3600)
    assert provider.lookup(sms()) == Found(ours["sid"], 200)
    provider.close()


def test_lookup_budget_is_found_or_failed_never_absent() -> None:
    """Past lookup_pages pages: ours found within the budget is Found; ours not found within
    it is LOOKUP_BUDGET (looked again later), even when an earlier page held a transient
    failure of ours; with the whole list read, the same list is Absent."""
    with TwilioStub(SID, TOKEN, page_size_cap=2) as stub:
        stub.add_message(TO, "Your code is 482901", NOW, FROM, status="failed", error_code=30003)
        for i in range(5):
            stub.add_message(TO, f"other {i}", NOW, FROM)
        short = twilio(stub, lookup_pages=2)
        failed = short.lookup(sms())
        short.close()
        assert isinstance(failed, LookupFailed) and failed.code == "LOOKUP_BUDGET"
        assert len(stub.sent("GET")) == 2
        whole = twilio(stub, lookup_pages=3)
        assert whole.lookup(sms()) == Absent(200)
        whole.close()
        ours = stub.add_message(TO, "Your code is 482901", NOW, FROM)  # listed first
        again = twilio(stub, lookup_pages=1)
        assert again.lookup(sms()) == Found(ours["sid"], 200)
        again.close()


def _get(query: dict[str, str]) -> Recorded:
    return Recorded("GET", "/", {k: [v] for k, v in query.items()}, {}, b"")


# --- every request against Twilio's published API ---------------------------------------------

E164 = re.compile(r"\+[1-9][0-9]{1,14}")


def _check_value(where: str, value: str, schema: dict[str, Any]) -> None:
    assert schema.get("type") in ("string", "integer"), f"{where}: type {schema.get('type')}"
    if schema["type"] == "integer":
        assert value.isdigit(), f"{where}: {value!r} is not an integer"
        assert int(value) >= schema.get("minimum", 0), where
        assert int(value) <= schema.get("maximum", 2**63), where
        return
    if "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{where}: {value!r} !~ {schema['pattern']}"
    if schema.get("format") == "phone-number":
        assert E164.fullmatch(value), f"{where}: {value!r} is not E.164"
    assert len(value) >= schema.get("minLength", 0), f"{where}: {len(value)} characters"
    assert len(value) <= schema.get("maxLength", len(value)), f"{where}: {len(value)} characters"


def validate(request: Recorded) -> str:
    """Check one recorded request against the OpenAPI fixture; return its operationId."""
    template = OPENAPI["path"]
    pattern = "^" + re.escape(template).replace(re.escape("{AccountSid}"), "([^/]+)") + "$"
    path = urlsplit(request.path).path
    match = re.match(pattern, path)
    assert match, f"{path} is not {template}"
    operation = OPENAPI[request.method.lower()]
    for parameter in operation["parameters"]:
        if parameter["in"] == "path":
            _check_value(parameter["name"], match.group(1), parameter["schema"])
    if request.method == "POST":
        body = operation["requestBody"]
        assert request.headers["content-type"] == body["content_type"]
        form = {k: v for k, v in parse_qs(request.body.decode(), keep_blank_values=True).items()}
        for name in body["required"]:
            assert name in form, f"{name} is required"
        for name, values in form.items():
            assert name in body["properties"], f"form field {name} is not in CreateMessage"
            assert len(values) == 1, name
            _check_value(name, values[0], body["properties"][name])
    else:
        known = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
        query = dict(request.query)
        query.update(parse_qs(urlsplit(request.path).query))
        for name, values in query.items():
            assert name in known, f"query parameter {name} is not in ListMessage"
            assert len(values) == 1, name
            _check_value(name, values[0], known[name]["schema"])
    return str(operation["operationId"])


def test_every_request_matches_twilios_openapi_description() -> None:
    """Each request the adapter sends (create with From, create with a Messaging Service,
    a lookup over several pages following next_page_uri) has the path, form fields and query
    parameters of Twilio's published CreateMessage and ListMessage operations."""
    assert OPENAPI["servers"] == [{"url": twilio_module.TwilioProvider.default_base_url}]
    with TwilioStub(SID, TOKEN, page_size_cap=2) as stub:
        for i in range(5):
            stub.add_message(TO, f"other {i}", NOW, FROM)
        provider = twilio(stub)
        provider.send(sms())
        provider.lookup(sms(body="not there"))
        provider.close()
        table = {
            "kind": "twilio",
            "base_url": stub.url,
            "account_sid": SID,
            "auth_token_env": "TEST_TWILIO_TOKEN",
            "messaging_service_sid": SERVICE,
        }
        service = provider_from(table)
        service.send(sms())
        service.lookup(sms(body="not there"))
        service.close()
        operations = [validate(request) for request in stub.requests]
    assert operations.count("CreateMessage") == 2
    assert operations.count("ListMessage") >= 4  # two lookups, each over several pages


def test_the_validator_rejects_what_twilio_would() -> None:
    """The check above can fail: an unknown form field, a malformed sid or phone number, and
    a PageSize over 1000 are each refused."""
    path = f"/2010-04-01/Accounts/{SID}/Messages.json"
    form = {"content-type": "application/x-www-form-urlencoded"}
    bad = [
        Recorded("POST", path, {}, form, b"To=%2B12015550123&Text=hi"),
        Recorded("POST", path, {}, form, b"To=%2B12015550123&MessagingServiceSid=MG12&Body=x"),
        Recorded("POST", path, {}, form, b"To=12015550123&From=%2B15005550006&Body=x"),
        Recorded("POST", path.replace(SID, "AC123"), {}, form, b"To=%2B12015550123&Body=x"),
        Recorded("GET", path, {"To": [TO], "PageSize": ["5000"]}, {}, b""),
        Recorded("GET", path, {"To": [TO], "DateCreated>": ["2026-01-01"]}, {}, b""),
    ]
    for request in bad:
        with pytest.raises(AssertionError):
            validate(request)


# --- start-up checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("account_sid", "AC0123"),
        ("account_sid", "ac0123456789abcdef0123456789abcdef"),
        ("account_sid", "AC0123456789abcdef0123456789abcdeg"),
        ("account_sid", "MG0123456789abcdef0123456789abcdef"),
        ("messaging_service_sid", "MG0123"),
        ("messaging_service_sid", "AC0123456789abcdef0123456789abcdef"),
        ("messaging_service_sid", "MG0123456789abcdef0123456789abcdef0"),
    ],
)
def test_a_malformed_sid_fails_at_start_up_naming_the_key(key: str, value: str) -> None:
    """account_sid must be AC + 32 hex characters and messaging_service_sid MG + 32: anything
    else is a ConfigError naming providers.p.<key>, before any message is sent."""
    table: dict[str, Any] = {
        "kind": "twilio",
        "base_url": "http://127.0.0.1:9",
        "account_sid": SID,
        "auth_token_env": "TEST_TWILIO_TOKEN",
    }
    if key == "account_sid":
        table.update(account_sid=value, from_number=FROM)
    else:
        table[key] = value
    with pytest.raises(ConfigError) as error:
        provider_from(table)
    assert error.value.key == f"providers.p.{key}"
    assert "32 hex characters" in error.value.problem

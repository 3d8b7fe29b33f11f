"""The Django integration over real PostgreSQL, worker, beat and stub: examples/django_app.

Django is configured here, from the example's settings module (whose database is
``DELIVERY_DATABASE_URL``, the suite's database as set by conftest), plus the test client's
host. No pytest-django: the tests use the outbox database directly, as the worker does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings

from examples.django_app import settings as example_settings

if not settings.configured:
    values = {name: getattr(example_settings, name) for name in dir(example_settings)}
    values["ALLOWED_HOSTS"] = ["testserver"]
    settings.configure(**{name: value for name, value in values.items() if name.isupper()})
    django.setup()

from django.apps import apps
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client, TestCase, override_settings
from sqlalchemy import Engine, create_engine, text

import delivery
from delivery.contrib.django import enqueue
from delivery.contrib.django import models as django_models
from delivery.contrib.django.connection import sqlalchemy_url
from delivery.core.models import Attempt, AuditEntry, Message, Receipt
from tests.conftest import PG_URL, drained
from tests.test_startup import scratch_database

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration
ADMIN = "/admin/delivery_outbox/message/"


@pytest.fixture(scope="module")
def django_db(pg_engine: Engine) -> Iterator[None]:
    """Django's own tables (auth, sessions, admin) in the suite's database."""
    call_command("migrate", interactive=False, verbosity=0)
    yield
    connection.close()


@pytest.fixture
def db(django_db: None, clean: Engine) -> Engine:
    """An empty outbox, no users, and a clean stub."""
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE auth_user CASCADE"))
    return clean


@pytest.fixture
def admin_client(db: Engine) -> Client:
    user = User.objects.create_superuser("ops", "ops@example.com", password=None)
    client = Client()
    client.force_login(user)
    return client


def keys(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(text("SELECT key FROM delivery_messages ORDER BY id")))


def status_of(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.scalar(text("SELECT status FROM delivery_messages WHERE key = :k"), {"k": key})
        )


def family(kind: str) -> str:
    """A column type family shared by Django's internal types and SQLAlchemy's types."""
    return {
        "BigAutoField": "bigint",
        "BigInteger": "bigint",
        "ForeignKey": "bigint",
        "BigIntegerField": "bigint",
        "CharField": "string",
        "String": "string",
        "TextField": "text",
        "Text": "text",
        "IntegerField": "integer",
        "Integer": "integer",
        "BooleanField": "boolean",
        "Boolean": "boolean",
        "DateTimeField": "datetime",
        "UTCDateTime": "datetime",
        "FloatField": "float",
        "Float": "float",
        "JSONField": "json",
        "JSON": "json",
    }[kind]


@pytest.mark.parametrize(
    ("django_model", "table"),
    [
        (django_models.Message, Message.__table__),
        (django_models.Attempt, Attempt.__table__),
        (django_models.AuditEntry, AuditEntry.__table__),
        (django_models.Receipt, Receipt.__table__),
    ],
)
def test_unmanaged_models_match_the_sqlalchemy_columns(django_model: Any, table: Any) -> None:
    """Every Django field has its SQLAlchemy column with the same type, length, nullability and
    uniqueness, and the other way round; Django manages none of the tables."""
    assert django_model._meta.managed is False
    assert django_model._meta.db_table == table.name
    fields = {}
    for field in django_model._meta.concrete_fields:
        kind = "ForeignKey" if field.is_relation else field.get_internal_type()
        if isinstance(field, django_models.PayloadField):
            kind = "JSONField"
        fields[field.column] = (
            family(kind),
            getattr(field, "max_length", None) if kind == "CharField" else None,
            field.null,
            field.unique,
        )
    unique_alone = {  # a unique index on one column is that column's uniqueness (the key's)
        index.columns[0].name for index in table.indexes if index.unique and len(index.columns) == 1
    }
    columns = {}
    for column in table.columns:
        kind = type(column.type).__name__
        if kind == "BigInteger":  # BigInteger with an SQLite variant
            kind = "BigInteger"
        columns[column.name] = (
            family(kind),
            column.type.length if kind == "String" else None,
            column.nullable and not column.primary_key,
            bool(column.unique) or column.primary_key or column.name in unique_alone,
        )
    assert fields == columns


def test_models_read_the_tables_delivery_db_upgrade_created(db: Engine) -> None:
    """The tables the Alembic migration created have exactly the models' columns, and a message
    enqueued through SQLAlchemy reads back through the Django model with its payload."""
    with connection.cursor() as cursor:
        for model in (django_models.Message, django_models.Attempt, django_models.Receipt):
            described = connection.introspection.get_table_description(cursor, model._meta.db_table)
            assert {c.name for c in described} == {f.column for f in model._meta.concrete_fields}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        enqueue(channel="sms", to="+12015550100", payload={"body": "hi"}, key="rb", send_at=later)
    message = django_models.Message.objects.get(key="rb")
    assert (message.status, message.payload, message.attempts) == ("pending", {"body": "hi"}, 0)
    assert message.next_attempt_at == later


def test_commit_runs_the_nudge_at_once(db: Engine) -> None:
    """Right after the outermost commit the message is no longer pending: the on_commit nudge
    claimed and published it, without waiting for the beat relay."""
    with transaction.atomic():
        message = enqueue(channel="sms", to="+12015550106", payload={"body": "now"})
        assert status_of(db, message.key) == "None"  # not visible outside the transaction
    assert status_of(db, message.key) != "pending"


def test_app_reads_django_settings_then_environment_then_databases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DELIVERY_* Django settings win over the environment, and without DELIVERY_DATABASE_URL
    the outbox is DATABASES["default"] as a SQLAlchemy URL."""
    assert sqlalchemy_url("default") == PG_URL
    monkeypatch.delenv("DELIVERY_DATABASE_URL")
    monkeypatch.setenv("DELIVERY_HOME", "/from-environment")
    before = delivery.get_settings()
    try:
        with override_settings(DELIVERY_HOME="/from-django-settings"):
            apps.get_app_config("delivery_outbox").ready()
        settings = delivery.get_settings()
        assert settings.database_url == PG_URL
        assert settings.home == "/from-django-settings"
        assert settings.broker_url == before.broker_url
    finally:
        delivery.configure(None)  # the environment's settings, read again when next needed


def test_migration_state_matches_the_models(django_db: None) -> None:
    """The shipped state-only migration agrees with the models (makemigrations has nothing)."""
    call_command("makemigrations", "delivery_outbox", check=True, dry_run=True, verbosity=0)


def test_rollback_leaves_no_message_and_savepoint_rollback_only_its_own(db: Engine) -> None:
    """enqueue writes in Django's transaction: a rolled-back atomic block leaves no row, and a
    rolled-back inner block drops only its message while the outer one commits."""
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue(channel="sms", to="+12015550101", payload={"body": "x"}, key="rolled-back")
        assert django_models.Message.objects.filter(key="rolled-back").exists()
        raise RuntimeError("the view failed after enqueue")
    assert keys(db) == []

    with transaction.atomic():
        enqueue(channel="sms", to="+12015550102", payload={"body": "x"}, key="outer")
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue(channel="sms", to="+12015550103", payload={"body": "x"}, key="inner")
            raise RuntimeError("inner block failed")
    assert keys(db) == ["outer"]


def test_enqueue_registers_the_nudge_with_on_commit_and_keeps_enqueue_rules(db: Engine) -> None:
    """A new message registers one on_commit callback (the nudge); the same key and payload
    returns the same message; another payload raises IdempotencyConflict; bad input raises
    InvalidMessage naming the field, and the transaction stays usable."""
    with transaction.atomic():
        with TestCase.captureOnCommitCallbacks() as callbacks:
            first = enqueue(channel="sms", to="+12015550104", payload={"body": "a"}, key="k1")
        assert len(callbacks) == 1
        again = enqueue(channel="sms", to="+12015550104", payload={"body": "a"}, key="k1")
        assert again.id == first.id
        with pytest.raises(delivery.IdempotencyConflict):
            enqueue(channel="sms", to="+12015550104", payload={"body": "b"}, key="k1")
        with pytest.raises(delivery.InvalidMessage) as error:
            enqueue(channel="sms", to="12345", payload={"body": "a"})
        assert error.value.field == "to"
        assert User.objects.count() == 0  # the connection still works
        transaction.set_rollback(True)
    assert keys(db) == []


def test_view_with_bad_recipient_rolls_back_the_user(db: Engine) -> None:
    """The example view answers 400 naming field "to" and keeps neither user nor message."""
    response = Client().post(
        "/signup/", data=json.dumps({"email": "nope"}), content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["field"] == "to"
    assert User.objects.count() == 0
    assert keys(db) == []


def test_view_commits_user_and_message_and_a_real_worker_delivers_it(
    db: Engine, live: Engine, stub
) -> None:  # type: ignore[no-untyped-def]
    """POST /signup/ commits the user and the welcome email; the worker sends it once."""
    response = Client().post(
        "/signup/", data=json.dumps({"email": "ann@example.com"}), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    key = response.json()["message_key"]
    assert key == f"signup-{response.json()['id']}:welcome"
    assert User.objects.filter(email="ann@example.com").exists()
    assert drained(live, 1, timeout=30) == {"sent": 1}
    assert stub.effects() == {key: 1}


def test_admin_filters_by_status_and_redrive_sends_a_dead_message(
    admin_client: Client, live: Engine, stub
) -> None:  # type: ignore[no-untyped-def]
    """The admin lists dead messages under the status filter, masks recipients, and its
    redrive action puts a dead message back to pending with the same key: it is then sent."""
    stub.set_faults(rules={"bounce@example.com": {"status": 400, "json": {"code": "REJECTED"}}})
    with transaction.atomic():
        dead = enqueue(channel="email", to="bounce@example.com", payload={"text": "a"}).key
        sent = enqueue(channel="email", to="fine@example.com", payload={"text": "b"}).key
    assert drained(live, 2, timeout=30) == {"dead": 1, "sent": 1}

    page = admin_client.get(ADMIN, {"status__exact": "dead"}).content.decode()
    assert dead in page and sent not in page
    assert "bounce@example.com" not in page and "b*****@example.com" in page
    detail = admin_client.get(f"{ADMIN}{django_models.Message.objects.get(key=dead).pk}/change/")
    assert detail.status_code == 200 and "bounce@example.com" not in detail.content.decode()

    stub.set_faults(rules={})
    ids = list(django_models.Message.objects.values_list("pk", flat=True))
    response = admin_client.post(
        ADMIN, {"action": "redrive", "_selected_action": ids, "index": 0}, follow=True
    )
    page = response.content.decode()
    assert "Redrove 1 message(s)." in page
    assert f"Not redriven {sent}" in page
    assert drained(live, 2, timeout=30) == {"sent": 2}
    assert stub.effects() == {dead: 1, sent: 1}
    attempts = django_models.Attempt.objects.filter(message__key=dead)
    assert [a.outcome for a in attempts] == ["permanent", "delivered"]


def test_admin_cancel_cancels_pending_only(admin_client: Client, db: Engine) -> None:
    """The cancel action moves a pending message to cancelled, with an audit row naming the
    admin user, and refuses one that is not pending any more (no second row)."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        message = enqueue(channel="sms", to="+12015550105", payload={"body": "x"}, send_at=later)
    data = {"action": "cancel", "_selected_action": [message.id], "index": 0}
    page = admin_client.post(ADMIN, data, follow=True).content.decode()
    assert "Cancelled 1 message(s)." in page
    assert status_of(db, message.key) == "cancelled"
    page = admin_client.post(ADMIN, data, follow=True).content.decode()
    assert f"Not cancelled {message.key}: message is already cancelled" in page
    assert status_of(db, message.key) == "cancelled"
    audit = list(django_models.AuditEntry.objects.filter(message_key=message.key))
    assert [(a.action, a.from_status, a.to_status) for a in audit] == [
        ("cancel", "pending", "cancelled")
    ]
    assert audit[0].actor.startswith("admin:")


def change_form(page: str) -> dict[str, Any]:
    """What a browser would post back from a change page: every named input with its value
    (the read-only fields have none), plus the Save button's name."""
    import re

    data: dict[str, Any] = {}
    for tag in re.findall(r"<input[^>]*>", page):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and 'type="submit"' not in tag:
            data[name.group(1)] = value.group(1) if value else ""
    data.update(status="pending", _save="Save")
    return data


@pytest.mark.parametrize("concurrent", ["cancel", "worker sent"])
def test_admin_save_never_overwrites_a_transition_committed_while_the_page_was_open(
    admin_client: Client, db: Engine, monkeypatch: pytest.MonkeyPatch, concurrent: str
) -> None:
    """The change page offers no Save; posting its form anyway, while another transaction
    commits a cancel (or a worker's sending -> sent) between the admin loading the row and
    acting on it, is refused with 403 and the committed status is kept."""
    from django.contrib import admin

    from delivery import ops
    from delivery.runtime.db import make_sessionmaker

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        message = enqueue(channel="sms", to="+12015550107", payload={"body": "x"}, send_at=later)
    if concurrent == "worker sent":
        with db.begin() as conn:  # a worker has claimed it and is calling the provider
            conn.execute(
                text("UPDATE delivery_messages SET status = 'sending', attempts = 1 WHERE id = :i"),
                {"i": message.id},
            )
    url = f"{ADMIN}{message.id}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert "+12015550107" not in html

    model_admin = admin.site._registry[django_models.Message]
    original = model_admin.get_object

    def get_object_then_commit_elsewhere(*args: Any, **kwargs: Any) -> Any:
        obj = original(*args, **kwargs)  # the admin holds the row as it was
        if concurrent == "cancel":
            with make_sessionmaker(db)() as other, other.begin():
                assert ops.cancel(other, message.key).cancelled
        else:
            with db.begin() as conn:  # the worker's conditional sending -> sent
                conn.execute(
                    text(
                        "UPDATE delivery_messages SET status = 'sent', sent_at = now() "
                        "WHERE id = :i AND status = 'sending' AND attempts = 1"
                    ),
                    {"i": message.id},
                )
        return obj

    monkeypatch.setattr(model_admin, "get_object", get_object_then_commit_elsewhere)
    response = admin_client.post(url, change_form(html))
    assert response.status_code == 403
    assert status_of(db, message.key) == ("cancelled" if concurrent == "cancel" else "sent")


def test_the_admin_message_page_shows_its_receipts(admin_client: Client, db: Engine) -> None:
    """A message's delivery receipts, in its change page, read-only, with what each did."""
    from delivery.transitions.receipts import ReceiptEvent, record

    with transaction.atomic():
        message = enqueue(channel="sms", to="+12015550108", payload={"body": "x"})
    with db.begin() as conn:
        conn.execute(
            text("UPDATE delivery_messages SET status = 'sent' WHERE id = :i"), {"i": message.id}
        )
        record(conn, ReceiptEvent("stub", "evt-admin-1", message.key, "delivered"))
    html = admin_client.get(f"{ADMIN}{message.id}/change/").content.decode()
    assert "evt-admin-1" in html and "delivered" in html and "moved" in html
    assert django_models.Message.objects.get(pk=message.id).receipts.count() == 1


CALLED = re.compile(r'<td class="field-called">\s*<p>(\w+)</p>\s*</td>')


def test_the_admin_message_page_shows_the_route_and_each_attempts_provider(
    admin_client: Client, db: Engine
) -> None:
    """A message that failed over: its change page shows its route (``primary -> backup``),
    ``pinned`` read-only, and each attempt with the provider it called (a row written before
    failover, with none: its message's)."""
    from sqlalchemy.orm import Session

    from tests.factories import add, add_failover

    with Session(db) as session:
        moved = add_failover(session, "admin-fo-1")
        old = add(session, "admin-old-1", "sent", attempts=1, pinned=True)
        session.add(
            Attempt(
                message_id=old.id,
                number=1,
                kind="send",
                outcome="delivered",
                started_at=dt.datetime.now(dt.UTC),
            )
        )
        session.commit()
        moved_id, old_id = moved.id, old.id
    html = admin_client.get(f"{ADMIN}{moved_id}/change/").content.decode()
    assert re.search(
        r'field-route.*?<div class="readonly">\s*primary -&gt; backup\s*</div>', html, re.S
    )
    assert re.search(r'field-pinned.*?<div class="readonly">\s*<img[^>]*alt="False"', html, re.S)
    called = re.findall(CALLED, html)
    assert called == ["primary", "backup", "backup"], html
    assert "+1*******123" in html  # the recipient field, masked

    html = admin_client.get(f"{ADMIN}{old_id}/change/").content.decode()
    assert re.findall(CALLED, html) == ["stub"]
    assert re.search(r'field-route.*?<div class="readonly">\s*stub\s*</div>', html, re.S)
    assert re.search(r'field-pinned.*?<div class="readonly">\s*<img[^>]*alt="True"', html, re.S)


def test_admin_resolve_actions_settle_unknown_messages_only(
    admin_client: Client, db: Engine
) -> None:
    """Resolve as sent / as dead are delivery.ops.resolve: an unknown message is settled, any
    other status is reported and left alone."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        first = enqueue(channel="sms", to="+12015550108", payload={"body": "a"}, send_at=later)
        second = enqueue(channel="sms", to="+12015550109", payload={"body": "b"}, send_at=later)
        pending = enqueue(channel="sms", to="+12015550110", payload={"body": "c"}, send_at=later)
    with db.begin() as conn:
        conn.execute(
            text("UPDATE delivery_messages SET status = 'unknown' WHERE id IN (:a, :b)"),
            {"a": first.id, "b": second.id},
        )
    data = {"action": "resolve_sent", "_selected_action": [first.id, pending.id], "index": 0}
    page = admin_client.post(ADMIN, data, follow=True).content.decode()
    assert "Resolved 1 message(s)." in page
    assert f"Not resolved {pending.key}: message is pending" in page
    data = {"action": "resolve_dead", "_selected_action": [second.id], "index": 0}
    assert "Resolved 1 message(s)." in admin_client.post(ADMIN, data, follow=True).content.decode()
    assert [status_of(db, m.key) for m in (first, second, pending)] == ["sent", "dead", "pending"]


def test_admin_resolve_as_dead_is_told_to_the_outcome_hooks_at_djangos_commit(
    admin_client: Client, db: Engine
) -> None:
    """The admin's session never commits (Django does): its outcome is told once, by
    ``transaction.on_commit``, when the new status is already committed."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        message = enqueue(channel="sms", to="+12015550111", payload={"body": "d"}, send_at=later)
    with db.begin() as conn:
        conn.execute(
            text("UPDATE delivery_messages SET status = 'unknown' WHERE id = :id"),
            {"id": message.id},
        )
    told: list[tuple[delivery.Outcome, str]] = []

    def hook(outcome: delivery.Outcome) -> None:
        told.append((outcome, status_of(db, outcome.key)))

    delivery.add_outcome_hook(hook)
    try:
        data = {"action": "resolve_dead", "_selected_action": [message.id], "index": 0}
        admin_client.post(ADMIN, data, follow=True)
    finally:
        delivery.remove_outcome_hook(hook)
    assert told == [(delivery.Outcome(message.id, message.key, None, "dead", None), "dead")]


def test_admin_actions_need_the_change_permission(db: Engine) -> None:
    """A staff user who may only view messages sees the list but has no action to run."""
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("viewer", "viewer@example.com", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_message"))
    client = Client()
    client.force_login(user)
    page = client.get(ADMIN)
    assert page.status_code == 200
    assert 'value="redrive"' not in page.content.decode()


def test_django_enqueue_takes_delivery_enqueue_keyword_arguments(db: Engine) -> None:
    """contrib.django.enqueue takes delivery.enqueue's keyword arguments through the one list
    both share (``delivery.EnqueueArgs``: names, annotations and which are required pinned to
    delivery.enqueue's signature) plus settings and using; type= works through it."""
    import inspect

    core = dict(inspect.signature(delivery.enqueue).parameters)
    core.pop("session")
    settings = core.pop("settings")
    shared = {
        name: ref.__forward_arg__ for name, ref in delivery.EnqueueArgs.__annotations__.items()
    }
    assert list(shared) == list(core)
    for name, parameter in core.items():
        required = parameter.default is inspect.Parameter.empty
        expected = f"Required[{parameter.annotation}]" if required else parameter.annotation
        assert shared[name] == expected, name
    ours = dict(inspect.signature(enqueue).parameters)
    assert ours.pop("using").default == "default"
    assert ours.pop("settings").annotation == settings.annotation
    assert [p.kind for p in ours.values()] == [inspect.Parameter.VAR_KEYWORD]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with transaction.atomic():
        message = enqueue(type="otp", to="+12015550111", payload={"body": "1"}, send_at=later)
    row = django_models.Message.objects.get(key=message.key)
    assert (row.channel, row.message_type, row.priority) == ("sms", "otp", "urgent")


@pytest.fixture
def scratch_db(pg_engine: Engine) -> Iterator[str]:
    with scratch_database() as url:
        yield url


def test_management_commands_that_never_send_need_no_broker(
    scratch_db: str, tmp_path: Path
) -> None:
    """With only DELIVERY_DATABASE_URL exported, ``migrate`` and ``createsuperuser`` run (they
    never send); an enqueue in that process then fails naming DELIVERY_BROKER_URL, and writes
    nothing."""
    env = {**os.environ, "DELIVERY_DATABASE_URL": scratch_db, "DJANGO_SUPERUSER_PASSWORD": "pw"}
    env.pop("DELIVERY_BROKER_URL")
    manage = [sys.executable, str(ROOT / "examples" / "django_app" / "manage.py")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*manage, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    subprocess.run(
        [sys.executable, "-m", "delivery.cli", "db", "upgrade"],
        env={**env, "DELIVERY_BROKER_URL": os.environ["DELIVERY_BROKER_URL"]},
        check=True,
        capture_output=True,
    )
    for args in (
        ("migrate", "--no-input", "-v", "0"),
        ("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com"),
    ):
        done = run(*args)
        assert done.returncode == 0, done.stderr[-3000:]
    script = (
        "from django.db import transaction\n"
        "from delivery.contrib.django import enqueue\n"
        "with transaction.atomic():\n"
        "    enqueue(channel='sms', to='+12015550100', payload={'body': 'hi'})\n"
    )
    done = run("shell", "-c", script)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "delivery.errors.ConfigError: config DELIVERY_BROKER_URL: is not set while the outbox "
        "is DELIVERY_DATABASE_URL: set it (a worker must read the same outbox and broker; the "
        "embedded default applies only when nothing is configured)"
    )
    engine = create_engine(scratch_db)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM delivery_messages")) == 0
    engine.dispose()

"""The Flask integration over real PostgreSQL, worker, beat and stub: examples/flask_app."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

import delivery
from delivery.contrib.flask import Delivery
from delivery.contrib.nudge import installed
from examples.flask_app import create_app, db, register_user
from tests.conftest import PG_URL, drained

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(pg_engine: Engine) -> Iterator[Flask]:
    """The example app on the suite's database, with its users table."""
    app = create_app({"SQLALCHEMY_DATABASE_URI": PG_URL, "TESTING": False})
    raised: list[str] = []

    @app.post("/signup-then-fail")
    def signup_then_fail() -> None:
        _, message = register_user("fail@example.com")
        raised.append(message.key)
        raise RuntimeError("the handler failed after enqueue")

    app.config["raised"] = raised
    with app.app_context():
        db.create_all()
    yield app
    with app.app_context():
        db.drop_all()
        db.engine.dispose()


@pytest.fixture
def client(app: Flask, clean: Engine) -> FlaskClient:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE example_users"))
    return app.test_client()


def rows(engine: Engine, table: str) -> list[str]:
    column = "email" if table == "example_users" else "key"
    with engine.connect() as conn:
        return list(conn.scalars(text(f"SELECT {column} FROM {table} ORDER BY id")))


def test_extension_reads_app_config_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """DELIVERY_* keys in app.config win over the environment, the app's database is the
    default outbox, DELIVERY_OPTIONS configures channels, and the nudge gets installed."""
    broker = os.environ["DELIVERY_BROKER_URL"]
    monkeypatch.delenv("DELIVERY_DATABASE_URL")
    monkeypatch.delenv("DELIVERY_CONFIG")
    monkeypatch.setenv("DELIVERY_HOME", "/from-environment")
    app = Flask("config-test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://app@db/app",
        DELIVERY_HOME="/from-app-config",
        DELIVERY_OPTIONS={
            "delivery": {"max_attempts": 3},
            "providers": {"p": {"kind": "http", "base_url": "http://127.0.0.1:1"}},
            "channels": {"sms": {"provider": "p", "on_unknown": "give_up"}},
        },
    )
    try:
        ext = Delivery(app)
        settings = delivery.get_settings()
        assert app.extensions["delivery"] is ext and ext.settings is settings
        assert settings.database_url == "postgresql+psycopg://app@db/app"
        assert settings.home == "/from-app-config"
        assert settings.broker_url == broker  # from the environment
        assert settings.max_attempts == 3
        assert list(settings.channels) == ["sms"]
        assert settings.channels["sms"].on_unknown.value == "give_up"
        assert installed()
        app.config["DELIVERY_CONFIG"] = "/nonexistent.toml"
        with pytest.raises(delivery.ConfigError) as error:
            Delivery(app)
        assert error.value.key == "DELIVERY_OPTIONS"
    finally:
        delivery.configure(None)  # the environment's settings, read again when next needed


def test_handler_that_raises_after_enqueue_leaves_no_user_and_no_message(
    client: FlaskClient, app: Flask, clean: Engine
) -> None:
    """A request that enqueued and then raised commits neither the user nor the message."""
    response = client.post("/signup-then-fail")
    assert response.status_code == 500
    (key,) = app.config["raised"]  # the handler reached enqueue before it raised
    assert key.startswith("signup-") and key.endswith(":welcome")
    assert rows(clean, "example_users") == []
    assert rows(clean, "delivery_messages") == []


def test_bad_recipient_is_a_400_naming_the_field_and_writes_nothing(
    client: FlaskClient, clean: Engine
) -> None:
    """An address enqueue rejects answers 400 with field "to", and the user is rolled back."""
    response = client.post("/signup", json={"email": "not-an-address"})
    assert response.status_code == 400
    assert response.get_json()["field"] == "to"
    assert rows(clean, "example_users") == []
    assert rows(clean, "delivery_messages") == []


def test_signup_commits_user_and_message_and_a_real_worker_delivers_it(
    client: FlaskClient, live: Engine, stub
) -> None:  # type: ignore[no-untyped-def]
    """POST /signup commits the user and the welcome email together; the worker sends it once."""
    response = client.post("/signup", json={"email": "ann@example.com"})
    assert response.status_code == 201, response.get_data(as_text=True)
    body = response.get_json()
    assert body["message_key"] == f"signup-{body['id']}:welcome"
    assert rows(live, "example_users") == ["ann@example.com"]
    assert drained(live, 1, timeout=30) == {"sent": 1}
    assert stub.effects() == {body["message_key"]: 1}

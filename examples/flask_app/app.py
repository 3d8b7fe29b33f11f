"""The Flask example: a user and their welcome email commit together, or neither does.

Configuration (environment), the same for the app, ``delivery db upgrade``, the worker and
beat: ``DELIVERY_DATABASE_URL`` is the outbox *and* the app's own tables, one database, so
that the user and the message commit in one transaction (default: delivery's embedded
SQLite file in ``./.delivery``). ``DELIVERY_BROKER_URL`` and the other ``DELIVERY_*``
variables are read by the extension (``delivery.contrib.flask``) and by the worker alike.
``examples/flask_app/run.sh`` runs the whole example; by hand: ``delivery db upgrade`` for
the outbox, then ``python -m examples.flask_app`` (which creates the app's table).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import delivery
from delivery.contrib.flask import Delivery


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
outbox = Delivery()


class User(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "example_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(255), unique=True)


def register_user(email: str) -> tuple[User, delivery.Message]:
    """Add a user and their welcome email to the current transaction; commits nothing."""
    user = User(email=email)
    db.session.add(user)
    db.session.flush()  # the user's id, for the key
    message = delivery.enqueue(
        db.session,  # type: ignore[arg-type]  # a scoped_session passes straight in
        channel="email",
        to=email,
        payload={"subject": "Welcome!", "text": "Thanks for signing up."},
        key=delivery.key("signup", user.id, "welcome"),
    )
    return user, message


def database_url() -> str:
    """The outbox's database, which is the app's too: ``DELIVERY_DATABASE_URL``, or delivery's
    embedded default. A relative SQLite path is made absolute, since Flask-SQLAlchemy would
    otherwise look for it under the app's instance folder, not where the worker does."""
    url = make_url(delivery.load_settings().database_url)
    path = url.database
    if url.get_backend_name() == "sqlite" and path and path != ":memory:":
        url = url.set(database=os.path.abspath(path))
    return url.render_as_string(hide_password=False)


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The app; ``config`` overrides the defaults read from the environment."""
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url()
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        # The worker and beat write to the same file: wait for their locks, as they do.
        app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"connect_args": {"timeout": 30}}
    app.config.update(config or {})
    db.init_app(app)
    outbox.init_app(app)

    @app.post("/signup")
    def signup() -> tuple[dict[str, Any], int]:
        data = request.get_json(silent=True) or {}
        email = data.get("email")
        if not isinstance(email, str) or not email:
            return {"error": "email is required", "field": "email"}, 400
        try:
            user, message = register_user(email)
            db.session.commit()  # the user and the message, or neither
        except delivery.InvalidMessage as exc:
            db.session.rollback()
            return {"error": exc.problem, "field": exc.field}, 400
        except IntegrityError:
            db.session.rollback()
            return {"error": "this email is already registered", "field": "email"}, 409
        return {"id": user.id, "message_key": message.key}, 201

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        db.session.execute(text("SELECT 1"))
        return {"status": "ok"}

    return app

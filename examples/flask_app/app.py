"""The Flask example: a user and their welcome email commit together, or neither does.

Configuration (environment): ``DATABASE_URL`` is the app's database (default: SQLite in the
current folder); the outbox lives there too unless ``DELIVERY_DATABASE_URL`` says otherwise.
``DELIVERY_BROKER_URL`` and the other ``DELIVERY_*`` variables are read by the extension
(``delivery.contrib.flask``) and by the worker alike. Create the outbox tables with
``delivery db upgrade`` and the app's own with ``db.create_all()`` (``python -m
examples.flask_app`` does the latter).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String, text
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


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The app; ``config`` overrides the defaults read from the environment."""
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ.get(
        "DATABASE_URL", "sqlite:///example-flask.sqlite3"
    )
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

"""Flask integration: ``Delivery(app)`` or ``Delivery().init_app(app)``.

It reads the ``DELIVERY_*`` keys from ``app.config``, then the environment
(``delivery.contrib.settings``; without a database URL the outbox is the app's own
``SQLALCHEMY_DATABASE_URI``), makes them this process's settings (``delivery.configure``), and
installs the post-commit nudge unless ``DELIVERY_NUDGE`` is false; Flask-SQLAlchemy's session
then passes straight to ``delivery.enqueue``. ``receipts_blueprint()`` mounts the delivery
receipt receiver (``delivery.receipts``) in the app. An example:
[docs/integrations.md](../../docs/integrations.md#flask).
"""

from __future__ import annotations

from typing import Any

try:
    from flask import Blueprint, Flask, request
    from flask.typing import ResponseReturnValue
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "delivery.contrib.flask needs Flask and Flask-SQLAlchemy: "
        "pip install 'delivery-outbox[flask]'"
    ) from exc

from delivery.config.settings import Settings
from delivery.contrib.nudge import install_nudge
from delivery.contrib.settings import settings_from_config
from delivery.receipts import Request, make_receiver
from delivery.runtime.current import configure

__all__ = ["Delivery"]


class Delivery:
    """The Flask extension; ``app.extensions["delivery"]`` is this object after ``init_app``."""

    def __init__(self, app: Flask | None = None) -> None:
        self.settings: Settings | None = None
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Configure ``delivery`` from ``app.config`` and install the post-commit nudge."""
        database_uri: Any = app.config.get("SQLALCHEMY_DATABASE_URI")
        settings = settings_from_config(
            app.config,
            default_database_url=database_uri if isinstance(database_uri, str) else None,
        )
        configure(settings)
        self.settings = settings
        app.extensions["delivery"] = self
        if app.config.get("DELIVERY_NUDGE", True):
            install_nudge()

    def receipts_blueprint(self) -> Blueprint:
        """The receipt receiver as a blueprint: ``POST /receipts/<provider>`` under the prefix
        you register it at, on this app's outbox. Built here, so that a provider's missing
        secret or an outbox not migrated fails at start-up (``ConfigError``), not at the first
        receipt. Call ``init_app`` first."""
        if self.settings is None:
            raise RuntimeError("Delivery.receipts_blueprint() needs init_app(app) first")
        receiver = make_receiver(self.settings)
        blueprint = Blueprint("delivery_receipts", __name__)

        @blueprint.post("/receipts/<provider>")
        def receive(provider: str) -> ResponseReturnValue:
            length = request.content_length
            answer = receiver.respond(
                Request(
                    provider,
                    request.method,
                    -1 if length is None else length,
                    request.stream,
                    {name.lower(): value for name, value in request.headers.items()},
                    request.query_string.decode("latin-1"),
                )
            )
            return answer.body, answer.code, list(answer.headers)

        return blueprint

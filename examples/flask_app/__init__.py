"""A Flask + Flask-SQLAlchemy app whose ``POST /signup`` creates a user and enqueues a welcome
email in the same transaction. Run it, with the outbox, the stub provider, a worker and
beat, with ``examples/flask_app/run.sh`` (README, "Flask")."""

from examples.flask_app.app import User, create_app, db, register_user

__all__ = ["User", "create_app", "db", "register_user"]

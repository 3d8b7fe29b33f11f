"""A Flask + Flask-SQLAlchemy app whose ``POST /signup`` creates a user and enqueues a welcome
email in the same transaction. Run it with ``python -m examples.flask_app``."""

from examples.flask_app.app import User, create_app, db, register_user

__all__ = ["User", "create_app", "db", "register_user"]

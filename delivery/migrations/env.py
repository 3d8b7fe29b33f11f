"""Alembic environment: runs on the connection or URL that ``delivery.runtime.db.upgrade``
passes."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from delivery.core.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata)
        context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()

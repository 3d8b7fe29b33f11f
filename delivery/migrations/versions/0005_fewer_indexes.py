"""Two fewer index entries per message row.

Every INSERT of ``enqueue`` and ``enqueue_many``, and every status transition (none is a HOT
update), wrote into all nine.

- PostgreSQL: the key's unique constraint and ``ix_delivery_messages_key_prefix`` (the same
  column, ``varchar_pattern_ops`` for ``LIKE 'prefix%'``) become one unique index on
  ``key varchar_pattern_ops``, ``uq_delivery_messages_key``: the operator class has ``=``, so
  it answers an exact key, ``ON CONFLICT (key)`` (inference takes any unique index on the
  column) and a prefix at once. SQLite keeps its unique constraint (its prefix search uses it).
- ``ix_delivery_messages_code_id`` only holds rows that have a ``last_error_code``: a page or
  a repair by code (``last_error_code = :code``) implies the predicate; a new message, and
  every message that has not failed, has none.

The upgrade rebuilds both indexes: on a large outbox it holds the table's lock while it does.

Revision ID: 0005_fewer_indexes
Revises: 0004_audit
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_fewer_indexes"
down_revision = "0004_audit"
branch_labels = None
depends_on = None

MESSAGES = "delivery_messages"
WITH_CODE = sa.text("last_error_code IS NOT NULL")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("uq_delivery_messages_key", MESSAGES, type_="unique")
        op.create_index(
            "uq_delivery_messages_key",
            MESSAGES,
            ["key"],
            unique=True,
            postgresql_ops={"key": "varchar_pattern_ops"},
        )
        op.drop_index("ix_delivery_messages_key_prefix", MESSAGES)
    op.drop_index("ix_delivery_messages_code_id", MESSAGES)
    op.create_index(
        "ix_delivery_messages_code_id",
        MESSAGES,
        ["last_error_code", "id"],
        postgresql_where=WITH_CODE,
        sqlite_where=WITH_CODE,
    )


def downgrade() -> None:
    op.drop_index("ix_delivery_messages_code_id", MESSAGES)
    op.create_index("ix_delivery_messages_code_id", MESSAGES, ["last_error_code", "id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE INDEX ix_delivery_messages_key_prefix "
            "ON delivery_messages (key varchar_pattern_ops)"
        )
        op.drop_index("uq_delivery_messages_key", MESSAGES)
        op.create_unique_constraint("uq_delivery_messages_key", MESSAGES, ["key"])

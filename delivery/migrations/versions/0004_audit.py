"""Audit of operator actions, and the indexes of the ops console's pages.

Revision ID: 0004_audit
Revises: 0003_fence
"""

import sqlalchemy as sa
from alembic import op

from delivery.core.models import UTCDateTime

revision = "0004_audit"
down_revision = "0003_fence"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "delivery_audit",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("message_id", Id, nullable=True),
        sa.Column("message_key", sa.String(255), nullable=True),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_delivery_audit"),
    )
    op.create_index("ix_delivery_audit_at", "delivery_audit", ["at"])
    op.create_index("ix_delivery_audit_message_id", "delivery_audit", ["message_id"])
    op.create_index("ix_delivery_attempts_started_at", "delivery_attempts", ["started_at"])
    messages = "delivery_messages"
    op.create_index("ix_delivery_messages_status_id", messages, ["status", "id"])
    op.create_index("ix_delivery_messages_provider_id", messages, ["provider", "id"])
    op.create_index("ix_delivery_messages_code_id", messages, ["last_error_code", "id"])
    if op.get_bind().dialect.name == "postgresql":
        # Key prefix search (LIKE 'order-42%') under any collation.
        op.execute(
            "CREATE INDEX ix_delivery_messages_key_prefix "
            "ON delivery_messages (key varchar_pattern_ops)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_delivery_messages_key_prefix")
    for name in ("code_id", "provider_id", "status_id"):
        op.drop_index(f"ix_delivery_messages_{name}", "delivery_messages")
    op.drop_index("ix_delivery_attempts_started_at", "delivery_attempts")
    op.drop_table("delivery_audit")

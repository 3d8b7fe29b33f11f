"""Outbox and attempt log.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from delivery.core.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "delivery_messages",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("payload_hash", sa.String(64), nullable=False),
        sa.Column("on_unknown", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("needs_lookup", sa.Boolean(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("last_error_code", sa.String(64), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("provider_ref", sa.String(255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_delivery_messages"),
        sa.UniqueConstraint("key", name="uq_delivery_messages_key"),
    )
    op.create_index(
        "ix_delivery_messages_due", "delivery_messages", ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"), sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_delivery_messages_lease", "delivery_messages", ["lease_expires_at"],
        postgresql_where=sa.text("status IN ('dispatched', 'sending')"),
        sqlite_where=sa.text("status IN ('dispatched', 'sending')"),
    )
    op.create_index("ix_delivery_messages_status", "delivery_messages", ["status", "updated_at"])
    op.create_table(
        "delivery_attempts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("message_id", Id, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_delivery_attempts"),
        sa.ForeignKeyConstraint(
            ["message_id"], ["delivery_messages.id"], ondelete="CASCADE",
            name="fk_delivery_attempts_message_id",
        ),
    )
    op.create_index("ix_delivery_attempts_message_id", "delivery_attempts", ["message_id"])


def downgrade() -> None:
    op.drop_table("delivery_attempts")
    op.drop_table("delivery_messages")

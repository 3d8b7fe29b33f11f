"""Delivery receipts: one row per provider callback, and the suppression list.

The states ``delivered``, ``undelivered`` and ``suppressed`` need no change: the status
column holds any state's name.

Revision ID: 0006_receipts
Revises: 0005_fewer_indexes
"""

import sqlalchemy as sa
from alembic import op

from delivery.core.models import UTCDateTime

revision = "0006_receipts"
down_revision = "0005_fewer_indexes"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RECEIPTS = "delivery_receipts"
SUPPRESSIONS = "delivery_suppressions"
WAITING = sa.text("effect = 'waiting'")


def upgrade() -> None:
    op.create_table(
        RECEIPTS,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column(
            "message_id",
            Id,
            sa.ForeignKey(
                "delivery_messages.id",
                ondelete="CASCADE",
                name="fk_delivery_receipts_message_id",
            ),
            nullable=False,
        ),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("event", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("code", sa.String(64), nullable=True),
        sa.Column("provider_at", UTCDateTime(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("effect", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_delivery_receipts"),
    )
    op.create_index("ix_delivery_receipts_message_id", RECEIPTS, ["message_id"])
    op.create_index(
        "uq_delivery_receipts_provider", RECEIPTS, ["provider", "event"], unique=True
    )
    op.create_index("ix_delivery_receipts_received_at", RECEIPTS, ["received_at"])
    op.create_index(
        "ix_delivery_receipts_waiting",
        RECEIPTS,
        ["id"],
        postgresql_where=WAITING,
        sqlite_where=WAITING,
    )


    op.create_table(
        SUPPRESSIONS,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("recipient_hash", sa.String(64), nullable=False),
        sa.Column("code", sa.String(64), nullable=True),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_delivery_suppressions"),
    )
    op.create_index(
        "uq_delivery_suppressions_channel",
        SUPPRESSIONS,
        ["channel", "recipient_hash"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_table(SUPPRESSIONS)
    op.drop_table(RECEIPTS)

"""Traces: the W3C trace context of the span each message was enqueued in.

``delivery_messages.traceparent`` (``delivery.observability.tracing``): NULL when traces are
not recorded, and on every row written before this revision.

Revision ID: 0008_traceparent
Revises: 0007_failover
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_traceparent"
down_revision = "0007_failover"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.drop_column("traceparent")

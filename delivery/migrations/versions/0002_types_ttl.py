"""Message type, priority and time-to-live.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from delivery.core.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.add_column(sa.Column("message_type", sa.String(32), nullable=True))
        batch.add_column(
            sa.Column("priority", sa.String(16), nullable=False, server_default="normal")
        )
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("priority")
        batch.drop_column("message_type")

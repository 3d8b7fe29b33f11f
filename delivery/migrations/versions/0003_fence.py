"""The fence never goes back: attempts are kept across a redrive.

``attempts`` is kept across a redrive, and ``budget_start`` records where the current life's
attempt budget began.

Revision ID: 0003_fence
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_fence"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.add_column(
            sa.Column("budget_start", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.drop_column("budget_start")

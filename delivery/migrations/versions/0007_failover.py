"""Provider failover: which provider each attempt called, and whether a message is pinned.

- ``delivery_attempts.provider``: the provider the call went to. Rows written before this
  revision keep NULL: no message could change provider then, so their message's ``provider``
  is theirs (read them that way; rewriting every attempt row would hold the table).
- ``delivery_messages.pinned``: an attempt on the message's current provider may have taken
  effect, so it may never move to another one (docs/concepts.md, "Failover").

Revision ID: 0007_failover
Revises: 0006_receipts
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_failover"
down_revision = "0006_receipts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("delivery_attempts") as batch:
        batch.add_column(sa.Column("provider", sa.String(64), nullable=True))
    with op.batch_alter_table("delivery_messages") as batch:
        batch.add_column(
            sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("delivery_messages") as batch:
        batch.drop_column("pinned")
    with op.batch_alter_table("delivery_attempts") as batch:
        batch.drop_column("provider")

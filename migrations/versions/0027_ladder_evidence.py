"""What the ladder needs to act only on what it can verify: each node's clock offset (from the
agent's send time), the deliveries of each warning step, and the ladder a job's progress was
started under (a change of dry_run or steps restarts it).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("clock_offset_seconds", sa.Float, nullable=True))
        batch.add_column(sa.Column("clock_checked_at", UTCDateTime, nullable=True))
    with op.batch_alter_table("ladder_actions") as batch:
        batch.add_column(sa.Column("delivery_ids", sa.JSON, nullable=True))
    with op.batch_alter_table("ladder_progress") as batch:
        batch.add_column(sa.Column("ladder_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ladder_progress") as batch:
        batch.drop_column("ladder_digest")
    with op.batch_alter_table("ladder_actions") as batch:
        batch.drop_column("delivery_ids")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("clock_checked_at")
        batch.drop_column("clock_offset_seconds")

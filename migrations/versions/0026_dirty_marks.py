"""Dirty rollup minutes marked without a unique key: ingest's marks no longer wait for a rollup
that is deleting the same minute's marks in its open transaction.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def _rebuild(*, unique: bool) -> None:
    """rollup_dirty rebuilt with (``unique``) or without a primary key, its marks kept once."""
    key = [sa.PrimaryKeyConstraint("gpu_id", "bucket_start", name="pk_rollup_dirty")]
    op.create_table(
        "rollup_dirty_new",
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("bucket_start", UTCDateTime, nullable=False),
        *(key if unique else []),
    )
    op.execute(
        "INSERT INTO rollup_dirty_new (gpu_id, bucket_start) "
        "SELECT DISTINCT gpu_id, bucket_start FROM rollup_dirty"
    )
    op.drop_table("rollup_dirty")
    op.rename_table("rollup_dirty_new", "rollup_dirty")


def upgrade() -> None:
    _rebuild(unique=False)
    op.create_index(
        "ix_rollup_dirty_gpu_id_bucket_start", "rollup_dirty", ["gpu_id", "bucket_start"]
    )


def downgrade() -> None:
    _rebuild(unique=True)

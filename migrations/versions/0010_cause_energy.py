"""Energy (joules, power integrated) per cause in the rollups, with running totals.

The new columns are 0 in every stored bucket and so are their running totals; every 1-minute
bucket whose raw samples are still kept is marked for the rollup job to recompute (with its
hour and running totals), so the energy per cause of recent jobs is complete.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Frozen as of this revision.
_COLUMNS = tuple(
    f"{cause}_energy_joules"
    for cause in (
        "idle_empty",
        "idle_held",
        "launch_bound",
        "input_starved",
        "transfer_bound",
        "memory_bound",
        "compute_no_tensor",
        "compute_tensor",
        "unclassified",
    )
)


def upgrade() -> None:
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for c in _COLUMNS:
                batch.add_column(sa.Column(c, sa.Float(), nullable=False, server_default="0"))
    with op.batch_alter_table("rollup_1m") as batch:
        for c in _COLUMNS:
            batch.add_column(sa.Column(f"cum_{c}", sa.Float(), nullable=True))
    op.execute("UPDATE rollup_1m SET " + ", ".join(f"cum_{c} = 0" for c in _COLUMNS))
    op.execute(
        "INSERT INTO rollup_dirty (gpu_id, bucket_start) "
        "SELECT r.gpu_id, r.bucket_start FROM rollup_1m r "
        "WHERE r.bucket_start >= (SELECT MIN(s.ts) FROM samples s WHERE s.gpu_id = r.gpu_id) "
        "AND NOT EXISTS (SELECT 1 FROM rollup_dirty d "
        "  WHERE d.gpu_id = r.gpu_id AND d.bucket_start = r.bucket_start)"
    )


def downgrade() -> None:
    with op.batch_alter_table("rollup_1m") as batch:
        for c in reversed(_COLUMNS):
            batch.drop_column(f"cum_{c}")
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for c in reversed(_COLUMNS):
                batch.drop_column(c)

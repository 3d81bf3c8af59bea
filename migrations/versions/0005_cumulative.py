"""Running totals on rollup_1m so a cost report reads any range as two rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Frozen copy of service.db.schema.CUMULATIVE_FIELDS as of this revision.
_FIELDS = (
    "covered_seconds",
    "idle_seconds",
    "idle_held_seconds",
    "unused_seconds",
    "fallback_seconds",
    "energy_used_joules",
    "tensor_active_sum",
    "tensor_active_count",
    "dram_active_sum",
    "dram_active_count",
)
_PENDING = "cum_covered_seconds IS NULL"


def upgrade() -> None:
    with op.batch_alter_table("rollup_1m") as batch:
        for f in _FIELDS:
            batch.add_column(sa.Column(f"cum_{f}", sa.Float(), nullable=True))
    # Rows already stored get their totals in one pass; later ones from the rollup job.
    running = ", ".join(
        f"SUM(COALESCE({f}, 0)) OVER (PARTITION BY gpu_id ORDER BY bucket_start "
        f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS c_{f}"
        for f in _FIELDS
    )
    sets = ", ".join(f"cum_{f} = r.c_{f}" for f in _FIELDS)
    op.execute(
        f"WITH r AS (SELECT gpu_id AS g, bucket_start AS b, {running} FROM rollup_1m) "
        f"UPDATE rollup_1m SET {sets} FROM r "
        "WHERE rollup_1m.gpu_id = r.g AND rollup_1m.bucket_start = r.b"
    )
    op.create_index(
        "ix_rollup_1m_cum_pending",
        "rollup_1m",
        ["gpu_id", "bucket_start"],
        postgresql_where=sa.text(_PENDING),
        sqlite_where=sa.text(_PENDING),
    )


def downgrade() -> None:
    op.drop_index("ix_rollup_1m_cum_pending", table_name="rollup_1m")
    with op.batch_alter_table("rollup_1m") as batch:
        for f in reversed(_FIELDS):
            batch.drop_column(f"cum_{f}")

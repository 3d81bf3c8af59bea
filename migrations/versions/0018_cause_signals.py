"""The signals per cause the recoverable shares are computed from, in every integral table.

``input_starved_duty_seconds`` and ``launch_bound_duty_seconds`` (duty cycle x seconds),
``compute_no_tensor_active_seconds`` (SM activity x seconds), ``memory_bound_dram_seconds``
(DRAM activity x seconds) and ``transfer_bound_pcie_bytes`` (the busier PCIe direction's bytes)
in the rollups (with running totals) and the tenant tables. They are 0 in every stored bucket;
every 1-minute bucket whose raw samples are still kept is marked for the rollup job to
recompute (with its hour, running totals and tenant rows). Older buckets keep 0, which the
recoverable shares read as "not measured" (the constant fallback).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# Frozen as of this revision.
_COLUMNS = (
    "input_starved_duty_seconds",
    "launch_bound_duty_seconds",
    "compute_no_tensor_active_seconds",
    "memory_bound_dram_seconds",
    "transfer_bound_pcie_bytes",
)
_TABLES = ("rollup_1m", "rollup_1h", "tenant_1m", "tenant_1h", "tenant_1d")


def upgrade() -> None:
    for table in _TABLES:
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
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for c in reversed(_COLUMNS):
                batch.drop_column(c)

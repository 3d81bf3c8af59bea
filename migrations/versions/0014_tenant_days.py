"""Shared GPUs: tenant_1h summed per day (tenant_1d), so a 30-day report reads a shared GPU's
whole days as one row per job.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The waste-model integrals as they are at this revision (spelled out: a migration is frozen).
_INTEGRALS = (
    "covered_seconds", "idle_seconds", "idle_held_seconds", "unused_seconds", "fallback_seconds",
    "energy_used_joules", "idle_empty_seconds", "launch_bound_seconds", "input_starved_seconds",
    "transfer_bound_seconds", "memory_bound_seconds", "compute_no_tensor_seconds",
    "compute_tensor_seconds", "unclassified_seconds", "idle_empty_energy_joules",
    "idle_held_energy_joules", "launch_bound_energy_joules", "input_starved_energy_joules",
    "transfer_bound_energy_joules", "memory_bound_energy_joules",
    "compute_no_tensor_energy_joules", "compute_tensor_energy_joules", "unclassified_energy_joules",
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "tenant_1d",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", UTCDateTime(), nullable=False),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("split_rule", sa.String(16), nullable=False),
        sa.Column("held_seconds", sa.Float(), nullable=False, server_default="0"),
        *(sa.Column(f, sa.Float(), nullable=False, server_default="0") for f in _INTEGRALS),
        sa.PrimaryKeyConstraint(
            "gpu_id", "bucket_start", "tenant", "split_rule", name="pk_tenant_1d"
        ),
    )
    # Fill it from the hours already stored (days in UTC).
    if op.get_bind().dialect.name == "postgresql":
        day = "date_trunc('day', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    else:
        day = "strftime('%Y-%m-%d 00:00:00.000000', bucket_start)"
    cols = ", ".join(["held_seconds", *_INTEGRALS])
    sums = ", ".join(f"SUM({f})" for f in ["held_seconds", *_INTEGRALS])
    op.execute(
        f"INSERT INTO tenant_1d (gpu_id, bucket_start, tenant, split_rule, {cols}) "
        f"SELECT gpu_id, {day}, tenant, split_rule, {sums} FROM tenant_1h "
        f"GROUP BY gpu_id, {day}, tenant, split_rule"
    )


def downgrade() -> None:
    op.drop_table("tenant_1d")

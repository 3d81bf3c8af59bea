"""Shared GPUs: tenant_1m summed per hour (tenant_1h) and which minutes of each GPU-hour are
shared (shared_1h), so a report over days reads hours instead of every shared minute.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0013"
down_revision = "0012"
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
        "tenant_1h",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", UTCDateTime(), nullable=False),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("split_rule", sa.String(16), nullable=False),
        sa.Column("held_seconds", sa.Float(), nullable=False, server_default="0"),
        *(sa.Column(f, sa.Float(), nullable=False, server_default="0") for f in _INTEGRALS),
        sa.PrimaryKeyConstraint(
            "gpu_id", "bucket_start", "tenant", "split_rule", name="pk_tenant_1h"
        ),
    )
    op.create_table(
        "shared_1h",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", UTCDateTime(), nullable=False),
        sa.Column("minute_mask", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("gpu_id", "bucket_start", name="pk_shared_1h"),
    )
    # Fill both from the tenant rows already stored (hours and minutes of the hour in UTC).
    if op.get_bind().dialect.name == "postgresql":
        hour = "date_trunc('hour', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        minute = "EXTRACT(MINUTE FROM bucket_start AT TIME ZONE 'UTC')"
        bit = f"CAST(1 AS BIGINT) << CAST({minute} AS INTEGER)"
    else:
        hour = "strftime('%Y-%m-%d %H:00:00.000000', bucket_start)"
        bit = "1 << CAST(strftime('%M', bucket_start) AS INTEGER)"
    cols = ", ".join(_INTEGRALS)
    sums = ", ".join(f"SUM({f})" for f in _INTEGRALS)
    op.execute(
        f"INSERT INTO tenant_1h (gpu_id, bucket_start, tenant, split_rule, held_seconds, {cols}) "
        f"SELECT gpu_id, {hour}, tenant, split_rule, SUM(held_seconds), {sums} FROM tenant_1m "
        f"GROUP BY gpu_id, {hour}, tenant, split_rule"
    )
    op.execute(
        f"INSERT INTO shared_1h (gpu_id, bucket_start, minute_mask) "
        f"SELECT gpu_id, h, CAST(SUM(b) AS BIGINT) FROM (SELECT DISTINCT gpu_id, {hour} AS h, "
        f"{bit} AS b FROM tenant_1m) m GROUP BY gpu_id, h"
    )


def downgrade() -> None:
    op.drop_table("shared_1h")
    op.drop_table("tenant_1h")

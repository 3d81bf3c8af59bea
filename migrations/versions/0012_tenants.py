"""Shared GPUs: per-process SM and memory utilisation on process records, and each job's
integrals per minute of a shared GPU (tenant_1m).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0012"
down_revision = "0011"
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
    with op.batch_alter_table("gpu_processes") as batch:
        batch.add_column(sa.Column("sm_util", sa.Float(), nullable=True))
        batch.add_column(sa.Column("mem_util", sa.Float(), nullable=True))
    op.create_table(
        "tenant_1m",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("bucket_start", UTCDateTime(), nullable=False),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("interval_id", sa.Integer(), nullable=True),
        sa.Column("split_rule", sa.String(16), nullable=False),
        sa.Column("held_seconds", sa.Float(), nullable=False, server_default="0"),
        *(sa.Column(f, sa.Float(), nullable=False, server_default="0") for f in _INTEGRALS),
        sa.PrimaryKeyConstraint("gpu_id", "bucket_start", "tenant", name="pk_tenant_1m"),
    )
    op.create_index("ix_tenant_1m_bucket_start", "tenant_1m", ["bucket_start"])
    op.create_index("ix_tenant_1m_interval_id", "tenant_1m", ["interval_id"])


def downgrade() -> None:
    op.drop_index("ix_tenant_1m_interval_id", "tenant_1m")
    op.drop_index("ix_tenant_1m_bucket_start", "tenant_1m")
    op.drop_table("tenant_1m")
    with op.batch_alter_table("gpu_processes") as batch:
        batch.drop_column("mem_util")
        batch.drop_column("sm_util")

"""Cost day sums per (job, day): each job's cost_job_1d rows of a day summed over its GPUs,
with their ids (cost_job_day_1d), so a report grouped by job, user or team sums a row per job
and day instead of one per job, GPU and day; filled here from the rows already written.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

# The summed fields as they are at this revision (spelled out: a migration is frozen).
_CAUSES = (
    "idle_empty", "idle_held", "launch_bound", "input_starved", "transfer_bound",
    "memory_bound", "compute_no_tensor", "compute_tensor", "unclassified",
)  # fmt: skip
_SUMS = (
    "held_seconds", "nodata_seconds", "lost_seconds", "unpriced_seconds", "cost_usd",
    "nodata_usd", "lost_usd", *(f"{c}_usd" for c in _CAUSES),
    "covered_seconds", "idle_seconds", "idle_held_seconds", "unused_seconds", "fallback_seconds",
    "energy_used_joules", "idle_empty_seconds", "launch_bound_seconds", "input_starved_seconds",
    "transfer_bound_seconds", "memory_bound_seconds", "compute_no_tensor_seconds",
    "compute_tensor_seconds", "unclassified_seconds", "idle_empty_energy_joules",
    "idle_held_energy_joules", "launch_bound_energy_joules", "input_starved_energy_joules",
    "transfer_bound_energy_joules", "memory_bound_energy_joules",
    "compute_no_tensor_energy_joules", "compute_tensor_energy_joules",
    "unclassified_energy_joules", "input_starved_duty_seconds", "launch_bound_duty_seconds",
    "compute_no_tensor_active_seconds", "memory_bound_dram_seconds", "transfer_bound_pcie_bytes",
    "tensor_active_sum", "tensor_active_count", "dram_active_sum", "dram_active_count",
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "cost_job_day_1d",
        sa.Column("day", UTCDateTime(), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),  # "" for time no job held
        sa.Column("gpu_ids", sa.Text(), nullable=False),
        *(sa.Column(f, sa.Float(), nullable=False, server_default="0") for f in _SUMS),
        sa.PrimaryKeyConstraint("day", "job_id", name="pk_cost_job_day_1d"),
    )
    op.create_index("ix_cost_job_day_1d_job_day", "cost_job_day_1d", ["job_id", "day"])
    pg = op.get_bind().dialect.name == "postgresql"
    ids = "string_agg(gpu_id::text, ',' ORDER BY gpu_id)" if pg else "group_concat(gpu_id, ',')"
    cols = ", ".join(_SUMS)
    sums = ", ".join(f"SUM({f})" for f in _SUMS)
    op.execute(
        f"INSERT INTO cost_job_day_1d (day, job_id, gpu_ids, {cols}) "
        f"SELECT day, job_id, {ids}, {sums} FROM cost_job_1d GROUP BY day, job_id"
    )


def downgrade() -> None:
    op.drop_index("ix_cost_job_day_1d_job_day", table_name="cost_job_day_1d")
    op.drop_table("cost_job_day_1d")

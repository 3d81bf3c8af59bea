"""Costs: indexes for cost reports, job listing by user/team, and rollup retention by time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_INDEXES: tuple[tuple[str, str, list[str]], ...] = (
    # Retention and fleet-wide ranges filter rollups by time alone; the primary key
    # (gpu_id, bucket_start) serves the per-GPU reads of reports.
    ("ix_rollup_1m_bucket_start", "rollup_1m", ["bucket_start"]),
    ("ix_rollup_1h_bucket_start", "rollup_1h", ["bucket_start"]),
    ("ix_jobs_user", "jobs", ["user"]),
    ("ix_jobs_team", "jobs", ["team"]),
    ("ix_job_gpus_ended_at", "job_gpus", ["ended_at"]),
)


def upgrade() -> None:
    for name, table, columns in _INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(_INDEXES):
        op.drop_index(name, table_name=table)

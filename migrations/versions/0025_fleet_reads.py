"""Reads at 10,000 GPUs: each GPU's latest sample's cause and its first sample's time kept on
its row, so a fleet view and a report's GPU list read no samples; the job day sums indexed by
job, so a report page reads only its jobs' rows.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_cost_job_1d_job_day", "cost_job_1d", ["job_id", "day"])
    op.add_column("gpus", sa.Column("last_cause", sa.SmallInteger(), nullable=True))
    op.add_column("gpus", sa.Column("first_sample_at", UTCDateTime(), nullable=True))
    op.execute(
        "UPDATE gpus SET last_cause = (SELECT samples.cause FROM samples "
        "WHERE samples.gpu_id = gpus.id AND samples.ts = gpus.last_sample_at)"
    )
    # The earliest of its first rolled-up minute and its first raw sample, as reports read it.
    firsts = (
        "(SELECT min(rollup_1m.bucket_start) FROM rollup_1m WHERE rollup_1m.gpu_id = gpus.id)",
        "(SELECT min(samples.ts) FROM samples WHERE samples.gpu_id = gpus.id)",
    )
    op.execute(f"UPDATE gpus SET first_sample_at = {firsts[0]}")
    op.execute(
        f"UPDATE gpus SET first_sample_at = {firsts[1]} WHERE first_sample_at IS NULL "
        f"OR first_sample_at > {firsts[1]}"
    )


def downgrade() -> None:
    op.drop_index("ix_cost_job_1d_job_day", "cost_job_1d")
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("last_cause")
        batch.drop_column("first_sample_at")

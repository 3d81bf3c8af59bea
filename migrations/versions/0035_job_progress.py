"""A job's progress counter: one row per reading of its running total of steps, samples or
tokens (issue 46).

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_progress"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_progress_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_progress_job_id_at", "job_progress", ["job_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_job_progress_job_id_at", table_name="job_progress")
    op.drop_table("job_progress")

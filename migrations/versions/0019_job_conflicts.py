"""Job conflicts: a node's claim on a job that disagrees with what the job says, kept for admins.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_conflicts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("claimed", sa.JSON, nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_conflicts"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_conflicts_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_conflicts_job_id", "job_conflicts", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_conflicts_job_id", table_name="job_conflicts")
    op.drop_table("job_conflicts")

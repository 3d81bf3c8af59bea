"""A job's work key (issue 46): runs of the same work share it, so a fix told to one run is
checked against the next; filled for the jobs stored before it. And the calibration of each
cause's promises, learned from the realised savings, and the savings of the later runs (both
written by a background round: /metrics and the calibration read them).

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.core.work_key import key_of_row
from service.db.types import UTCDateTime

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

_BATCH = 1000


def upgrade() -> None:
    op.create_table(
        "savings_calibration",
        sa.Column("cause", sa.String(32), nullable=False),
        sa.Column("pairs", sa.Integer, nullable=False),
        sa.Column("median_promised", sa.Float(precision=53), nullable=False),
        sa.Column("median_realised", sa.Float(precision=53), nullable=False),
        sa.Column("factor", sa.Float(precision=53), nullable=True),
        sa.Column("computed_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("cause", name="pk_savings_calibration"),
    )
    op.create_table(
        "work_savings",
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("compared_with", sa.String(255), nullable=False),
        sa.Column("team", sa.String(255), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("project", sa.String(255), nullable=True),
        sa.Column("ended_at", UTCDateTime, nullable=False),
        sa.Column("fix_cause", sa.String(32), nullable=True),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("booked", sa.Boolean, nullable=False),
        sa.Column("promised_fraction", sa.Float(precision=53), nullable=True),
        sa.Column("realised_fraction", sa.Float(precision=53), nullable=True),
        sa.Column("promised_usd", sa.Float(precision=53), nullable=True),
        sa.Column("realised_usd", sa.Float(precision=53), nullable=True),
        sa.Column("computed_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_work_savings"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_work_savings_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_work_savings_ended_at", "work_savings", ["ended_at"])
    op.add_column("jobs", sa.Column("work_key", sa.String(64), nullable=True))
    op.create_index("ix_jobs_work_key_started_at", "jobs", ["work_key", "started_at"])
    conn = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("user", sa.String),
        sa.column("team", sa.String),
        sa.column("labels", sa.JSON),
        sa.column("work_key", sa.String),
    )
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.user, jobs.c.team, jobs.c.labels)).all()
    keys = [{"job_id": r.id, "key": key_of_row(r.id, r.user, r.team, r.labels or {})} for r in rows]
    update = (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("job_id"))
        .values(work_key=sa.bindparam("key"))
    )
    for i in range(0, len(keys), _BATCH):
        conn.execute(update, keys[i : i + _BATCH])


def downgrade() -> None:
    op.drop_index("ix_work_savings_ended_at", table_name="work_savings")
    op.drop_table("work_savings")
    op.drop_table("savings_calibration")
    op.drop_index("ix_jobs_work_key_started_at", table_name="jobs")
    op.drop_column("jobs", "work_key")

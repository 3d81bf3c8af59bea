"""The warn-then-reclaim ladder: progress per (policy, job, episode) and the audit log of steps.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_ACTION_INDEXES = (("at",), ("job_id", "at"), ("policy", "at"), ("user", "at"), ("outcome", "at"))


def upgrade() -> None:
    op.create_table(
        "ladder_progress",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("policy", sa.String(255), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("alert_id", sa.Integer, nullable=False),
        sa.Column("episode_start", UTCDateTime, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("steps_done", sa.Integer, nullable=False, server_default="0"),
        sa.Column("pending_step", sa.Integer, nullable=True),
        sa.Column("last_step_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ladder_progress"),
    )
    op.create_index(
        "uq_ladder_progress_episode",
        "ladder_progress",
        ["policy", "job_id", "alert_id"],
        unique=True,
    )
    op.create_index("ix_ladder_progress_state", "ladder_progress", ["state"])
    op.create_table(
        "ladder_actions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("policy", sa.String(255), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("team", sa.String(255), nullable=True),
        sa.Column("alert_id", sa.Integer, nullable=True),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("dry_run", sa.Integer, nullable=False, server_default="0"),
        sa.Column("driver", sa.String(32), nullable=True),
        sa.Column("mode", sa.String(32), nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("threshold", sa.Float, nullable=True),
        sa.Column("since", UTCDateTime, nullable=True),
        sa.Column("waste_usd", sa.Float, nullable=True),
        sa.Column("idle_usd", sa.Float, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ladder_actions"),
    )
    for cols in _ACTION_INDEXES:
        op.create_index(f"ix_ladder_actions_{'_'.join(cols)}", "ladder_actions", list(cols))


def downgrade() -> None:
    for cols in _ACTION_INDEXES:
        op.drop_index(f"ix_ladder_actions_{'_'.join(cols)}", table_name="ladder_actions")
    op.drop_table("ladder_actions")
    op.drop_index("ix_ladder_progress_state", table_name="ladder_progress")
    op.drop_index("uq_ladder_progress_episode", table_name="ladder_progress")
    op.drop_table("ladder_progress")

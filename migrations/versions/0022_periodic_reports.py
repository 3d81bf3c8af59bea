"""Periodic reports: the (period, recipient) claims that make each report go out once, and
opt-outs.

Revision ID: 0022
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0022"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "report_sends",
        sa.Column("period_start", UTCDateTime, nullable=False),
        sa.Column("recipient", sa.String(300), nullable=False),
        sa.Column("period_end", UTCDateTime, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("delivery_ids", sa.JSON, nullable=False),
        sa.Column("claimed_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("period_start", "recipient", name="pk_report_sends"),
    )
    op.create_table(
        "report_opt_outs",
        sa.Column("recipient", sa.String(300), nullable=False),
        sa.Column("opted_out_at", UTCDateTime, nullable=False),
        sa.Column("by", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("recipient", name="pk_report_opt_outs"),
    )


def downgrade() -> None:
    op.drop_table("report_opt_outs")
    op.drop_table("report_sends")

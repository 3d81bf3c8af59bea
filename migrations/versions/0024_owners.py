"""Owners: the owner directory (file, API, cached lookups) and the record of notices sent.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owners",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("email", sa.String(254), nullable=True),
        sa.Column("slack", sa.String(32), nullable=True),
        sa.Column("cc_email", sa.String(254), nullable=True),
        sa.Column("cc_slack", sa.String(32), nullable=True),
        sa.Column("team", sa.String(255), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("kind", "name", name="pk_owners"),
    )
    op.create_table(
        "notices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(64), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("policy", sa.String(255), nullable=True),
        sa.Column("asked", sa.String(300), nullable=False),
        sa.Column("recipient", sa.String(300), nullable=True),
        sa.Column("fallback", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("channel", sa.String(255), nullable=True),
        sa.Column("address", sa.String(300), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_notices"),
        sa.UniqueConstraint("delivery_id", name="uq_notices_delivery_id"),
    )
    op.create_index("ix_notices_created_at", "notices", ["created_at"])
    op.create_index("ix_notices_job_id", "notices", ["job_id"])
    op.create_index("ix_notices_asked", "notices", ["asked"])


def downgrade() -> None:
    for name in ("asked", "job_id", "created_at"):
        op.drop_index(f"ix_notices_{name}", table_name="notices")
    op.drop_table("notices")
    op.drop_table("owners")

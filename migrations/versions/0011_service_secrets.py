"""Secrets the service makes for itself at first start (the console's session-signing key).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(128), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_service_secrets"),
    )


def downgrade() -> None:
    op.drop_table("service_secrets")

"""Who changed the configuration: a row per policy, ladder, channel, silence, price or owner
change made through the API, naming the person or token that made it; and the person a personal
token (minted in the console after single sign-on) stands for (issue 51).

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "config_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
    )
    op.create_index("ix_config_changes_at", "config_changes", ["at"])
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("person", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("person")
    op.drop_index("ix_config_changes_at", table_name="config_changes")
    op.drop_table("config_changes")

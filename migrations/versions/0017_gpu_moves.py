"""GPU moves: a GPU seen from another node than its own moves there, and the move is kept.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_moves",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("from_node", sa.String(255), nullable=False),
        sa.Column("to_node", sa.String(255), nullable=False),
        sa.Column("moved_at", UTCDateTime, nullable=False),
        sa.Column("from_last_sample_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gpu_moves"),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name="fk_gpu_moves_gpu_id_gpus", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_gpu_moves_gpu_id_moved_at", "gpu_moves", ["gpu_id", "moved_at"])


def downgrade() -> None:
    op.drop_index("ix_gpu_moves_gpu_id_moved_at", table_name="gpu_moves")
    op.drop_table("gpu_moves")

"""The node that registered each job interval: rights to a job stay with that node, never with a
GPU that moved to another one (issue 45). Existing intervals take their GPU's current node.

Revision ID: 0029
Revises: 0027
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_gpus") as batch:
        batch.add_column(sa.Column("registered_node", sa.String(255), nullable=True))
    # The best that is known of an old interval: its GPU's node now (a GPU rarely moves).
    op.execute(
        "UPDATE job_gpus SET registered_node = (SELECT nodes.hostname FROM gpus"
        " JOIN nodes ON nodes.id = gpus.node_id WHERE gpus.id = job_gpus.gpu_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("job_gpus") as batch:
        batch.drop_column("registered_node")

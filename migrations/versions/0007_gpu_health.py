"""GPU health metrics: row-remap failure, uncorrectable remapped rows and PCIe replays.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Frozen copy of the three metrics added to service.vocabulary.METRICS (all integers).
_METRICS = ("row_remap_failure", "remapped_rows_uncorrectable", "pcie_replays")


def upgrade() -> None:
    # On PostgreSQL, columns added to the partitioned samples table reach every partition.
    with op.batch_alter_table("samples") as batch:
        for m in _METRICS:
            batch.add_column(sa.Column(m, sa.BigInteger(), nullable=True))
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for m in _METRICS:
                batch.add_column(sa.Column(f"{m}_sum", sa.Float(), nullable=True))
                batch.add_column(sa.Column(f"{m}_min", sa.Float(), nullable=True))
                batch.add_column(sa.Column(f"{m}_max", sa.Float(), nullable=True))
                batch.add_column(
                    sa.Column(f"{m}_count", sa.Integer(), nullable=False, server_default="0")
                )


def downgrade() -> None:
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for m in _METRICS:
                for suffix in ("count", "max", "min", "sum"):
                    batch.drop_column(f"{m}_{suffix}")
    with op.batch_alter_table("samples") as batch:
        for m in _METRICS:
            batch.drop_column(m)

"""More GPU health: double-bit ECC errors, retired pages, NVLink errors and the clocks' event
reasons (issue 49), and an index on gpus.mig_parent_uuid for the duplicate-MIG check.

Revision ID: 0033
Revises: 0030
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0030"
branch_labels = None
depends_on = None

# Frozen copy of the metrics added to service.vocabulary.METRICS (all integers).
_METRICS = (
    "ecc_dbe_errors",
    "retired_pages_dbe",
    "retired_pages_pending",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "clocks_event_reasons",
)


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
    op.create_index("ix_gpus_mig_parent_uuid", "gpus", ["mig_parent_uuid"])


def downgrade() -> None:
    op.drop_index("ix_gpus_mig_parent_uuid", table_name="gpus")
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for m in _METRICS:
                for suffix in ("count", "max", "min", "sum"):
                    batch.drop_column(f"{m}_{suffix}")
    with op.batch_alter_table("samples") as batch:
        for m in _METRICS:
            batch.drop_column(m)

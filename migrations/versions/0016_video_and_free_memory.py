"""Video engine utilisation (enc_util, dec_util) and free frame-buffer memory (fb_free_bytes).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# Frozen copy of the metrics added to service.vocabulary.METRICS, with their column types.
_METRICS: tuple[tuple[str, type[sa.types.TypeEngine[object]]], ...] = (
    ("enc_util", sa.Float),
    ("dec_util", sa.Float),
    ("fb_free_bytes", sa.BigInteger),
)


def upgrade() -> None:
    # On PostgreSQL, columns added to the partitioned samples table reach every partition.
    with op.batch_alter_table("samples") as batch:
        for m, kind in _METRICS:
            batch.add_column(sa.Column(m, kind(), nullable=True))
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for m, _kind in _METRICS:
                batch.add_column(sa.Column(f"{m}_sum", sa.Float(), nullable=True))
                batch.add_column(sa.Column(f"{m}_min", sa.Float(), nullable=True))
                batch.add_column(sa.Column(f"{m}_max", sa.Float(), nullable=True))
                batch.add_column(
                    sa.Column(f"{m}_count", sa.Integer(), nullable=False, server_default="0")
                )


def downgrade() -> None:
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for m, _kind in reversed(_METRICS):
                for suffix in ("count", "max", "min", "sum"):
                    batch.drop_column(f"{m}_{suffix}")
    with op.batch_alter_table("samples") as batch:
        for m, _kind in reversed(_METRICS):
            batch.drop_column(m)

"""Two causes of GPU time decided over a window (issue 47): ``sham`` (kernels that do no useful
work, a keep-alive loop) and ``hung`` (work resident that has stopped advancing); their seconds,
joules and dollars where every other cause keeps them; each GPU process's host side.

Revision ID: 0037
Revises: 0035
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.cause_columns import add_cause_columns, drop_cause_columns

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

# Spelled out: a migration is frozen (codes 10 and 11, columns 9 and 10, appended).
_CAUSES = ("sham", "hung")
# Each GPU process's host side as the agent read it from /proc (running totals; NULL from an
# agent that sends none): what the useful-work verdict reads beside the samples.
_HOST = (
    ("host_cpu_seconds", sa.Float),
    ("host_read_bytes", sa.BigInteger),
    ("host_write_bytes", sa.BigInteger),
    ("host_voluntary_switches", sa.BigInteger),
    ("host_children", sa.Integer),
)


def upgrade() -> None:
    for cause in _CAUSES:
        add_cause_columns(cause)
    with op.batch_alter_table("gpu_processes") as batch:
        for name, kind in _HOST:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_processes") as batch:
        for name, _ in reversed(_HOST):
            batch.drop_column(name)
    for cause in reversed(_CAUSES):
        drop_cause_columns(cause)

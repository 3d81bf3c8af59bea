"""Two causes of GPU time decided over a window (issue 47): ``sham`` (kernels that do no useful
work, a keep-alive loop) and ``hung`` (work resident that has stopped advancing); their seconds,
joules and dollars where every other cause keeps them.

Revision ID: 0037
Revises: 0035
Create Date: 2026-12-07
"""

from __future__ import annotations

from migrations.cause_columns import add_cause_columns, drop_cause_columns

revision = "0037"
down_revision = "0035"
branch_labels = None
depends_on = None

# Spelled out: a migration is frozen (codes 10 and 11, columns 9 and 10, appended).
_CAUSES = ("sham", "hung")


def upgrade() -> None:
    for cause in _CAUSES:
        add_cause_columns(cause)


def downgrade() -> None:
    for cause in reversed(_CAUSES):
        drop_cause_columns(cause)

"""The columns a cause of GPU time owns in the rollup, tenant and day-sum tables, and the one
call a migration makes to add a new cause's.

Seconds per cause stay columns (bench/cause_columns.py measures the alternatives and
docs/architecture.md records why); the column set each table carries for one cause is written
down here once, so a migration for a new cause is ``add_cause_columns("name")`` and
tests/unit/test_cause_columns.py holds this table to the schema.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# The integrals every summed table keeps per cause, as suffixes of ``<cause>_``; a cause whose
# fix is calibrated from a measured signal also keeps that signal's integral (``signal``).
_INTEGRALS = ("seconds", "energy_joules")
# Table -> (keeps running totals, keeps dollars): rollup_1m also keeps each integral's running
# total (``cum_``, NULL until the rollup computes it), the day sums each cause's dollars.
CAUSE_TABLES: dict[str, tuple[bool, bool]] = {
    "rollup_1m": (True, False),
    "rollup_1h": (False, False),
    "tenant_1m": (False, False),
    "tenant_1h": (False, False),
    "tenant_1d": (False, False),
    "cost_gpu_1d": (False, True),
    "cost_job_1d": (False, True),
    "cost_job_day_1d": (False, True),
}


def columns_of(cause: str, signal: str | None = None) -> dict[str, list[str]]:
    """The column names ``cause`` owns, per table (``signal``: its signal's suffix, such as
    ``duty_seconds``, or None)."""
    integrals = [f"{cause}_{s}" for s in (*_INTEGRALS, *([signal] if signal else []))]
    out: dict[str, list[str]] = {}
    for table, (running, dollars) in CAUSE_TABLES.items():
        out[table] = [
            *([f"{cause}_usd"] if dollars else []),
            *integrals,
            *([f"cum_{name}" for name in integrals] if running else []),
        ]
    return out


def add_cause_columns(cause: str, signal: str | None = None) -> None:
    """Add every column of ``cause`` (inside a migration's ``upgrade``)."""
    for table, names in columns_of(cause, signal).items():
        with op.batch_alter_table(table) as batch:
            for name in names:
                if name.startswith("cum_"):
                    batch.add_column(sa.Column(name, sa.Float, nullable=True))
                else:
                    batch.add_column(sa.Column(name, sa.Float, nullable=False, server_default="0"))
        # A new cause had no seconds before: the running totals of rows already stored are 0.
        for name in (n for n in names if n.startswith("cum_")):
            op.execute(sa.text(f"UPDATE {table} SET {name} = 0 WHERE {name} IS NULL"))


def drop_cause_columns(cause: str, signal: str | None = None) -> None:
    """Drop every column of ``cause`` (inside a migration's ``downgrade``)."""
    for table, names in columns_of(cause, signal).items():
        with op.batch_alter_table(table) as batch:
            for name in names:
                batch.drop_column(name)

"""A new cause's columns are added by one call: the table in migrations/cause_columns.py names
exactly the per-cause columns the schema has, and the call adds them to a migrated database."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import inspect

from migrations.cause_columns import (
    CAUSE_TABLES,
    add_cause_columns,
    columns_of,
    drop_cause_columns,
)
from service.core.diagnosis import CAUSE_NAMES, CAUSES
from service.costs.integrals import CAUSE_SIGNALS
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import metadata


def _owned_by(cause: str) -> dict[str, set[str]]:
    """The schema's columns named after ``cause``, per table that has any."""
    out: dict[str, set[str]] = {}
    for table in metadata.sorted_tables:
        names = {
            c.name for c in table.columns if c.name.removeprefix("cum_").startswith(f"{cause}_")
        }
        if names:
            out[table.name] = names
    return out


SIGNAL_OF = {s.cause.label: s.field.removeprefix(f"{s.cause.label}_") for s in CAUSE_SIGNALS}


@pytest.mark.parametrize("cause", CAUSE_NAMES)
def test_the_table_names_every_column_a_cause_owns(cause: str) -> None:
    want = {t: set(cols) for t, cols in columns_of(cause, SIGNAL_OF.get(cause)).items()}
    assert _owned_by(cause) == want


def test_some_causes_keep_a_signal_and_others_none() -> None:
    assert 0 < len(SIGNAL_OF) < len(CAUSES)


def test_add_then_drop_a_cause_on_a_migrated_database(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'gw.db'}")
    upgrade(engine)
    with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        add_cause_columns("queue_bound", "wait_seconds")
    cols = {t: {c["name"] for c in inspect(engine).get_columns(t)} for t in CAUSE_TABLES}
    for table, names in columns_of("queue_bound", "wait_seconds").items():
        assert set(names) <= cols[table], table
    assert {"cum_queue_bound_seconds", "cum_queue_bound_wait_seconds"} <= cols["rollup_1m"]
    assert "queue_bound_usd" in cols["cost_job_1d"]
    with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        drop_cause_columns("queue_bound", "wait_seconds")
    left = {t: {c["name"] for c in inspect(engine).get_columns(t)} for t in CAUSE_TABLES}
    assert not any("queue_bound" in n for names in left.values() for n in names)
    engine.dispose()

"""The schema check without alembic names the same heads as alembic and tells an old database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine

from service.db.migrate import alembic_config, head_revisions, upgrade
from service.db.schema_version import check_at_head, code_heads, database_revisions
from service.errors import SchemaOutOfDate


def test_code_heads_are_alembics_heads() -> None:
    engine = create_engine("sqlite://")
    assert code_heads() == head_revisions(engine)
    assert alembic_config(engine).get_main_option("script_location")


def test_a_merge_migration_has_two_parents(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('revision = "a"\ndown_revision = None\n')
    (tmp_path / "b.py").write_text('revision: str = "b"\ndown_revision = "a"\n')
    (tmp_path / "c.py").write_text('revision = "c"\ndown_revision = "a"\n')
    (tmp_path / "m.py").write_text('revision = "m"\ndown_revision = ("b", "c")\n')
    assert code_heads(tmp_path) == {"m"}
    (tmp_path / "d.py").write_text('revision = "d"\ndown_revision = "c"\n')
    assert code_heads.__wrapped__(tmp_path) == {"m", "d"}


def test_an_unmigrated_then_old_then_current_database(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    assert database_revisions(engine) == frozenset()
    with pytest.raises(SchemaOutOfDate, match="nothing"):
        check_at_head(engine)
    upgrade(engine, "0001")
    with pytest.raises(SchemaOutOfDate, match=r"at \['0001'\].*gpuwarden migrate"):
        check_at_head(engine)
    upgrade(engine)
    check_at_head(engine)
    assert database_revisions(engine) == code_heads()

"""Alembic, driven from code: upgrade the schema and check that it is at head."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import migrations
from service.db.schema_version import check_at_head as check_at_head  # where callers find it

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(engine: Engine) -> Config:
    """An alembic Config that migrates through ``engine``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Upgrade the schema to ``revision`` (all heads by default)."""
    command.upgrade(alembic_config(engine), revision)


def head_revisions(engine: Engine) -> set[str]:
    """The revisions the code expects the database to be at."""
    return set(ScriptDirectory.from_config(alembic_config(engine)).get_heads())


def current_revisions(engine: Engine) -> set[str]:
    """The revisions the database is at (empty when it was never migrated)."""
    with engine.connect() as conn:
        return set(MigrationContext.configure(conn).get_current_heads())

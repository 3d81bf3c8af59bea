"""Alembic environment: runs migrations through the engine that service.db.migrate passes in."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from service.db.schema import metadata

engine = context.config.attributes.get("engine")
if not isinstance(engine, Engine):
    raise RuntimeError("run migrations with `gpuwarden migrate`, which passes the engine in")

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    context.run_migrations()

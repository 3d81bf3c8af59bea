"""Whether a database's schema is at the code's head, read without importing alembic.

The token commands and /readyz ask this; alembic's import costs a tenth of a second of CPU per
command, and the question needs only the migration files' revision lines and one SELECT.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, inspect, text

import migrations
from service.errors import SchemaOutOfDate

VERSIONS_DIR = Path(migrations.__file__).resolve().parent / "versions"
_ASSIGNMENT = re.compile(r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def _revision_lines(source: str) -> tuple[str | None, tuple[str, ...]]:
    """A migration file's ``revision`` and its ``down_revision`` (none, one or a merge's)."""
    found = {m.group(1): ast.literal_eval(m.group(2)) for m in _ASSIGNMENT.finditer(source)}
    down = found.get("down_revision")
    downs = () if down is None else (down,) if isinstance(down, str) else tuple(down)
    return found.get("revision"), downs


@cache
def code_heads(versions_dir: Path = VERSIONS_DIR) -> frozenset[str]:
    """The revisions no migration builds on: the heads the code expects the database at."""
    revisions: set[str] = set()
    built_on: set[str] = set()
    for path in versions_dir.glob("*.py"):
        revision, downs = _revision_lines(path.read_text())
        if revision is not None:
            revisions.add(revision)
            built_on.update(downs)
    return frozenset(revisions - built_on)


def database_revisions(engine: Engine) -> frozenset[str]:
    """The revisions the database is at (empty when it was never migrated)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return frozenset()
        return frozenset(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def check_at_head(engine: Engine) -> None:
    """Raise SchemaOutOfDate, naming the fix, unless the database is at head."""
    current, heads = database_revisions(engine), code_heads()
    if current != heads:
        raise SchemaOutOfDate(
            f"database schema is at {sorted(current) or 'nothing'}, the code needs "
            f"{sorted(heads)}; run `gpuwarden migrate` to upgrade it"
        )

"""A database that cannot be used stops a command with one line naming the fix, not a traceback:
a PostgreSQL database that does not exist, a port nothing listens on, a SQLite file in a missing
folder, and PostgreSQL's own ``postgres`` database (refused unless asked for)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import inspect

from service.db.engine import make_engine
from tests.conftest import PG_ADMIN_URL, _pg_url
from tests.support import free_port


def gw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    # The token commands first say which database they use; then the one line.
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("gpuwarden: database ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["migrate"], ["serve"], ["token", "list"]])
def test_a_postgresql_database_that_does_not_exist_names_createdb(command, tmp_path) -> None:
    name = f"gpuwarden_missing_{uuid.uuid4().hex[:8]}"
    line = one_line_error(gw(*command, "--database-url", _pg_url(name), cwd=tmp_path))
    assert f"'{name}' does not exist" in line and "createdb -h 127.0.0.1 -p 5432" in line
    assert line.rstrip("`").endswith(name)


def test_a_closed_port_is_named_with_the_fix(tmp_path) -> None:
    port = free_port()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/gpuwarden"
    line = one_line_error(gw("migrate", "--database-url", url, cwd=tmp_path))
    assert f"127.0.0.1:{port} (connection refused)" in line and "GPUWARDEN_DATABASE_URL" in line


def test_a_sqlite_file_in_a_missing_folder_names_mkdir(tmp_path) -> None:
    db = tmp_path / "no" / "such" / "gpuwarden.db"
    line = one_line_error(gw("migrate", "--database-url", f"sqlite:///{db}", cwd=tmp_path))
    assert f"mkdir -p {db.parent}" in line
    assert not db.parent.exists()


def test_the_maintenance_database_is_refused_unless_asked_for(tmp_path) -> None:
    # A throw-away database stands in for `postgres`: the refusal is by name, so the check is
    # made against the real one and nothing is written there.
    admin_url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    line = one_line_error(gw("migrate", "--database-url", admin_url, cwd=tmp_path))
    assert "'postgres'" in line and "maintenance database" in line
    assert "createdb -h 127.0.0.1 -p 5432 -U postgres gpuwarden" in line
    assert "GPUWARDEN_DATABASE_ALLOW_MAINTENANCE=true" in line
    engine = make_engine(admin_url)
    try:
        assert "alembic_version" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_the_database_the_fix_creates_then_works(tmp_path) -> None:
    name = f"gpuwarden_created_{uuid.uuid4().hex[:8]}"
    line = one_line_error(gw("migrate", "--database-url", _pg_url(name), cwd=tmp_path))
    fix = line.split("`")[1]
    assert fix.startswith("createdb ")
    subprocess.run(shlex.split(fix), check=True, timeout=60)  # the fix, as the line says it
    try:
        r = gw("migrate", "--database-url", _pg_url(name), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "database at head" in r.stdout
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

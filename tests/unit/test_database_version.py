"""A PostgreSQL server older than GPU Warden needs is named in one line with the fix; a new
enough one, or one whose version is unknown, passes."""

from __future__ import annotations

import pytest
from sqlalchemy import make_url

from service.db.engine import describe_old_server

URL = make_url("postgresql+psycopg://gpuwarden@db.example.com:5433/gpuwarden")


def test_a_server_older_than_needed_is_named_with_its_version_and_the_fix() -> None:
    line = describe_old_server(URL, (13, 16))
    assert line is not None
    assert "db.example.com:5433 is version 13.16" in line
    assert "needs 14 or newer" in line and "GPUWARDEN_DATABASE_URL" in line


@pytest.mark.parametrize("version", [(14, 0), (15, 19), (16,), (17, 2), None])
def test_a_new_enough_or_unknown_server_passes(version: tuple[int, ...] | None) -> None:
    assert describe_old_server(URL, version) is None
